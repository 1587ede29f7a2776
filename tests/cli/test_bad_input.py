"""Bad input through every command that takes it: one ``entmtp: error:`` line, exit code 2, no
traceback, and no file changed, added or removed (the folder is snapshotted, bytes included).

Commands that other parts of the CLI add (validate, decode, bench, retarget) are covered when
they are registered with the options used here, and skipped until then.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from one_line_errors import assert_user_error
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.treesearch._bundle import BUNDLE_FORMAT_VERSION
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._synthetic import synthetic_profile

runner = CliRunner()
GOOD_PROMPTS = ["def add(a, b):", "Once upon a time", "hello world"]


# -- helpers --------------------------------------------------------------------------------
def registered(name: str, *options: str) -> None:
    """Skip unless ``entmtp NAME`` exists and takes ``options``."""
    command = typer.main.get_command(app).commands.get(name)
    if command is None:
        pytest.skip(f"`entmtp {name}` is not registered yet")
    known = {opt for param in command.params for opt in param.opts}
    missing = [opt for opt in options if opt not in known]
    if missing:
        pytest.skip(f"`entmtp {name}` has no {', '.join(missing)} option")


def write_jsonl(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


@dataclass(frozen=True)
class Inputs:
    model: Path
    heads: Path
    latency: Path
    good_bundle: dict  # a valid bundle (for another model: the synthetic one of `demo`)
    demo_run: Path  # a finished demo run folder (front.json, bundle.json, ...)


@pytest.fixture(scope="module")
def inputs(tiny_model_dir, tiny_medusa_dir, tmp_path_factory) -> Inputs:
    root = tmp_path_factory.mktemp("bad-input")
    demo = root / "demo"
    result = runner.invoke(app, ["demo", "--out", str(demo), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    latency = LatencyModel.cpu_like().save(root / "latency.json")
    good = json.loads((demo / "bundle.json").read_text())
    return Inputs(tiny_model_dir, tiny_medusa_dir, latency, good, demo)


# -- bundles --------------------------------------------------------------------------------
def _descending_thresholds(good: dict) -> str:
    obj = json.loads(json.dumps(good))
    obj["trees"] = [obj["trees"][0]] * 3
    obj["thresholds"] = [2.0, 1.0]
    obj["best_static"] = {"tree_index": 0, "tokens_per_second": 1.0}
    return json.dumps(obj)


def _with(good: dict, edit: Callable[[dict], None]) -> str:
    obj = json.loads(json.dumps(good))
    edit(obj)
    return json.dumps(obj, allow_nan=True)


BAD_BUNDLES: dict[str, tuple[Callable[[dict], str], tuple[str, ...]]] = {
    "malformed": (lambda good: "{not json", ("json",)),
    "truncated": (lambda good: json.dumps(good, indent=2)[: len(json.dumps(good, indent=2)) // 2],
                  ("json",)),
    "empty": (lambda good: "", ()),
    "top-level-list": (lambda good: "[1, 2, 3]", ()),
    "wrong-format": (lambda good: _with(good, lambda o: o.update(format="medusa-choices")),
                     ("format",)),
    "newer-major-version": (
        lambda good: _with(good, lambda o: o.update(format_version=BUNDLE_FORMAT_VERSION + 1)),
        ("format_version",)),
    "thresholds-descending": (_descending_thresholds, ("threshold",)),
    "nan": (lambda good: _with(good, lambda o: o["predicted"].update(tokens_per_second=math.nan)),
            ("nan",)),
}

# command -> (options it needs registered, argv builder(bundle, inputs, tmp)).
# show-tree reads a JSON object that is not a bundle as a path list, and retarget refuses a bare
# bundle file before reading it, so their messages need not name the bundle's defect.
NAMES_THE_DEFECT = {"export-entmtp", "export-medusa", "validate", "decode", "bench"}
BUNDLE_COMMANDS: dict[str, tuple[tuple[str, ...], Callable[[Path, Inputs, Path], list[str]]]] = {
    "export-entmtp": ((), lambda b, i, t: ["export", str(b), "--format", "entmtp",
                                           "--out", str(t / "out.json")]),
    "export-medusa": ((), lambda b, i, t: ["export", str(b), "--format", "medusa",
                                           "--out", str(t / "out.json")]),
    "show-tree": ((), lambda b, i, t: ["show-tree", str(b), "--out", str(t / "tree.png")]),
    "validate": (("--model", "--heads", "--data", "--prompts", "--max-new-tokens"),
                 lambda b, i, t: ["validate", str(b), "--model", str(i.model),
                                  "--heads", str(i.heads), "--data",
                                  str(write_jsonl(t / "p.jsonl", GOOD_PROMPTS)),
                                  "--split", "all", "--prompts", "1",
                                  "--max-new-tokens", "4"]),
    "decode": (("--model", "--heads", "--prompt", "--max-new-tokens"),
               lambda b, i, t: ["decode", str(b), "--model", str(i.model), "--heads",
                                str(i.heads), "--prompt", "hello", "--max-new-tokens", "4"]),
    "bench": (("--bundle", "--model", "--heads", "--data", "--prompts", "--max-new-tokens"),
              lambda b, i, t: ["bench", "--bundle", str(b), "--model", str(i.model),
                               "--heads", str(i.heads), "--data",
                               str(write_jsonl(t / "p.jsonl", GOOD_PROMPTS)),
                               "--split", "all", "--prompts", "1", "--max-new-tokens", "4"]),
    "retarget": (("--latency", "--out"),
                 lambda b, i, t: ["retarget", str(b), "--latency", str(i.latency),
                                  "--out", str(t / "retargeted")]),
}


def _command_name(key: str) -> str:
    return key.split("-")[0] if key.startswith("export") else key


@pytest.mark.parametrize("command", list(BUNDLE_COMMANDS))
@pytest.mark.parametrize("defect", list(BAD_BUNDLES))
def test_bad_bundle_is_one_line_error(inputs, tmp_path, command, defect):
    options, argv = BUNDLE_COMMANDS[command]
    registered(_command_name(command), *options)
    make, mentions = BAD_BUNDLES[defect]
    bundle = tmp_path / "bundle.json"
    bundle.write_text(make(inputs.good_bundle))
    args = argv(bundle, inputs, tmp_path)
    assert_user_error(args, tmp_path, inputs.model, inputs.heads,
                      mentions=mentions if command in NAMES_THE_DEFECT else ())


@pytest.mark.parametrize("defect", ["malformed", "newer-major-version", "nan"])
def test_pareto_plot_of_a_run_with_a_bad_bundle_is_one_line_error(inputs, tmp_path, defect):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("front.json", "acceptance.json", "profile.npz", "latency.json"):
        (run / name).write_bytes((inputs.demo_run / name).read_bytes())
    make, mentions = BAD_BUNDLES[defect]
    (run / "bundle.json").write_text(make(inputs.good_bundle))
    assert_user_error(["pareto", str(run), "--plot", str(tmp_path / "front.png")], tmp_path,
                      mentions=mentions)


@pytest.mark.parametrize("command", ["validate", "decode", "bench"])
def test_bundle_for_another_model_is_one_line_error(inputs, tmp_path, command):
    options, argv = BUNDLE_COMMANDS[command]
    registered(command, *options)
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(inputs.good_bundle))  # made for the synthetic model
    message = assert_user_error(argv(bundle, inputs, tmp_path), tmp_path, inputs.model,
                                inputs.heads)
    assert any(word in message for word in ("model", "heads", "vocab", "hidden"))


@pytest.mark.parametrize("make", [
    lambda root: root / "missing.json",
    lambda root: root,  # a folder without bundle.json
], ids=["missing-file", "folder-without-bundle"])
@pytest.mark.parametrize("command", ["export-entmtp", "show-tree", "decode", "retarget"])
def test_missing_bundle_is_one_line_error(inputs, tmp_path, command, make):
    options, argv = BUNDLE_COMMANDS[command]
    registered(_command_name(command), *options)
    source = make(tmp_path / "src")
    (tmp_path / "src").mkdir()
    assert_user_error(argv(source, inputs, tmp_path), tmp_path)


@pytest.mark.parametrize("argv", [
    lambda b, t: ["export", str(b), "--format", "entmtp", "--out", str(t / "a-file" / "x.json")],
    lambda b, t: ["export", str(b), "--format", "vllm", "--out", str(t / "a-file" / "x.json")],
    lambda b, t: ["export", str(b), "--format", "no-such-format", "--out", str(t / "x.json")],
    lambda b, t: ["export", str(b), "--tree", "99", "--format", "medusa",
                  "--out", str(t / "x.json")],
], ids=["entmtp-under-a-file", "vllm-under-a-file", "unknown-format", "tree-out-of-range"])
def test_export_bad_options_are_one_line_errors(inputs, tmp_path, argv):
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(inputs.good_bundle))
    (tmp_path / "a-file").write_text("a regular file, not a folder")
    assert_user_error(argv(bundle, tmp_path), tmp_path)


# -- calibrate: datasets, options, storage ---------------------------------------------------
def calibrate_args(inputs: Inputs, out: Path, *extra: str) -> list[str]:
    return ["calibrate", "--model", str(inputs.model), "--heads", str(inputs.heads),
            "--split", "all", "--prompts", "2", "--max-new-tokens", "4",
            "--latency", str(inputs.latency), "--schedule-trials", "2", "--out", str(out),
            *extra]


BAD_DATA: dict[str, Callable[[Path], Path]] = {
    "missing": lambda root: root / "missing.jsonl",
    "a-folder": lambda root: root,
    "empty": lambda root: _write(root / "d.jsonl", b""),
    "blank-lines-only": lambda root: _write(root / "d.jsonl", b"\n  \n\n"),
    "not-json": lambda root: _write(root / "d.jsonl", b'{"prompt": "ok"}\n{prompt: bad}\n'),
    "no-prompt-field": lambda root: _write(root / "d.jsonl", b'{"text": "hello"}\n'),
    "prompt-not-a-string": lambda root: _write(root / "d.jsonl", b'{"prompt": 42}\n'),
    "empty-prompt": lambda root: _write(root / "d.jsonl", b'{"prompt": "  "}\n'),
    "line-is-a-list": lambda root: _write(root / "d.jsonl", b'["hello"]\n'),
    "not-utf8": lambda root: _write(root / "d.jsonl", b'{"prompt": "\xff\xfe"}\n'),
    "duplicate-ids": lambda root: _write(
        root / "d.jsonl", b'{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n'),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("defect", list(BAD_DATA))
def test_calibrate_bad_dataset_is_one_line_error(inputs, tmp_path, defect):
    data_root = tmp_path / "data"
    data_root.mkdir()
    data = BAD_DATA[defect](data_root)
    assert_user_error(calibrate_args(inputs, tmp_path / "run", "--data", str(data)), tmp_path,
                      inputs.model, inputs.heads)


@pytest.mark.parametrize("extra,mentions", [
    (["--task", "poetry"], ("task",)),
    (["--split", "training"], ("split",)),
    (["--prompts", "0"], ("--prompts",)),
    (["--num-shards", "2"], ("shard",)),
    (["--num-shards", "2", "--shard-index", "2"], ("shard",)),
    (["--num-shards", "0", "--shard-index", "0"], ("shard",)),
    (["--head-type", "eagle", "--heads", None], ("head",)),
], ids=["unknown-task", "unknown-split", "zero-prompts", "shards-without-index",
        "shard-index-out-of-range", "zero-shards", "unknown-head-type"])
def test_calibrate_bad_options_are_one_line_errors(inputs, tmp_path, extra, mentions):
    data = write_jsonl(tmp_path / "p.jsonl", GOOD_PROMPTS)
    args = calibrate_args(inputs, tmp_path / "run", "--data", str(data))
    if None in extra:  # drop an option of the base command (here: --heads)
        name = extra[extra.index(None) - 1]
        index = args.index(name)
        del args[index : index + 2]
        extra = [e for e in extra if e is not None and e != name]
    assert_user_error([*args, *extra], tmp_path, inputs.model, inputs.heads, mentions=mentions)


def test_calibrate_run_folder_under_a_regular_file_is_one_line_error(inputs, tmp_path):
    blocker = tmp_path / "somefile"
    blocker.write_text("a regular file")  # a folder cannot be made under it, even by root
    data = write_jsonl(tmp_path / "p.jsonl", GOOD_PROMPTS)
    assert_user_error(calibrate_args(inputs, blocker / "sub", "--data", str(data)), tmp_path)


def test_calibrate_non_integer_torchrun_environment_is_one_line_error(inputs, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", GOOD_PROMPTS)
    assert_user_error(calibrate_args(inputs, tmp_path / "run", "--data", str(data)), tmp_path,
                      env={"WORLD_SIZE": "two", "RANK": "0"}, mentions=("world_size",))


def _profiled_run(root: Path) -> Path:
    """A run folder whose profile and latency stages are done, so no model is needed."""
    run = root / "run"
    run.mkdir()
    profile = synthetic_profile(num_traces=4, positions=64, num_heads=3, seed=2)
    profile.save(run / "profile.npz")
    LatencyModel.cpu_like().save(run / "latency.json")
    return run


@pytest.mark.parametrize("storage", [
    "bogus://x",
    "postgresql://nobody@127.0.0.1:1/x",  # loopback only
    "journal:{file}/study.log",  # the journal's folder is a regular file
    "sqlite:////nonexistent-entmtp-folder/sub/x.db",
])
def test_calibrate_bad_storage_is_one_line_error(tmp_path, storage):
    run = _profiled_run(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("a regular file")
    storage = storage.replace("{file}", str(blocker))
    assert_user_error(["calibrate", "--out", str(run), "--schedule-trials", "2",
                       "--storage", storage], tmp_path, mentions=("optuna",))


def test_calibrate_checks_storage_before_loading_anything(inputs, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", GOOD_PROMPTS)
    args = calibrate_args(inputs, tmp_path / "run", "--data", str(data), "--storage",
                          "bogus://x")
    args[args.index("--model") + 1] = str(tmp_path / "no-such-model")
    assert_user_error(args, tmp_path, mentions=("bogus://x",))


@pytest.mark.parametrize("content", [
    b"{not json",
    json.dumps({"format": "entmtp-latency", "nodes": [0, 3], "verify_ms": [1.0, -2.0],
                "autoregressive_ms": 1.0}).encode(),
    json.dumps({"format": "entmtp-latency", "nodes": [0, 3]}).encode(),
], ids=["not-json", "negative-time", "missing-field"])
def test_calibrate_bad_latency_file_is_one_line_error(tmp_path, content):
    run = _profiled_run(tmp_path)
    bad = _write(tmp_path / "bad-latency.json", content)
    assert_user_error(["calibrate", "--out", str(run), "--latency", str(bad),
                       "--schedule-trials", "2"], tmp_path, mentions=("latency",))


def test_calibrate_prompt_longer_than_the_context_is_one_line_error(inputs, tmp_path):
    from transformers import AutoConfig

    context = AutoConfig.from_pretrained(inputs.model).max_position_embeddings
    data = write_jsonl(tmp_path / "p.jsonl", ["x" * (4 * context)])  # char tokenizer: 1 char/token
    assert_user_error(calibrate_args(inputs, tmp_path / "run", "--data", str(data),
                                     "--prompts", "1"),
                      tmp_path, inputs.model, inputs.heads, mentions=("context",))
