"""A --model that is a damaged GGUF file or a model folder with a damaged config: one
``EntmtpError`` line naming the file and the fix (was: ValueError / TypeError tracebacks)."""

from __future__ import annotations

import json

import pytest

from entmtp.core import EntmtpError
from entmtp.model._base_model import load_base_model

GGUFS = {
    "random-bytes": bytes(range(256)) * 4,
    "empty": b"",
    "magic-then-nothing": b"GGUF\x03\x00\x00\x00garbage",
}


@pytest.mark.parametrize("case", list(GGUFS))
def test_damaged_gguf_is_one_line(tmp_path, monkeypatch, case):
    monkeypatch.setenv("ENTMTP_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(GGUFS[case])
    with pytest.raises(EntmtpError) as info:
        load_base_model(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "gguf" in message.lower()


@pytest.mark.parametrize("config", [
    {"model_type": "llama", "vocab_size": "many"},
    {"model_type": "no-such-architecture"},
], ids=["field-of-wrong-type", "unknown-architecture"])
def test_model_folder_with_a_damaged_config_is_one_line(tmp_path, config):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EntmtpError) as info:
        load_base_model(folder)
    assert "\n" not in str(info.value) and "model folder" in str(info.value)
