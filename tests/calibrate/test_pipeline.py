"""The calibration pipeline as a library: it reports through its callback and never prints, the
CLI is a thin layer over it (same run folder for the same arguments), and the library never
imports the CLI."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import entmtp.calibrate
from entmtp.calibrate import CalibrateArguments, Event, RunDir, calibrate, demo_run
from entmtp.treesearch import LatencyModel, load_bundle

PROMPTS = ["def add(a, b):", "Once upon a time", "import numpy as np\n", "x = 1 + 2"]


@pytest.fixture(scope="module")
def inputs(tiny_model_dir, tiny_medusa_dir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("pipeline-inputs")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return {"model": str(tiny_model_dir), "heads": str(tiny_medusa_dir), "data": str(data),
            "latency": LatencyModel.cpu_like().save(root / "latency.json")}


def _arguments(inputs: dict, out: Path, **extra) -> CalibrateArguments:
    return CalibrateArguments(
        model=inputs["model"], heads=inputs["heads"], data=inputs["data"], split="all",
        prompts=len(PROMPTS), max_new_tokens=8, batch_size=2, latency=inputs["latency"],
        schedule_trials=4, validation_folds=0, out=out, **extra)


def _kinds(events: list[Event]) -> list[tuple[str, str]]:
    """(stage, kind) in order, each run of ``advance`` events as one."""
    kinds: list[tuple[str, str]] = []
    for event in events:
        if event.kind == "advance" and kinds and kinds[-1] == (event.stage, "advance"):
            continue
        kinds.append((event.stage, event.kind))
    return kinds


def test_calibrate_reports_each_stage_through_the_callback_and_prints_nothing(
        inputs, tmp_path, capfd):
    events: list[Event] = []
    run = calibrate(_arguments(inputs, tmp_path / "run"), progress=events.append)
    assert run == RunDir(tmp_path / "run") and load_bundle(run.bundle)
    assert _kinds(events) == [("profile", "begin"), ("profile", "advance"), ("profile", "end"),
                              ("search", "begin"), ("search", "end")]
    advances = [e for e in events if e.kind == "advance"]
    assert [e.done for e in advances] == sorted(e.done for e in advances)
    assert advances[-1].done == advances[-1].total == len(PROMPTS)

    again: list[Event] = []
    calibrate(_arguments(inputs, tmp_path / "run"), progress=again.append)
    assert [(e.stage, e.kind, e.text) for e in again] == [
        ("profile", "note", f"profile: reusing {run.profile}"),
        ("search", "note", f"search: reusing {run.bundle}")]
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_the_command_writes_what_the_library_writes(inputs, tmp_path):
    from entmtp.cli.app import app

    library = calibrate(_arguments(inputs, tmp_path / "library"))
    command = RunDir(tmp_path / "command")
    result = CliRunner().invoke(app, [
        "calibrate", "--model", inputs["model"], "--heads", inputs["heads"], "--data",
        inputs["data"], "--split", "all", "--prompts", str(len(PROMPTS)), "--max-new-tokens",
        "8", "--batch-size", "2", "--latency", str(inputs["latency"]), "--schedule-trials", "4",
        "--validation-folds", "0", "--out", str(command.root)],
        env={"WORLD_SIZE": None, "RANK": None})
    assert result.exit_code == 0, result.output
    assert json.loads(command.record.read_text()) == json.loads(library.record.read_text())
    assert command.profile.read_bytes() == library.profile.read_bytes()
    assert command.latency.read_bytes() == library.latency.read_bytes()
    made_by_command, made_by_library = (json.loads(run.bundle.read_text())
                                        for run in (command, library))
    for made in (made_by_command, made_by_library):
        del made["created_by"]  # the command line that wrote it
    assert made_by_command == made_by_library


def test_a_shard_waits_for_the_others_without_a_bundle(inputs, tmp_path):
    events: list[Event] = []
    run = calibrate(_arguments(inputs, tmp_path / "run", num_shards=2, shard_index=1),
                    progress=events.append)
    assert run.shard_profile(2, 1).is_file() and not run.profile.exists()
    assert not run.bundle.exists()
    waits = [e for e in events if e.kind == "wait"]
    assert len(waits) == 1 and run.shard_profile(2, 0).name in waits[0].text


def test_demo_run_reports_and_prints_nothing(tmp_path, capfd):
    events: list[Event] = []
    run = demo_run(tmp_path / "demo", schedule_trials=3, progress=events.append)
    assert load_bundle(run.bundle).model.name == "synthetic"
    assert _kinds(events) == [("search", "begin"), ("search", "end")]
    assert capfd.readouterr() == ("", "")


def test_retarget_run_searches_the_same_profile_under_the_given_latency(tmp_path, capfd):
    from entmtp.calibrate import retarget_run

    source = demo_run(tmp_path / "demo", schedule_trials=3)
    gpu = LatencyModel.gpu_like().save(tmp_path / "gpu.json")
    events: list[Event] = []
    target = retarget_run(source.root, gpu, progress=events.append)
    assert target.root == tmp_path / "demo-synthetic-gpu"
    assert target.profile.read_bytes() == source.profile.read_bytes()
    assert LatencyModel.load(target.latency) == LatencyModel.gpu_like()
    assert load_bundle(target.bundle).hardware == LatencyModel.gpu_like().hardware
    assert _kinds(events) == [("search", "begin"), ("search", "end")]
    assert capfd.readouterr() == ("", "")


def _per_node(ms: float) -> LatencyModel:
    nodes = (0, 3, 7, 15, 63, 127)
    return LatencyModel(nodes, tuple(80.0 + ms * n for n in nodes), autoregressive_ms=80.0,
                        hardware={"kind": "synthetic-cpu", "device_name": "test CPU"})


def test_retarget_to_a_file_with_a_batch_axis_searches_every_batch_size(tmp_path):
    """The bundle gets ranges from batch size 1 (the top level: the batch-1 search), the report
    a table by batch size, and a size where drafting costs more than it gains decodes plainly."""
    from entmtp.calibrate import retarget_run
    from entmtp.treesearch import BatchLatency

    source = demo_run(tmp_path / "demo", schedule_trials=3)
    batched = BatchLatency({1: _per_node(0.5), 4: _per_node(3.0), 16: _per_node(60.0)})
    path = batched.save(tmp_path / "batched.json")
    target = retarget_run(source.root, path, out=tmp_path / "batched-run")
    bundle = load_bundle(target.bundle)
    assert bundle.batch_sizes == (1, 4, 16)
    assert bundle.batch_latency.to_json() == batched.to_json()  # what the ranges were priced by
    assert bundle.latency == batched[1]
    assert bundle.batch_ranges[0].min_batch_size == 1
    assert bundle.batch_ranges[-1].max_batch_size == 16
    assert bundle.schedule(1) == bundle.schedule()
    assert not bundle.batch_range(16).drafts and bundle.batch_range(1).drafts
    for batch in bundle.batch_ranges:
        for predicted in batch.predicted:
            assert predicted.tokens_per_second >= predicted.autoregressive_tokens_per_second
            assert predicted.tokens_per_second >= predicted.batch_one_tokens_per_second
    report = target.report.read_text()
    assert "## By batch size" in report
    assert "| 16 | 200.00 | 0 nodes, 200.00 | plain decoding | 200.00 | 1.000x |" in report


def test_the_console_reporter_stops_its_display_when_a_stage_fails():
    from entmtp.cli._progress import ConsoleReporter

    console = Console(file=io.StringIO(), force_terminal=True)
    for begin in (Event("profile", "begin", "profiling", total=3),
                  Event("search", "begin", "searching")):
        stdout = sys.stdout
        with pytest.raises(RuntimeError), ConsoleReporter(console) as reporter:
            reporter(begin)
            assert sys.stdout is not stdout  # a live bar or spinner redirects it
            raise RuntimeError("the stage failed")
        assert sys.stdout is stdout  # stopped: the terminal is the caller's again


# -- the library stands without the CLI ------------------------------------------------------
def test_importing_the_pipeline_imports_neither_the_cli_nor_torch():
    code = ("import sys\n"
            "from entmtp.calibrate import CalibrateArguments, RunDir, calibrate, demo_run, "
            "retarget_run, search_stage\n"
            "from entmtp.evaluation import measure_latency\n"
            "from entmtp.model import load_model_and_heads\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'typer', 'rich') or m.startswith('entmtp.cli')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def test_no_library_module_imports_the_cli():
    package = Path(entmtp.calibrate.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else [
                    "." * node.level + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(("entmtp.cli", "..cli")), f"{path.name} imports {name}"


def test_every_exported_name_resolves():
    for name in entmtp.calibrate.__all__:
        assert getattr(entmtp.calibrate, name) is not None, name


def test_the_latency_stage_times_every_batch_size_and_reuses_only_the_same_sizes(tmp_path,
                                                                                 monkeypatch):
    """--batch-sizes: one profile per size into one file with the batch axis; a run's file
    with the same sizes is reused, one with other sizes is measured again."""
    import entmtp.evaluation as evaluation
    from entmtp.calibrate._pipeline import latency_stage
    from entmtp.treesearch import BatchLatency

    sizes = []

    def profile(model, heads, **options):
        sizes.append(options["batch_size"])
        return _per_node(0.5 * options["batch_size"])

    monkeypatch.setattr(evaluation, "profile_latency", profile)

    class Param:
        device = "cpu"

    class Base:
        model = type("M", (), {"parameters": lambda self: iter([Param()]), "dtype": "float32"})()

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    latency_stage(run, latency_file=None, loader=lambda: (Base(), None), batch_sizes=(4, 1, 2))
    assert sizes == [1, 2, 4]
    assert BatchLatency.load(run.latency).batch_sizes == (1, 2, 4)
    latency_stage(run, latency_file=None, loader=lambda: (Base(), None), batch_sizes=(1, 2, 4))
    assert sizes == [1, 2, 4]  # reused
    latency_stage(run, latency_file=None, loader=lambda: (Base(), None), batch_sizes=(1,))
    assert sizes == [1, 2, 4, 1]
    assert not BatchLatency.load(run.latency).batched


def test_calibrate_refuses_batch_sizes_with_a_latency_file(inputs, tmp_path):
    from entmtp.core import EntmtpError

    with pytest.raises(EntmtpError, match="--batch-sizes .* --latency"):
        calibrate(_arguments(inputs, tmp_path / "run", batch_sizes=(1, 2)))
