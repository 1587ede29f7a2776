"""Every output path entmtp writes, when it must not or cannot: a folder, a symbolic link, a
device node or pipe, a read-only file, a path under a file, a full disk. Each is one
``entmtp: error:`` line, exit 2, and nothing added, removed or changed (no temp file, no empty
folder); the link's target and the device node stay as they were. Also ``demo``'s own checks and
a run folder reused with other arguments."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from one_line_errors import assert_user_error, char_device, snapshot
from typer.testing import CliRunner

from entmtp.calibrate import RunDir
from entmtp.calibrate._rundir import record_run_arguments
from entmtp.cli.app import app
from entmtp.treesearch import LatencyModel, load_bundle, synthetic_profile

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-outputs") / "demo"
    result = runner.invoke(app, ["demo", "--out", str(root), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    return root


def _read_only(path: Path) -> Path:
    path.write_bytes(b"keep me")
    path.chmod(0o444)
    return path


def _link(path: Path) -> Path:
    target = path.parent / "link-target.txt"
    target.write_bytes(b"the link's target")
    path.symlink_to(target)
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


# kind -> make(the output path) -> the path to pass as the output
BAD_TARGETS: dict[str, Callable[[Path], Path]] = {
    "a-folder": lambda p: (p.mkdir(), p)[1],
    "a-symlink": _link,
    "a-dangling-symlink": lambda p: (p.symlink_to(p.parent / "nowhere"), p)[1],
    "a-pipe": _fifo,
    "a-device-node": char_device,
    "read-only": _read_only,
    "under-a-file": lambda p: (p.parent.joinpath("afile").write_bytes(b"x"),
                               p.parent / "afile" / "out")[1],
}

# writer -> argv builder(output path, demo run copy)
WRITERS: dict[str, Callable[[Path, Path], list[str]]] = {
    "show-tree --out": lambda o, r: ["show-tree", str(r / "bundle.json"), "--out", str(o)],
    "plot-latency --out": lambda o, r: ["plot-latency", str(r / "latency.json"), "--out", str(o)],
    "pareto --plot": lambda o, r: ["pareto", str(r), "--no-buckets", "--plot", str(o)],
    "pareto --acceptance-plot": lambda o, r: ["pareto", str(r), "--no-buckets",
                                              "--acceptance-plot", str(o)],
    "export --out": lambda o, r: ["export", str(r / "bundle.json"), "--format", "entmtp",
                                  "--out", str(o)],
}


@pytest.mark.parametrize("kind", list(BAD_TARGETS))
@pytest.mark.parametrize("writer", list(WRITERS))
def test_bad_output_target_is_one_line_error(demo_run, tmp_path, writer, kind):
    run = Path(shutil.copytree(demo_run, tmp_path / "run"))
    out = BAD_TARGETS[kind](tmp_path / "out.png")
    assert_user_error(WRITERS[writer](out, run), tmp_path)
    if kind == "a-device-node":
        assert stat.S_ISCHR(out.lstat().st_mode)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_os_error_while_writing_is_one_line_and_leaves_nothing(demo_run, tmp_path, monkeypatch,
                                                               writer, code):
    """A full disk (or a permission error) during the write: no temp file, no new folder."""
    run = Path(shutil.copytree(demo_run, tmp_path / "run"))

    def failing_fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    assert_user_error(WRITERS[writer](tmp_path / "new" / "deeper" / "out.png", run), tmp_path,
                      mentions=(os.strerror(code).lower(),))


def test_read_only_file_is_kept_and_a_writable_one_replaced(demo_run, tmp_path):
    run = Path(shutil.copytree(demo_run, tmp_path / "run"))
    out = _read_only(tmp_path / "out.json")
    assert_user_error(WRITERS["export --out"](out, run), tmp_path, mentions=("read-only",))
    out.chmod(0o644)
    result = runner.invoke(app, WRITERS["export --out"](out, run))
    assert result.exit_code == 0, result.output
    assert out.read_bytes() != b"keep me"


# -- demo -----------------------------------------------------------------------------------
def _real_run(root: Path, *, latency_kind: str | None = "cpu") -> Path:
    """A calibration run's folder: a profile of a real model, a measured latency model."""
    root.mkdir()
    profile = synthetic_profile(num_traces=4, positions=64, num_heads=3, seed=2)
    profile.meta.model = "SmolLM2-135M-Instruct"
    profile.save(root / "profile.npz")
    if latency_kind is not None:
        model = LatencyModel.cpu_like()
        LatencyModel(**{**model.__dict__, "hardware": {"kind": latency_kind}}).save(
            root / "latency.json")
    return root


