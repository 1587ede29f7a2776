"""Mistyped command lines, read-only outputs (refused unless --force), heads folders that must
not be replaced, and a decode prompt past the model's context: each refusal is one
``entmtp: error:`` line, exit 2, no traceback, nothing added, removed or changed."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from one_line_errors import assert_user_error, char_device, snapshot
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.treesearch import load_bundle, save_bundle
from entmtp.treesearch._bundle import HeadsInfo

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-usage") / "demo"
    result = runner.invoke(app, ["demo", "--out", str(root), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    return root


def _copy(demo_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo_run, tmp_path / "run"))


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(["def add(a, b):", "Once upon a time"])))
    return path


# -- usage errors ---------------------------------------------------------------------------
USAGE_ERRORS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "int-option-not-a-number": (["export", "x", "--out", "y", "--tree", "abc"], ("--tree",)),
    "int-option-a-float": (["calibrate", "--prompts", "1.5"], ("--prompts",)),
    "float-option-not-a-number": (["heads", "train", "--type", "medusa", "--out", "h",
                                   "--lr", "fast"], ("--lr",)),
    "unknown-option": (["export", "x", "--out", "y", "--bogus"], ("--bogus",)),
    "unknown-root-option": (["--bogus", "demo"], ("--bogus",)),
    "missing-required-option": (["export", "x"], ("--out",)),
    "missing-argument": (["show-tree", "--out", "t.png"], ("source",)),
    "option-without-its-value": (["export", "x", "--out"], ("--out",)),
    "unknown-command": (["exprot"], ("exprot",)),
    "unknown-subcommand": (["heads", "trian"], ("trian",)),
    "extra-arguments": (["pareto", "a", "b", "c"], ("b c",)),
    "bad-boolean-flag-value": (["pareto", "run", "--buckets=maybe"], ("--buckets",)),
}


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_usage_error_is_one_line(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)  # relative names in the cases land here, if anywhere
    args, mentions = USAGE_ERRORS[case]
    message = assert_user_error(args, tmp_path, mentions=mentions)
    assert "--help" in message  # where the usage is


def test_help_and_bare_command_still_print_the_usage_panel():
    helped = runner.invoke(app, ["export", "--help"])
    assert helped.exit_code == 0
    assert "Usage" in helped.output and "--format" in helped.output and "--force" in helped.output
    bare = runner.invoke(app, [])
    assert bare.exit_code == 2 and "Commands" in bare.output  # no_args_is_help
    group = runner.invoke(app, ["heads"])
    assert "train" in group.output


def test_debug_shows_click_s_own_report(monkeypatch):
    monkeypatch.setenv("ENTMTP_DEBUG", "0")  # --debug sets it in this process: undone after
    result = runner.invoke(app, ["--debug", "export", "x", "--out", "y", "--tree", "abc"])
    assert result.exit_code == 2
    assert "entmtp: error:" not in result.output


# -- --force --------------------------------------------------------------------------------
def _read_only(path: Path, data: bytes = b"keep me") -> Path:
    path.write_bytes(data)
    path.chmod(0o444)
    return path


# writer -> argv builder(output path, run folder)
FILE_WRITERS: dict[str, Callable[[Path, Path], list[str]]] = {
    "export --out": lambda o, r: ["export", str(r), "--format", "trtllm", "--out", str(o)],
    "show-tree --out": lambda o, r: ["show-tree", str(r / "bundle.json"), "--out", str(o)],
    "plot-latency --out": lambda o, r: ["plot-latency", str(r / "latency.json"), "--out", str(o)],
    "pareto --plot": lambda o, r: ["pareto", str(r), "--plot", str(o)],
    "pareto --acceptance-plot": lambda o, r: ["pareto", str(r), "--acceptance-plot", str(o)],
}


def _output_name(writer: str) -> str:
    """A name the writer takes: a plot's suffix names its format."""
    return "out.png" if "plot" in writer or writer.startswith("show-tree") else "out.file"


