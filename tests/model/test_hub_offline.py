"""A hub id that cannot load here fails before any download, in one line (the hub's client
would retry for most of a minute first); a cached one loads offline (model._loading)."""

from __future__ import annotations

import socket

import pytest
from huggingface_hub import constants
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.core import EntmtpError
from entmtp.model import _base_model, _loading, load_base

MODEL = "some-org/some-model"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache, online mode, no proxy, and a loader that must not run: the
    check comes first. ``hub.loads`` records each load that got through (with the offline
    flag then)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored (to unset) after the test
    for name in _loading.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    class Hub:
        loads: list[bool] = []
        cache = tmp_path / "hub-cache"

    def fake_load(spec, **_):
        Hub.loads.append(constants.is_offline_mode())
        raise EntmtpError("loaded")

    monkeypatch.setattr(_base_model, "load_base_model", fake_load)
    return Hub


def unreachable(monkeypatch, calls: list | None = None):
    """No network: the name does not resolve (as in a sandbox without DNS)."""
    def refuse(address, timeout=None, *_args, **_kwargs):
        if calls is not None:
            calls.append((address, timeout))
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(_loading.socket, "create_connection", refuse)


def cache_model(cache, model: str) -> None:
    """What huggingface_hub leaves after a download: a snapshot with config.json, ref main."""
    folder = cache / f"models--{model.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    (folder / "snapshots" / "abc123").mkdir(parents=True)
    (folder / "snapshots" / "abc123" / "config.json").write_text("{}")


def test_an_unreachable_hub_fails_in_one_line_before_the_download(hub, monkeypatch):
    calls = []
    unreachable(monkeypatch, calls)
    with pytest.raises(EntmtpError) as info:
        load_base(MODEL)
    message = str(info.value)
    assert "\n" not in message
    assert "cannot reach the Hugging Face hub (huggingface.co: Name or service not known)" \
        in message
    assert repr(MODEL) in message and "--model" in message
    assert hub.loads == []  # nothing asked the hub's client
    assert calls == [(("huggingface.co", 443), _loading.HUB_TIMEOUT_S)]  # one short attempt


def test_hf_hub_offline_without_the_model_cached_is_one_line(hub, monkeypatch):
    calls = []
    unreachable(monkeypatch, calls)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(EntmtpError, match="not in the Hugging Face cache .* HF_HUB_OFFLINE is set"):
        load_base(MODEL)
    assert hub.loads == [] and calls == []  # offline: no connection tried at all


def test_a_cached_model_loads_offline_when_the_hub_is_out_of_reach(hub, monkeypatch):
    unreachable(monkeypatch)
    cache_model(hub.cache, MODEL)
    with pytest.raises(EntmtpError, match="loaded"):
        load_base(MODEL)
    assert hub.loads == [True]  # the loader ran, with the libraries in offline mode


def test_a_reachable_hub_is_left_to_the_loader(hub, monkeypatch):
    class Connection:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(_loading.socket, "create_connection", lambda *a, **k: Connection())
    with pytest.raises(EntmtpError, match="loaded"):
        load_base(MODEL)
    assert hub.loads == [False]


def test_paths_and_invalid_ids_are_not_hub_ids(tmp_path):
    (tmp_path / "folder").mkdir()
    assert _loading.is_hub_id(MODEL) and _loading.is_hub_id("gpt2")
    for model in (str(tmp_path / "folder"), "./model", "m.gguf", "a/b/c", "bad id!"):
        assert not _loading.is_hub_id(model), model


def test_a_proxy_is_not_second_guessed(hub, monkeypatch):
    calls = []
    unreachable(monkeypatch, calls)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert _loading.hub_unreachable() is None and calls == []


def test_a_command_fails_fast_on_this_machine_without_network(hub, tmp_path):
    """No fake: where the sandbox has no network, the real check says so in one line."""
    if _loading.hub_unreachable() is None:
        pytest.skip("this machine reaches the Hugging Face hub")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    result = CliRunner().invoke(app, ["heads", "data", "--model", MODEL, "--data", str(prompts),
                                      "--out", str(tmp_path / "data")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("entmtp: error:")]
    assert len(lines) == 1 and "cannot reach the Hugging Face hub" in lines[0]
    assert hub.loads == [] and not (tmp_path / "data").exists()