DEMO_CASES: dict[str, tuple[Callable[[Path], list[str]], tuple[str, ...]]] = {
    "out-is-a-file": (lambda t: ["demo", "--out", str(_read_only(t / "f"))], ("not a folder",)),
    "out-is-a-symlink": (lambda t: ["demo", "--out", str(_link(t / "l"))], ("not a folder",)),
    "seed-negative": (lambda t: ["demo", "--out", str(t / "d"), "--seed", "-1"], ("--seed",)),
    "seed-past-32-bits": (lambda t: ["demo", "--out", str(t / "d"), "--seed", str(2**32)],
                          ("--seed", "at most 4294967295")),
    "seed-of-20-digits": (lambda t: ["demo", "--out", str(t / "d"), "--seed", "9" * 20],
                          ("--seed",)),
    "no-trials": (lambda t: ["demo", "--out", str(t / "d"), "--schedule-trials", "0"],
                  ("--schedule-trials",)),
    "bad-latency-kind": (lambda t: ["demo", "--out", str(t / "d"), "--latency", "tpu"],
                         ("--latency",)),
    "real-run": (lambda t: ["demo", "--out", str(_real_run(t / "real"))], ("calibration run",)),
    "measured-latency": (lambda t: ["demo", "--out", str(_measured_only(t / "m"))],
                         ("measured latency",)),
    "damaged-run-latency": (lambda t: ["demo", "--out", str(_damaged_latency(t / "m"))],
                            ("latency file",)),
}


def _measured_only(root: Path) -> Path:
    root.mkdir()
    LatencyModel.cpu_like().__class__(
        **{**LatencyModel.cpu_like().__dict__, "hardware": {"device": "cpu"}}
    ).save(root / "latency.json")
    return root


def _damaged_latency(root: Path) -> Path:
    root.mkdir()
    (root / "latency.json").write_bytes(b"\xff\xfe{")
    return root


@pytest.mark.parametrize("case", list(DEMO_CASES))
def test_demo_bad_input_is_one_line_error(tmp_path, case):
    argv, mentions = DEMO_CASES[case]
    args = argv(tmp_path)
    assert_user_error(args, tmp_path, mentions=mentions)


def test_demo_reruns_into_its_own_folder(demo_run, tmp_path):
    run = Path(shutil.copytree(demo_run, tmp_path / "run"))
    before = snapshot(run)
    result = runner.invoke(app, ["demo", "--out", str(run), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    assert snapshot(run) == before


# -- a run folder reused with other arguments -----------------------------------------------
def _recorded_run(root: Path, **arguments) -> Path:
    run = RunDir(root)
    root.mkdir()
    profile = synthetic_profile(num_traces=4, positions=64, num_heads=3, seed=2)
    profile.meta.task, profile.meta.topk = "code", 10
    profile.meta.split, profile.meta.max_new_tokens, profile.meta.seed = "calibration", 128, 0
    profile.save(run.profile)
    LatencyModel.cpu_like().save(run.latency)
    if arguments:
        record_run_arguments(run, {"task": "code", "model": None, "heads": None,
                                   "head_type": "medusa", "data": None, "split": "calibration",
                                   "prompts": 24, "max_new_tokens": 128, "topk": 10, "seed": 0,
                                   "device": "cpu", "dtype": "float32", **arguments})
    return root


@pytest.mark.parametrize("recorded", [True, False], ids=["run.json", "profile-only"])
@pytest.mark.parametrize("other", [
    ["--task", "chat"],
    ["--topk", "5"],
    ["--task", "chat", "--topk", "5"],
    ["--seed", "3"],
    ["--max-new-tokens", "64"],
    ["--head-type", "hydra"],
], ids=lambda o: " ".join(o))
def test_run_folder_made_with_other_arguments_is_refused(tmp_path, recorded, other):
    run = _recorded_run(tmp_path / "run", **({"device": "cpu", "dtype": "fp32"}
                                             if recorded else {}))
    message = assert_user_error(["calibrate", "--out", str(run), "--schedule-trials", "2",
                                 *other], tmp_path, mentions=("--fresh", other[0]))
    assert "was made with" in message


def test_recorded_model_and_heads_are_compared(tmp_path):
    run = _recorded_run(tmp_path / "run", device="cpu", dtype="fp32")
    assert_user_error(["calibrate", "--out", str(run), "--model", "other/model",
                       "--schedule-trials", "2"], tmp_path, mentions=("--model",))


def test_fresh_starts_the_run_again(tiny_model_dir, tiny_medusa_dir, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(["def add(a, b):", "Once upon a time"])))
    run = _recorded_run(tmp_path / "run", device="cpu", dtype="fp32")
    latency = LatencyModel.cpu_like().save(tmp_path / "latency.json")
    args = ["calibrate", "--latency", str(latency), "--model", str(tiny_model_dir),
            "--heads", str(tiny_medusa_dir),
            "--data", str(data), "--split", "all", "--prompts", "2", "--max-new-tokens", "4",
            "--task", "chat", "--topk", "5", "--schedule-trials", "2", "--out", str(run)]
    assert_user_error(args, tmp_path, mentions=("--task",))
    result = runner.invoke(app, [*args, "--fresh"])
    assert result.exit_code == 0, result.output
    bundle = load_bundle(run / "bundle.json")
    assert bundle.heads.topk == 5
    assert json.loads((run / "front.json").read_text())["task"] == "chat"
    assert json.loads((run / "run.json").read_text())["arguments"]["task"] == "chat"
    again = runner.invoke(app, args)  # the same arguments: the finished run is reused
    assert again.exit_code == 0, again.output


# -- a disk that fills up (or a rename that fails) part-way through a run ------------------------
def _fail_from(monkeypatch, name: str, call: int, code: int = errno.ENOSPC) -> None:
    """``os.<name>`` works ``call - 1`` times, then raises ``code`` every time."""
    real = getattr(os, name)
    count = [0]

    def flaky(*args, **kwargs):
        count[0] += 1
        if count[0] >= call:
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, flaky)