@pytest.mark.parametrize("writer", list(FILE_WRITERS))
def test_read_only_output_is_refused_unless_force(demo_run, tmp_path, writer):
    run = _copy(demo_run, tmp_path)
    out = _read_only(tmp_path / _output_name(writer))
    assert_user_error(FILE_WRITERS[writer](out, run), tmp_path, mentions=("read-only", "--force"))
    result = runner.invoke(app, [*FILE_WRITERS[writer](out, run), "--force"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() != b"keep me"
    assert not list(tmp_path.glob(f".{out.name}.*"))  # no temp file left


def test_force_is_only_for_the_command_it_is_given_to(demo_run, tmp_path):
    run = _copy(demo_run, tmp_path)
    out = _read_only(tmp_path / "out.yaml")
    assert runner.invoke(app, [*FILE_WRITERS["export --out"](out, run), "--force"]).exit_code == 0
    out.chmod(0o444)
    assert_user_error(FILE_WRITERS["export --out"](out, run), tmp_path, mentions=("--force",))


def test_second_plot_read_only_writes_neither(demo_run, tmp_path):
    run = _copy(demo_run, tmp_path)
    assert_user_error(["pareto", str(run), "--plot", str(tmp_path / "fronts.png"),
                       "--acceptance-plot", str(_read_only(tmp_path / "acc.png"))],
                      tmp_path, mentions=("--force",))


def _search_again(run: Path) -> Path:
    """A run whose search stage must run again (front.json gone), bundle.json read-only."""
    (run / "front.json").unlink()
    (run / "bundle.json").chmod(0o444)
    return run


RUN_WRITERS: dict[str, Callable[[Path, Path], list[str]]] = {
    "demo": lambda r, t: ["demo", "--out", str(r), "--schedule-trials", "4"],
    "pareto (searches)": lambda r, t: ["pareto", str(r), "--schedule-trials", "4"],
    "retarget --out": lambda r, t: ["retarget", str(_retarget_source(r, t)), "--latency",
                                    str(r / "latency.json"), "--out", str(r)],
}


def _retarget_source(target: Path, tmp_path: Path) -> Path:
    source = tmp_path / "source"
    if not source.exists():
        shutil.copytree(target, source, ignore=shutil.ignore_patterns("bundle.json"))
        shutil.copy(target.parent / "front.json.orig", source / "front.json")
    return source


@pytest.mark.parametrize("writer", list(RUN_WRITERS))
def test_read_only_run_file_is_refused_unless_force(demo_run, tmp_path, writer):
    run = _copy(demo_run, tmp_path)
    shutil.copy(run / "front.json", tmp_path / "front.json.orig")
    _search_again(run)
    args = RUN_WRITERS[writer](run, tmp_path)
    assert_user_error(args, tmp_path, mentions=("read-only", "--force"))
    result = runner.invoke(app, [*args, "--force"])
    assert result.exit_code == 0, result.output
    assert (run / "front.json").is_file()
    assert load_bundle(run / "bundle.json").trees


def test_calibrate_refuses_a_read_only_stage_file_before_loading_a_model(tmp_path):
    """A run with its profile and latency model: only the search stage is left to do."""
    from entmtp.calibrate._rundir import RunDir, record_run_arguments
    from entmtp.treesearch import LatencyModel, synthetic_profile

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    profile = synthetic_profile(num_traces=4, positions=64, num_heads=3, seed=2)
    profile.meta.model, profile.meta.vocab_size, profile.meta.hidden_size = "tiny", 128, 32
    profile.meta.task, profile.meta.split, profile.meta.max_new_tokens = "code", "calibration", 128
    profile.save(run.profile)
    LatencyModel.cpu_like().save(run.latency)
    arguments = {"task": "code", "model": None, "heads": None, "head_type": "medusa",
                 "data": None, "split": "calibration", "prompts": 24, "max_new_tokens": 128,
                 "topk": 10, "seed": 0, "device": "cpu", "dtype": "fp32"}
    record_run_arguments(run, arguments)
    _read_only(run.bundle, b"{}")
    args = ["calibrate", "--out", str(run.root), "--schedule-trials", "4"]
    assert_user_error(args, tmp_path, mentions=("read-only", "--force"))
    result = runner.invoke(app, [*args, "--force"])
    assert result.exit_code == 0, result.output
    assert load_bundle(run.bundle).trees


def test_a_finished_read_only_run_is_reused_without_force(demo_run, tmp_path):
    run = _copy(demo_run, tmp_path)
    for path in run.iterdir():
        path.chmod(0o444)
    before = snapshot(run)
    result = runner.invoke(app, ["demo", "--out", str(run), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    assert snapshot(run) == before


# Model commands check their outputs before the model loads: --model names nothing, so an
# error about the output proves the order; with --force the next error is the model's.
MODEL_WRITERS: dict[str, Callable[[Path, Path, Path], list[str]]] = {
    "latency --out": lambda o, r, t: ["latency", "--model", str(t / "no-model"), "--out", str(o)],
    "latency --plot": lambda o, r, t: ["latency", "--model", str(t / "no-model"),
                                       "--out", str(t / "new.json"), "--plot", str(o)],
    "validate --json": lambda o, r, t: ["validate", str(r), "--model", str(t / "no-model"),
                                        "--heads", str(r), "--data", str(_prompts(t)),
                                        "--split", "all", "--json", str(o)],
    "bench --json": lambda o, r, t: ["bench", "--bundle", str(r), "--model", str(t / "no-model"),
                                     "--heads", str(r), "--data", str(_prompts(t)),
                                     "--split", "all", "--json", str(o)],
    "bench --plot": lambda o, r, t: ["bench", "--bundle", str(r), "--model", str(t / "no-model"),
                                     "--heads", str(r), "--data", str(_prompts(t)),
                                     "--split", "all", "--plot", str(o)],
}


@pytest.mark.parametrize("writer", list(MODEL_WRITERS))
def test_model_command_refuses_a_read_only_output_before_loading(demo_run, tmp_path, writer):
    run = _copy(demo_run, tmp_path)
    out = _read_only(tmp_path / _output_name(writer))
    args = MODEL_WRITERS[writer](out, run, tmp_path)
    assert_user_error(args, tmp_path, mentions=("read-only", "--force"))
    forced = assert_user_error([*args, "--force"], tmp_path)
    assert "read-only" not in forced


# -- heads folders --------------------------------------------------------------------------
def _heads_like(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"format": "entmtp-heads"}')
    (folder / "heads.safetensors").write_bytes(b"weights")
    return folder


def _link_to_folder(path: Path) -> Path:
    path.symlink_to(_heads_like(path.parent / "real-heads"))
    return path


def _read_only_folder(path: Path) -> Path:
    _heads_like(path)
    path.chmod(0o555)
    return path


def _read_only_config(path: Path) -> Path:
    _heads_like(path)
    (path / "config.json").chmod(0o444)
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


BAD_HEADS_TARGETS: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "a-file": (lambda p: (p.write_text("x"), p)[1], ("not a folder",)),
    "a-symlink-to-heads": (_link_to_folder, ("symbolic link",)),
    "a-dangling-symlink": (lambda p: (p.symlink_to(p.parent / "nowhere"), p)[1],
                           ("symbolic link",)),
    "a-pipe": (_fifo, ("not a folder",)),
    "a-device-node": (char_device, ("not a folder",)),
    "a-folder-of-other-files": (lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine"),
                                           p)[2], ("notes.txt",)),
    "read-only-folder": (_read_only_folder, ("read-only", "--force")),
    "read-only-config": (_read_only_config, ("read-only", "--force")),
    "config-is-a-folder": (lambda p: (p.mkdir(), (p / "config.json").mkdir(), p)[2],
                           ("folder",)),
    "under-a-file": (lambda p: ((p.parent / "afile").write_text("x"),
                                p.parent / "afile" / "heads")[1], ("file",)),
}


@pytest.mark.parametrize("kind", list(BAD_HEADS_TARGETS))
def test_heads_train_refuses_its_output_before_loading(tmp_path, kind):
    make, mentions = BAD_HEADS_TARGETS[kind]
    out = make(tmp_path / "heads")
    try:
        assert_user_error(["heads", "train", "--type", "medusa", "--out", str(out),
                           "--data", str(_prompts(tmp_path)), "--model",
                           str(tmp_path / "no-such-model")], tmp_path, mentions=mentions)
    finally:
        if kind == "read-only-folder":
            out.chmod(0o755)
    if kind == "a-device-node":
        assert stat.S_ISCHR(out.lstat().st_mode)


def test_save_heads_replaces_a_read_only_heads_folder_only_with_force(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from entmtp.core import EntmtpError
    from entmtp.core._atomic import replacing_read_only
    from entmtp.model import load_heads, new_heads, save_heads

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    first = save_heads(new_heads(model, head_type="medusa", num_heads=2), tmp_path / "h",
                       dtype=None)
    first.chmod(0o555)
    second = new_heads(model, head_type="medusa", num_heads=2, seed=9)
    before = snapshot(tmp_path)
    with pytest.raises(EntmtpError, match="--force"):
        save_heads(second, first, dtype=None)
    assert snapshot(tmp_path) == before
    with replacing_read_only():
        save_heads(second, first, dtype=None)
    assert load_heads(first, model).sha256() == second.sha256()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]


def test_save_heads_full_disk_leaves_nothing(tiny_model_dir, tmp_path, monkeypatch):
    import errno

    from transformers import AutoModelForCausalLM

    from entmtp.core import EntmtpError
    from entmtp.model import new_heads, save_heads

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    heads = new_heads(model, head_type="medusa", num_heads=2)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(EntmtpError, match="No space left"):
        save_heads(heads, tmp_path / "new" / "deeper" / "h", dtype=None)
    assert list(tmp_path.iterdir()) == []


# -- decode ---------------------------------------------------------------------------------
def test_decode_refuses_a_prompt_longer_than_the_context(demo_run, tiny_model_dir,
                                                         tiny_medusa_dir, tmp_path):
    """The tiny model's context is 512 positions and its tokenizer one token a character."""
    config = json.loads((tiny_medusa_dir / "config.json").read_text())
    demo = load_bundle(demo_run / "bundle.json")
    bundle = dataclasses.replace(
        demo, model=dataclasses.replace(demo.model, name="tiny", vocab_size=128, hidden_size=32),
        heads=HeadsInfo("medusa", config["num_heads"], demo.heads.topk, config["sha256"]))
    path = save_bundle(bundle, tmp_path / "bundle.json")
    args = ["decode", str(path), "--model", str(tiny_model_dir), "--heads", str(tiny_medusa_dir),
            "--max-new-tokens", "8"]
    assert_user_error([*args, "--prompt", "a" * 600], tmp_path,
                      mentions=("context", "--max-new-tokens", "--prompt"))
    assert_user_error([*args, "--prompt", "a" * 500, "--max-new-tokens", "64"], tmp_path,
                      mentions=("context",))


# -- output folders -------------------------------------------------------------------------
BAD_FOLDERS: dict[str, Callable[[Path], Path]] = {
    "a-file": lambda p: (p.write_text("x"), p)[1],
    "a-symlink-to-a-folder": lambda p: ((p.parent / "real").mkdir(),
                                        p.symlink_to(p.parent / "real"), p)[2],
    "a-dangling-symlink": lambda p: (p.symlink_to(p.parent / "nowhere"), p)[1],
    "a-symlink-loop": lambda p: (p.symlink_to(p), p)[1],
    "a-pipe": _fifo,
    "a-device-node": char_device,
    "under-a-file": lambda p: ((p.parent / "afile").write_text("x"), p.parent / "afile" / "o")[1],
}

# folder writer -> argv builder(folder, demo run copy, tmp); the model ones name no model
FOLDER_WRITERS: dict[str, Callable[[Path, Path, Path], list[str]]] = {
    "demo --out": lambda o, r, t: ["demo", "--out", str(o), "--schedule-trials", "2"],
    "retarget --out": lambda o, r, t: ["retarget", str(r), "--latency", str(r / "latency.json"),
                                       "--out", str(o)],
    "calibrate --out": lambda o, r, t: ["calibrate", "--model", str(t / "no-model"), "--heads",
                                        str(r), "--data", str(_prompts(t)), "--split", "all",
                                        "--latency", str(r / "latency.json"), "--out", str(o)],
    "heads data --out": lambda o, r, t: ["heads", "data", "--model", str(t / "no-model"),
                                         "--data", str(_prompts(t)), "--out", str(o)],
}


@pytest.mark.parametrize("kind", list(BAD_FOLDERS))
@pytest.mark.parametrize("writer", list(FOLDER_WRITERS))
def test_bad_output_folder_is_refused_first(demo_run, tmp_path, writer, kind):
    run = _copy(demo_run, tmp_path)
    out = BAD_FOLDERS[kind](tmp_path / "out")
    message = assert_user_error(FOLDER_WRITERS[writer](out, run, tmp_path), tmp_path)
    assert "no-model" not in message  # refused before any model was looked for
