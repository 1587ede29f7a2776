"""Profile.load checks what it reads: each damaged array, header field or value is one
``EntmtpError`` line naming the file, the field and the fix; through the command line, exit 2
and nothing changed."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch import Profile, synthetic_profile
from entmtp.treesearch._profile import values_problem

Arrays = dict[str, np.ndarray]


def _good(tmp_path: Path) -> Arrays:
    profile = synthetic_profile(num_traces=3, positions=20, num_heads=3, seed=1)
    path = profile.save(tmp_path / "good.npz")
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    arrays.setdefault("draft_entropy", arrays["entropy"] * 0.5)  # [positions] float32
    return arrays


def _header(arrays: Arrays) -> dict:
    return json.loads(arrays["header"].tobytes())


def _with_header(arrays: Arrays, edit: Callable[[dict], None]) -> Arrays:
    header = _header(arrays)
    edit(header)
    return {**arrays, "header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}


def _set(arrays: Arrays, name: str, value) -> Arrays:
    return {**arrays, name: value}


def _poke(arrays: Arrays, name: str, index, value) -> Arrays:
    array = arrays[name].copy()
    array[index] = value
    return {**arrays, name: array}


def _drop(arrays: Arrays, name: str) -> Arrays:
    return {k: v for k, v in arrays.items() if k != name}


# case -> (edit of the good arrays, words the message must hold)
BAD_PROFILES: dict[str, tuple[Callable[[Arrays], Arrays], tuple[str, ...]]] = {
    "entropy-nan": (lambda a: _poke(a, "entropy", 5, np.nan), ("entropy[5]", "finite")),
    "entropy-inf": (lambda a: _poke(a, "entropy", 0, np.inf), ("entropy[0]", "finite")),
    "entropy-negative": (lambda a: _poke(a, "entropy", 7, -0.5), ("entropy[7]", "negative")),
    "draft-entropy-nan": (lambda a: _poke(a, "draft_entropy", 3, np.nan),
                          ("draft_entropy[3]", "finite")),
    "draft-entropy-negative": (lambda a: _poke(a, "draft_entropy", 2, -3.0),
                               ("draft_entropy[2]", "negative")),
    "rank-below-miss": (lambda a: _poke(a, "ranks", (4, 1), -2), ("ranks[4, 1]", "[-1, 10)")),
    "rank-at-topk": (lambda a: _poke(a, "ranks", (9, 0), 10), ("ranks[9, 0]", "topk")),
    "rank-huge": (lambda a: _poke(a, "ranks", (0, 2), 30000), ("ranks[0, 2]",)),
    "topk-smaller-than-ranks": (lambda a: _with_header(a, lambda h: h["meta"].update(topk=1)),
                                ("ranks[", "topk is 1")),
    "ranks-1d": (lambda a: _set(a, "ranks", a["ranks"][:, 0]), ("ranks", "shape")),
    "ranks-rows-short": (lambda a: _set(a, "ranks", a["ranks"][:-1]), ("rank rows", "shape")),
    "ranks-floats": (lambda a: _set(a, "ranks", a["ranks"].astype(np.float32)),
                     ("ranks", "float32")),
    "entropy-ints": (lambda a: _set(a, "entropy", a["entropy"].astype(np.int64)),
                     ("entropy", "int64")),
    "entropy-2d": (lambda a: _set(a, "entropy", a["entropy"][:, None]), ("entropy", "shape")),
    "draft-entropy-short": (lambda a: _set(a, "draft_entropy", a["draft_entropy"][:-3]),
                            ("draft entropies", "shape")),
    "heads-vs-meta": (lambda a: _with_header(a, lambda h: h["meta"].update(num_heads=5)),
                      ("num_heads", "shape")),
    "offsets-past-the-end": (lambda a: _poke(a, "offsets", -1, 10_000), ("offsets",)),
    "offsets-falling": (lambda a: _poke(a, "offsets", 1, 50), ("offsets",)),
    "offsets-not-from-zero": (lambda a: _poke(a, "offsets", 0, 1), ("offsets",)),
    "offsets-missing": (lambda a: _drop(a, "offsets"), ("offsets", "missing")),
    "entropy-missing": (lambda a: _drop(a, "entropy"), ("entropy", "missing")),
    "prompt-ids-short": (lambda a: _with_header(a, lambda h: h["prompt_ids"].pop()),
                         ("prompt_ids", "inconsistent")),
    "prompt-id-a-number": (lambda a: _with_header(a, lambda h: h["prompt_ids"].__setitem__(0, 7)),
                           ("prompt_ids[0]",)),
    "prompt-index-repeated": (lambda a: _poke(a, "prompt_index", 1, a["prompt_index"][0]),
                              ("prompt_index", "repeats")),
    "prompt-length-negative": (lambda a: _poke(a, "prompt_length", 0, -4), ("prompt_length",)),
    "meta-topk-a-string": (lambda a: _with_header(a, lambda h: h["meta"].update(topk="ten")),
                           ("meta.topk",)),
    "meta-topk-zero": (lambda a: _with_header(a, lambda h: h["meta"].update(topk=0)),
                       ("meta.topk", "below 1")),
    "meta-unknown-field": (lambda a: _with_header(a, lambda h: h["meta"].update(colour="red")),
                           ("meta.colour",)),
    "meta-missing": (lambda a: _with_header(a, lambda h: h.pop("meta")), ("meta", "missing")),
    "meta-a-list": (lambda a: _with_header(a, lambda h: h.update(meta=[1])), ("meta",)),
    "meta-huge-int": (lambda a: _with_header(a, lambda h: h["meta"].update(seed=10**30)),
                      ("meta.seed", "too large")),
    "header-floats": (lambda a: _set(a, "header", a["header"].astype(np.float32)), ("header",)),
    "header-binary": (lambda a: _set(a, "header", np.frombuffer(b"\xff\xfe\x00x",
                                                                dtype=np.uint8)), ("header",)),
    "header-deep": (lambda a: _set(a, "header", np.frombuffer(b"[" * 100_000, dtype=np.uint8)),
                    ("nested",)),
}


def _write(path: Path, arrays: Arrays) -> Path:
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    return path


@pytest.mark.parametrize("case", list(BAD_PROFILES))
def test_bad_profile_is_one_line_naming_the_field(tmp_path, case):
    edit, words = BAD_PROFILES[case]
    path = _write(tmp_path / "profile.npz", edit(_good(tmp_path)))
    with pytest.raises(EntmtpError) as info:
        Profile.load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message, message
    if case not in ("header-floats", "meta-unknown-field"):
        assert "profile again" in message or "re-run" in message, message


def test_good_profile_still_loads_and_round_trips(tmp_path):
    arrays = _good(tmp_path)
    profile = Profile.load(_write(tmp_path / "p.npz", arrays))
    assert profile.num_positions == len(arrays["entropy"])
    np.testing.assert_array_equal(profile.ranks(), arrays["ranks"])


def test_rounding_below_zero_is_not_a_negative_entropy(tmp_path):
    path = _write(tmp_path / "p.npz", _poke(_good(tmp_path), "entropy", 0, -1e-7))
    assert Profile.load(path).entropy()[0] == np.float32(-1e-7)


@pytest.mark.parametrize("kind", ["a-folder", "a-pipe", "missing"])
def test_profile_path_that_is_not_a_file(tmp_path, kind):
    path = tmp_path / "profile.npz"
    if kind == "a-folder":
        path.mkdir()
    elif kind == "a-pipe":
        os.mkfifo(path)  # np.load on it would wait for a writer forever
    with pytest.raises(EntmtpError) as info:
        Profile.load(path)
    assert {"a-folder": "folder", "a-pipe": "not a regular file",
            "missing": "does not exist"}[kind] in str(info.value)


def test_values_problem_agrees_with_a_plain_scan():
    rng = np.random.default_rng(0)
    for _ in range(200):
        entropy = rng.choice([0.5, 1.0, -1.0, np.nan, np.inf], size=6,
                             p=[0.6, 0.3, 0.04, 0.03, 0.03]).astype(np.float32)
        ranks = rng.integers(-2, 6, size=(6, 2)).astype(np.int16)
        topk = 5
        plain_ok = (all(np.isfinite(e) and e >= -1e-4 for e in entropy)
                    and all(-1 <= r < topk for r in ranks.ravel()))
        assert (values_problem(entropy, ranks, None, topk=topk) is None) == plain_ok


def test_cli_reading_a_bad_run_profile_is_one_line(tmp_path):
    from one_line_errors import assert_user_error
    from typer.testing import CliRunner

    from entmtp.cli.app import app

    root = tmp_path / "demo"
    assert CliRunner().invoke(app, ["demo", "--out", str(root),
                                    "--schedule-trials", "4"]).exit_code == 0
    run = Path(shutil.copytree(root, tmp_path / "run"))
    arrays = _poke(dict(np.load(run / "profile.npz")), "entropy", 3, np.nan)
    _write(run / "profile.npz", arrays)
    (run / "front.json").unlink()  # pareto searches again: reads the profile
    assert_user_error(["pareto", str(run), "--schedule-trials", "2"], tmp_path,
                      mentions=("profile", "entropy[3]"))
    assert_user_error(["export", str(run), "--format", "vllm-chain", "--out",
                       str(tmp_path / "chain.yaml")], tmp_path, mentions=("entropy[3]",))
