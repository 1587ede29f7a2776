"""Every file entmtp reads, given bad bytes, bad JSON or values that cannot be right: exit 2,
one ``entmtp: error:`` line naming the kind of file, no traceback, and nothing under the test's
folder added, removed or changed.

The table is (reader role) x (bad content): each role is a command that reads one file, and each
content is a way a file goes wrong (see ``BAD_CONTENTS``, ``BAD_LATENCY``, ``BAD_FRONTS``...).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from one_line_errors import assert_user_error, char_device
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.treesearch import load_bundle
from entmtp.treesearch._latency import LatencyModel

runner = CliRunner()

GOOD_LATENCY = LatencyModel.cpu_like().to_json()


def _latency(**changes) -> bytes:
    return json.dumps({**GOOD_LATENCY, **changes}).encode()


# Ways any JSON file can be wrong before its schema is even looked at.
BAD_CONTENTS: dict[str, bytes] = {
    "empty": b"",
    "blank": b" \n\t\n",
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00",
    "utf16": '{"format": "entmtp-latency"}'.encode("utf-16"),
    "utf32": '{"format": "entmtp-latency"}'.encode("utf-32"),
    "latin1": b'{"format": "caf\xe9"}',
    "malformed": b"{not json",
    "truncated": json.dumps(GOOD_LATENCY, indent=2).encode()[:150],
    "deep-100k": b"[" * 100_000,
    "deep-closed": b"[" * 500 + b"]" * 500,
    "deep-object": b'{"a": ' * 300 + b"1" + b"}" * 300,
    "int-5000-digits": b'{"format": ' + b"9" * 5000 + b"}",
    "int-100-digits": b'{"nodes": [0, ' + b"9" * 100 + b"]}",
    "nan-literal": b'{"autoregressive_ms": NaN}',
    "infinity-literal": b'{"autoregressive_ms": -Infinity}',
    "float-overflow": b'{"autoregressive_ms": 1e999}',
    "top-level-string": b'"entmtp"',
    "top-level-null": b"null",
    "top-level-number": b"3",
}

BAD_LATENCY: dict[str, bytes] = {
    "all-zero": _latency(verify_ms=[0.0] * 7, autoregressive_ms=0.0, depth_ms=0.0),
    "zero-steps": _latency(verify_ms=[0.0] * 7),
    "autoregressive-zero": _latency(autoregressive_ms=0),
    "absurd-1e308": _latency(verify_ms=[1e308] * 7),
    "absurd-autoregressive": _latency(autoregressive_ms=1e12),
    "absurd-depth": _latency(depth_ms=1e300),
    "negative": _latency(verify_ms=[1.0, -2.0, 3.0, 4.0, 5.0, 6.0, 7.0]),
    "string-time": _latency(autoregressive_ms="fast"),
    "bool-time": _latency(autoregressive_ms=True),
    "missing-verify": json.dumps({"format": "entmtp-latency", "nodes": [0, 3],
                                  "autoregressive_ms": 1.0}).encode(),
    "length-mismatch": _latency(verify_ms=[1.0, 2.0]),
    "nodes-descending": _latency(nodes=[0, 7, 3, 15, 31, 63, 127]),
    "nodes-floats": _latency(nodes=[0, 3.5, 7, 15, 31, 63, 127]),
    "hardware-list": _latency(hardware=[1, 2]),
    "noise-points-bad": _latency(noise={"points": [{"step": "warp"}]}),
    "wrong-format": _latency(format="entmtp-bundle"),
    "top-level-list": json.dumps([GOOD_LATENCY]).encode(),
    # 1/ms of a subnormal step overflowed to inf in the bundle (a traceback after files were made)
    "autoregressive-subnormal": _latency(autoregressive_ms=1e-320),
    "steps-under-a-microsecond": _latency(verify_ms=[1e-12] * 7),
    "tree-of-2^62-nodes": _latency(nodes=[0, 2**62], verify_ms=[1.0, 2.0]),
    "measurements-strings": _latency(measurements=[["a", "b", "c"]]),
    "measurements-short": _latency(measurements=[[1]]),
    "measurements-bool-time": _latency(measurements=[[1, 1, True]]),
}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    """A finished run folder (profile, latency, front, acceptance, bundle, report)."""
    root = tmp_path_factory.mktemp("bad-files") / "demo"
    result = runner.invoke(app, ["demo", "--out", str(root), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    return root


def _copy_run(demo_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo_run, tmp_path / "run"))


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


# role -> (word the message must hold, argv builder(bad file, run copy, tmp))
LATENCY_READERS: dict[str, tuple[str, Callable[[Path, Path, Path], list[str]]]] = {
    "calibrate --latency": ("latency", lambda f, r, t: [
        "calibrate", "--out", str(t / "new-run"), "--latency", str(f), "--schedule-trials", "2"]),
    "retarget --latency": ("latency", lambda f, r, t: [
        "retarget", str(r), "--latency", str(f), "--out", str(t / "retargeted")]),
    "plot-latency": ("latency", lambda f, r, t: ["plot-latency", str(f), "--out",
                                                 str(t / "p.png")]),
    "run latency.json": ("latency file", lambda f, r, t: [
        "pareto", str(r), "--schedule-trials", "2"]),
}


@pytest.mark.parametrize("content", list(BAD_CONTENTS) + list(BAD_LATENCY))
@pytest.mark.parametrize("role", list(LATENCY_READERS))
def test_bad_latency_file_is_one_line_error(demo_run, tmp_path, role, content):
    run = _copy_run(demo_run, tmp_path)
    data = BAD_CONTENTS.get(content, BAD_LATENCY.get(content))
    if role == "run latency.json":  # the run's own latency.json, damaged; pareto searches
        bad = _write(run / "latency.json", data)
        (run / "front.json").unlink()
    else:
        bad = _write(tmp_path / "latency.json", data)
    word, argv = LATENCY_READERS[role]
    assert_user_error(argv(bad, run, tmp_path), tmp_path, mentions=(word,))


BAD_PATHS: dict[str, Callable[[Path], Path]] = {
    "missing": lambda t: t / "nope.json",
    "a-folder": lambda t: t,
    "parent-is-a-file": lambda t: _write(t / "f", b"x") / "latency.json",
    "device-node": lambda t: char_device(t / "device"),
}


@pytest.mark.parametrize("kind", list(BAD_PATHS))
@pytest.mark.parametrize("role", ["calibrate --latency", "retarget --latency", "plot-latency"])
def test_latency_path_that_is_not_a_file_is_one_line_error(demo_run, tmp_path, role, kind):
    run = _copy_run(demo_run, tmp_path)
    word, argv = LATENCY_READERS[role]
    assert_user_error(argv(BAD_PATHS[kind](tmp_path), run, tmp_path), tmp_path, mentions=(word,))


@pytest.mark.parametrize("content", list(BAD_CONTENTS))
@pytest.mark.parametrize("role", ["show-tree", "export"])
def test_bad_tree_or_bundle_file_is_one_line_error(tmp_path, role, content):
    bad = _write(tmp_path / "tree.json", BAD_CONTENTS[content])
    argv = (["show-tree", str(bad), "--out", str(tmp_path / "t.png")] if role == "show-tree"
            else ["export", str(bad), "--format", "entmtp", "--out", str(tmp_path / "o.json")])
    assert_user_error(argv, tmp_path)


BAD_FRONTS: dict[str, object] = {
    "empty-object": {},
    "a-list": [],
    "front-not-a-list": {"front": {}},
    "candidate-not-an-object": {"front": [1]},
    "candidate-missing-latency": "drop:front[0].latency_ms",
    "latency-a-string": "set:front[0].latency_ms=fast",
    "no-schedule": "drop:schedule",
    "no-oracle": "drop:oracle",
    "replayed-missing": "drop:best_static.replayed",
    "bucket-fronts-not-lists": "set:bucket_fronts=[1]",
    "references-unnamed": "drop:references[0].name",
    "wrong-format": "set:format=entmtp-bundle",
}


def _edited(obj: dict, edit: str) -> dict:
    """``drop:a.b[0].c`` or ``set:a.b=JSON-or-text`` applied to a copy of ``obj``."""
    obj = json.loads(json.dumps(obj))
    action, _, rest = edit.partition(":")
    where, _, value = rest.partition("=")
    keys: list[str | int] = []
    for part in where.split("."):
        name, _, index = part.partition("[")
        keys.append(name)
        if index:
            keys.append(int(index.rstrip("]")))
    parent = obj
    for key in keys[:-1]:
        parent = parent[key]
    if action == "drop":
        del parent[keys[-1]]
    else:
        try:
            parent[keys[-1]] = json.loads(value)
        except json.JSONDecodeError:
            parent[keys[-1]] = value
    return obj


@pytest.mark.parametrize("content", list(BAD_CONTENTS) + list(BAD_FRONTS))
def test_bad_front_is_one_line_error(demo_run, tmp_path, content):
    run = _copy_run(demo_run, tmp_path)
    if content in BAD_CONTENTS:
        data = BAD_CONTENTS[content]
    else:
        front = json.loads((run / "front.json").read_text())
        bad = BAD_FRONTS[content]
        data = json.dumps(_edited(front, bad) if isinstance(bad, str) else bad).encode()
    _write(run / "front.json", data)
    assert_user_error(["pareto", str(run), "--no-buckets"], tmp_path, mentions=("front",))
    assert_user_error(["retarget", str(run), "--latency", str(run / "latency.json"),
                       "--out", str(tmp_path / "new")], tmp_path, mentions=("front",))


BAD_ACCEPTANCE: dict[str, object] = {
    "empty-object": {},
    "wrong-format": "set:format=entmtp-front",
    "ragged-probs": "set:rank_probs=[[[0.5]], [[0.5, 0.1]]]",
    "no-counts": "drop:counts",
    "edges-strings": "set:edges=[\"a\"]",
}


@pytest.mark.parametrize("content", list(BAD_CONTENTS) + list(BAD_ACCEPTANCE))
def test_bad_acceptance_is_one_line_error(demo_run, tmp_path, content):
    run = _copy_run(demo_run, tmp_path)
    if content in BAD_CONTENTS:
        data = BAD_CONTENTS[content]
    else:
        table = json.loads((run / "acceptance.json").read_text())
        bad = BAD_ACCEPTANCE[content]
        data = json.dumps(_edited(table, bad) if isinstance(bad, str) else bad).encode()
    _write(run / "acceptance.json", data)
    assert_user_error(["pareto", str(run), "--no-buckets", "--acceptance-plot",
                       str(tmp_path / "a.png")], tmp_path, mentions=("acceptance",))


@pytest.mark.parametrize("damaged", ["bundle.json", "acceptance.json", "front.json"])
def test_a_damaged_finished_search_stage_is_redone(demo_run, tmp_path, damaged):
    """A truncated file of the last stage makes the next run search again, not fail (demo and
    calibrate share the search stage)."""
    run = _copy_run(demo_run, tmp_path)
    good = (run / damaged).read_bytes()
    _write(run / damaged, good[: len(good) // 2])
    if damaged == "front.json":  # pareto only reads: it names the file and the fix
        result = runner.invoke(app, ["pareto", str(run), "--no-buckets"])
        assert result.exit_code == 2 and "delete it" in result.stderr
        (run / damaged).unlink()
        result = runner.invoke(app, ["pareto", str(run), "--no-buckets",
                                     "--schedule-trials", "4"])
    else:
        result = runner.invoke(app, ["demo", "--out", str(run), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    load_bundle(run / "bundle.json")
    assert (run / damaged).read_bytes() == good  # the same search again: the same bytes


BAD_DATA_LINES: dict[str, bytes] = {
    "id-5000-digits": b'{"id": ' + b"1" * 5000 + b', "prompt": "hi"}\n',
    "id-100-digits": b'{"id": ' + b"1" * 100 + b', "prompt": "hi"}\n',
    "deep-line": b'{"prompt": "hi"}\n' + b"[" * 100_000 + b"\n",
    "nan-line": b'{"prompt": "hi", "x": NaN}\n',
    "prompt-a-number": b'{"prompt": 3}\n',
    "line-a-list": b'{"prompt": "hi"}\n["hi"]\n',
}


@pytest.mark.parametrize("content", list(BAD_CONTENTS) + list(BAD_DATA_LINES) + list(BAD_PATHS))
def test_bad_data_file_is_one_line_error_before_anything_is_made(tiny_model_dir, tiny_medusa_dir,
                                                                 tmp_path, content):
    if content in BAD_PATHS:
        data = BAD_PATHS[content](tmp_path)
    else:
        data = _write(tmp_path / "d.jsonl",
                      BAD_CONTENTS.get(content, BAD_DATA_LINES.get(content)))
    assert_user_error(["calibrate", "--model", str(tiny_model_dir), "--heads",
                       str(tiny_medusa_dir), "--data", str(data), "--split", "all",
                       "--prompts", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "run")],
                      tmp_path, mentions=("--data",))


@pytest.mark.parametrize("damage", [b"", b"\x00\x01binary", "\ufeff".encode("utf-16")],
                         ids=["empty", "binary", "utf16"])
def test_a_damaged_report_makes_the_search_stage_run_again(demo_run, tmp_path, damage):
    run = _copy_run(demo_run, tmp_path)
    good = (run / "report.md").read_bytes()
    _write(run / "report.md", damage)
    result = runner.invoke(app, ["demo", "--out", str(run), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    assert (run / "report.md").read_bytes() == good


@pytest.mark.parametrize("record, word", [
    ({"format": "something-else", "arguments": {}}, "format"),
    ({"format": "entmtp-run", "arguments": []}, "arguments"),
], ids=["other-format", "arguments-a-list"])
def test_a_foreign_run_record_is_one_line(demo_run, tmp_path, record, word):
    run = _copy_run(demo_run, tmp_path)
    _write(run / "run.json", json.dumps(record).encode())
    assert_user_error(["calibrate", "--out", str(run), "--task", "synthetic",
                       "--schedule-trials", "2"], tmp_path, mentions=("run record", word))


def test_a_run_whose_shards_folder_is_a_file_is_refused_first(demo_run, tmp_path):
    run = _copy_run(demo_run, tmp_path)
    (run / "profile.npz").unlink()
    _write(run / "shards", b"not a folder")
    assert_user_error(["calibrate", "--out", str(run), "--model", str(tmp_path / "no-model"),
                       "--heads", str(tmp_path), "--task", "code", "--schedule-trials", "2"],
                      tmp_path, mentions=("finished prompts",))


def test_show_tree_of_a_latency_file_names_what_it_was_given(tmp_path):
    from entmtp.treesearch import LatencyModel

    latency = tmp_path / "latency.json"
    LatencyModel.cpu_like().save(latency)
    assert_user_error(["show-tree", str(latency), "--out", str(tmp_path / "t.png")], tmp_path,
                      mentions=("entmtp-latency file", "not a bundle"))


def test_pareto_of_a_file_says_it_is_not_a_run_folder(demo_run, tmp_path):
    """(A run's bundle.json stands for its run: tests/cli/test_hints.py.)"""
    run = _copy_run(demo_run, tmp_path)
    assert_user_error(["pareto", str(run / "report.md")], tmp_path,
                      mentions=("is a file, not a run folder or a bundle",))