RUN_MAKERS: dict[str, Callable[[Path, Path], list[str]]] = {
    "demo": lambda out, run: ["demo", "--out", str(out), "--schedule-trials", "4"],
    "retarget": lambda out, run: ["retarget", str(run), "--latency", str(run / "latency.json"),
                                  "--out", str(out)],
}


@pytest.mark.parametrize("call", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("failing", ["fsync", "replace"])
@pytest.mark.parametrize("maker", list(RUN_MAKERS))
def test_a_run_cut_short_by_the_disk_leaves_nothing(demo_run, tmp_path, monkeypatch, maker,
                                                    failing, call):
    """The n-th write of a new run folder fails: one line, and no half-made folder."""
    run = Path(shutil.copytree(demo_run, tmp_path / "run"))
    _fail_from(monkeypatch, failing, call)
    assert_user_error(RUN_MAKERS[maker](tmp_path / "new" / "run", run), tmp_path,
                      mentions=("no space left",))


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_two_plots_of_one_command_appear_together_or_not_at_all(demo_run, tmp_path, monkeypatch,
                                                               failing):
    run = Path(shutil.copytree(demo_run, tmp_path / "run"))
    _fail_from(monkeypatch, failing, 2)  # the first plot is written, the second is not
    new = tmp_path / "new"
    assert_user_error(["pareto", str(run), "--no-buckets", "--plot", str(new / "f.png"),
                       "--acceptance-plot", str(new / "a.png")], tmp_path,
                      mentions=("no space left",))


def test_calibrate_on_a_full_disk_leaves_no_empty_folders(tiny_model_dir, tiny_medusa_dir,
                                                          tmp_path, monkeypatch):
    """Its first write fails: the run folder and the parents it made go again (a later failure
    keeps the finished prompts for the resume)."""
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "p0", "prompt": "def add(a, b):"}) + "\n")
    latency = LatencyModel.cpu_like().save(tmp_path / "latency.json")
    _fail_from(monkeypatch, "fsync", 1)
    assert_user_error(["calibrate", "--model", str(tiny_model_dir), "--heads",
                       str(tiny_medusa_dir), "--data", str(data), "--split", "all",
                       "--prompts", "1", "--max-new-tokens", "4", "--latency", str(latency),
                       "--schedule-trials", "2", "--out", str(tmp_path / "new" / "deeper" / "run")],
                      tmp_path, mentions=("no space left",))


@pytest.mark.parametrize("writer", list(WRITERS))
def test_an_interrupted_write_leaves_nothing(demo_run, tmp_path, monkeypatch, writer):
    """Ctrl-C while the output is being synced: exit 130, no temp file, no new folder."""
    run = Path(shutil.copytree(demo_run, tmp_path / "run"))

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    before = snapshot(tmp_path)
    result = runner.invoke(app, WRITERS[writer](tmp_path / "new" / "out.png", run))
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert snapshot(tmp_path) == before
