"""The dequantized-model cache's own files (the sha256 index, the completion marker) read through
the one reader: whatever damage they carry costs a re-hash or a rebuild, never a traceback or a
hang (a pipe at the index's path would block a plain read forever)."""

from __future__ import annotations

import errno
import hashlib
import os
import warnings
from pathlib import Path

import pytest

from entmtp.model import _base_model as _model
from support import make_char_tokenizer, make_tiny_llama

DAMAGE: dict[str, bytes | None] = {
    "binary": b"\x00\x01\x02\x03",
    "utf16": '{"a": "b"}'.encode("utf-16"),
    "deep": b"[" * 100_000,
    "int-5000-digits": b'{"k": ' + b"9" * 5000 + b"}",
    "a-list": b"[]",
    "truncated": b'{"k": "abc',
    "a-folder": None,
    "a-pipe": None,
}


def _damage(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "a-folder":
        path.mkdir()
    elif kind == "a-pipe":
        os.mkfifo(path)
    else:
        path.write_bytes(DAMAGE[kind])


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_sha256_index_only_costs_a_rehash(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("ENTMTP_CACHE", str(tmp_path / "cache"))
    _damage(tmp_path / "cache" / "models" / "sha256-index.json", kind)
    data = tmp_path / "model.gguf"
    data.write_bytes(b"weights" * 100)
    assert _model.file_sha256(data) == hashlib.sha256(data.read_bytes()).hexdigest()


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A .gguf path whose dequantization is the tiny model (counted), cache under tmp_path."""
    monkeypatch.setenv("ENTMTP_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF but not really a model")  # the magic bytes, then nothing usable
    calls = []

    def dequantize(_path):
        calls.append(_path)
        model = make_tiny_llama(0)
        return model, make_char_tokenizer(model.config.vocab_size)

    monkeypatch.setattr(_model, "_dequantize_gguf", dequantize)
    return path, calls


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_cache_marker_rebuilds_the_cache(fake_gguf, kind):
    path, calls = fake_gguf
    _model._load_gguf(path)
    cache = next((path.parent / "cache" / "models").glob("tiny-*"))
    marker = cache / _model.CACHE_MARKER
    marker.unlink()
    _damage(marker, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = _model._load_gguf(path)
    assert len(calls) == 2 and base.vocab_size == 128
    assert _model.read_json(marker, source="marker")["gguf_sha256"]  # rebuilt, readable
    _model._load_gguf(path)
    assert len(calls) == 2  # and used


def test_full_disk_while_caching_still_returns_the_model(fake_gguf, monkeypatch):
    path, calls = fake_gguf

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.warns(UserWarning, match="could not cache"):
        base = _model._load_gguf(path)
    assert base.vocab_size == 128
    models = path.parent / "cache" / "models"
    assert [p.name for p in models.iterdir() if not p.name.startswith("sha256")] == []

