"""Which heads folder a command loads: --heads, else the shipped heads of a type, and for a
bundle the shipped folder whose sha256 is the bundle's (model._loading)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entmtp.core import EntmtpError
from entmtp.model import _loading
from entmtp.model._loading import resolve_heads, shipped_heads_path

SHA = {"default-medusa": "a" * 64, "default-hydra": "b" * 64, "code-hydra": "c" * 64}


@pytest.fixture
def shipped_root(tmp_path, monkeypatch):
    """A package tree with default heads of both types, a task's own Hydra heads and a folder
    whose config is not JSON."""
    root = tmp_path / "trees"
    folders = {"default-medusa": ("smollm2-135m-medusa", "medusa"),
               "default-hydra": ("smollm2-135m-hydra", "hydra"),
               "code-hydra": ("smollm2-135m-hydra-code", "hydra")}
    for key, (name, head_type) in folders.items():
        folder = root / "heads" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(
            {"head_type": head_type, "sha256": SHA[key]}))
    (root / "heads" / "broken").mkdir()
    (root / "heads" / "broken" / "config.json").write_text("{not json")
    monkeypatch.setattr(_loading.resources, "files", lambda package: root)
    return root / "heads"


def test_a_bundles_sha256_picks_the_shipped_folder_with_those_weights(shipped_root):
    code = shipped_root / "smollm2-135m-hydra-code"
    assert shipped_heads_path("hydra", SHA["code-hydra"]) == code
    assert shipped_heads_path("hydra", SHA["code-hydra"].upper()).name == "smollm2-135m-hydra-code"
    assert shipped_heads_path("hydra", SHA["default-hydra"]).name == "smollm2-135m-hydra"
    assert shipped_heads_path("hydra").name == "smollm2-135m-hydra"
    # another type's weights, or weights nobody ships: the default folder of the type asked,
    # whose load then fails the bundle's sha256 check in one line
    assert shipped_heads_path("medusa", SHA["code-hydra"]).name == "smollm2-135m-medusa"
    assert shipped_heads_path("hydra", "d" * 64).name == "smollm2-135m-hydra"


def test_heads_given_or_a_model_given_override_the_lookup(shipped_root, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    assert resolve_heads(str(mine), "hydra", None, SHA["code-hydra"]) == mine
    assert resolve_heads(None, "hydra", None, SHA["code-hydra"]).name == "smollm2-135m-hydra-code"
    with pytest.raises(EntmtpError, match="--heads is required with --model"):
        resolve_heads(None, "hydra", "some/model", SHA["code-hydra"])


def test_a_missing_default_folder_is_a_one_line_error(shipped_root):
    import shutil

    shutil.rmtree(shipped_root / "smollm2-135m-medusa")
    with pytest.raises(EntmtpError, match="no shipped medusa heads"):
        shipped_heads_path("medusa", "e" * 64)
    assert isinstance(shipped_heads_path("hydra", SHA["code-hydra"]), Path)
