"""`entmtp latency`, `entmtp retarget` and `entmtp plot-latency` through Typer's CliRunner."""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from entmtp.cli import (  # importing registers the commands on `app`
    _latency_cmd,
)
from entmtp.cli.app import app
from entmtp.core import cpu_name, hardware_slug
from entmtp.treesearch import LatencyModel, Profile, Schedule, load_bundle, replay

runner = CliRunner()
NODE_COUNTS = (0, 1, 3, 7)


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("entmtp: error:"), result.output
    return lines[0]


def _quick_latency_args(out) -> list[str]:
    return ["latency", "--node-counts", ",".join(map(str, NODE_COUNTS)), "--depths", "1,2",
            "--context-lengths", "8,16", "--repeats", "1", "--warmup", "0", "--out", str(out)]


# -- entmtp latency ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def profiler():
    # evaluation/_latency_profile.py is written alongside this command; skip until it exists.
    return pytest.importorskip("entmtp.evaluation._latency_profile")


@pytest.fixture(scope="module")
def random_latency(profiler, tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("latency")
    out, plot = folder / "latency.json", folder / "latency.png"
    result = runner.invoke(app, [*_quick_latency_args(out), "--model", str(tiny_model_dir),
                                 "--random-weights", "--head-type", "hydra", "--num-heads", "3",
                                 "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    return out, plot


def test_random_weights_latency_is_a_valid_model(random_latency, tiny_model_dir):
    import torch

    out, _ = random_latency
    assert json.loads(out.read_text())["format"] == "entmtp-latency"
    model = LatencyModel.load(out)
    assert model.nodes == NODE_COUNTS
    assert {n for n, _, _ in model.measurements} == set(NODE_COUNTS)
    hw = model.hardware
    assert hw["device"] == "cpu" and hw["device_name"] == cpu_name()
    assert hw["dtype"] == "float32" and hw["torch"] == torch.__version__
    assert hw["model"] == tiny_model_dir.resolve().name
    assert hw["random_weights"] is True
    # a Llama: the static engine's steps were timed (no graphs on the CPU)
    assert hw["engine"] == "static" and hw["graphs"] is False
    assert "static-shape runtime" in hw["runtime_note"]
    assert (hw["head_type"], hw["num_heads"]) == ("hydra", 3)
    assert hw["draft_vocab_size"] == 128  # random heads draft over the whole vocabulary
    assert isinstance(hw["cpu_count"], int) and hw["cpu_count"] >= 1


def test_latency_times_random_heads_over_a_draft_vocabulary(profiler, tiny_model_dir, tmp_path,
                                                           monkeypatch):
    """--draft-vocab-size gives the random heads that many tokens: the timed steps draft over
    them (every draft projection reads that many rows) and the file says so."""
    import torch

    import entmtp.evaluation._latency_profile as latency_profile

    seen = []
    real = latency_profile.profile_latency

    def spying(model, heads, **options):
        seen.append((heads.draft_vocab_size, heads.head_logits(
            1, torch.zeros(1, heads.hidden_size), torch.zeros(1, 1, dtype=torch.long)).shape))
        return real(model, heads, **options)

    monkeypatch.setattr(latency_profile, "profile_latency", spying)
    out = tmp_path / "subset.json"
    result = runner.invoke(app, [*_quick_latency_args(out), "--model", str(tiny_model_dir),
                                 "--random-weights", "--head-type", "hydra", "--num-heads", "2",
                                 "--draft-vocab-size", "96"])
    assert result.exit_code == 0, result.output
    assert seen == [(96, (1, 96))]
    assert LatencyModel.load(out).hardware["draft_vocab_size"] == 96


def test_latency_engine_eager_times_the_eager_steps(profiler, tiny_model_dir, tmp_path):
    out = tmp_path / "eager.json"
    result = runner.invoke(app, [*_quick_latency_args(out), "--model", str(tiny_model_dir),
                                 "--random-weights", "--head-type", "medusa", "--num-heads", "2",
                                 "--engine", "eager", "--no-graphs"])
    assert result.exit_code == 0, result.output
    hw = LatencyModel.load(out).hardware
    assert hw["engine"] == "eager" and hw["graphs"] is False
    assert "eager runtime" in hw["runtime_note"] and "eager runtime" in result.output


def test_latency_batch_sizes_time_each_size_into_one_file(profiler, tiny_model_dir, tmp_path,
                                                          monkeypatch):
    """--batch-sizes times the static engine's steps of each size (rows = the size) into one
    file with the batch axis, which `LatencyModel.load` reads as its smallest size; the eager
    runtime refuses batches in one line and writes nothing."""
    import entmtp.evaluation._latency_profile as latency_profile
    from entmtp.treesearch import BatchLatency

    sizes = []
    real = latency_profile.profile_latency

    def spying(model, heads, **options):
        sizes.append(options["batch_size"])
        return real(model, heads, **options)

    monkeypatch.setattr(latency_profile, "profile_latency", spying)
    out, plot = tmp_path / "batched.json", tmp_path / "batched.png"
    args = [*_quick_latency_args(out), "--model", str(tiny_model_dir), "--random-weights",
            "--head-type", "medusa", "--num-heads", "2"]
    result = runner.invoke(app, [*args, "--batch-sizes", "4,1,2", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert sizes == [1, 2, 4]
    batched = BatchLatency.load(out)
    assert batched.batch_sizes == (1, 2, 4)
    assert [batched[b].hardware["batch_size"] for b in (1, 2, 4)] == [1, 2, 4]
    assert LatencyModel.load(out).hardware["batch_size"] == 1
    assert "batch 4: plain step" in result.output and plot.exists()
    refused = tmp_path / "eager.json"
    result = runner.invoke(app, [*_quick_latency_args(refused), "--model", str(tiny_model_dir),
                                 "--random-weights", "--engine", "eager", "--no-graphs",
                                 "--batch-sizes", "1,2"])
    assert "static runtime only" in _one_line_error(result) and not refused.exists()
    result = runner.invoke(app, [*args, "--batch-sizes", "0,2"])
    assert "--batch-sizes" in _one_line_error(result)


_MATMUL_LIKE = ("mm", "matmul", "linear", "scaled_dot_product")  # op names (aten, mkldnn)


@pytest.mark.parametrize("weights", ["random", "loaded"])
@pytest.mark.parametrize(("dtype", "torch_dtype"), [("bf16", torch.bfloat16),
                                                    ("fp16", torch.float16)])
def test_latency_times_the_model_and_heads_in_the_dtype_given(profiler, tiny_model_dir,
                                                              tiny_medusa_dir, tmp_path,
                                                              monkeypatch, weights, dtype,
                                                              torch_dtype):
    """--dtype is the precision the steps run in, not only what the file says: the model and
    heads the profiler gets hold that dtype, and every matrix product and attention of the
    timed steps (seen by a dispatch mode around each timing) computes in it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import entmtp.evaluation._latency_profile as latency_profile

    class ProductDtypes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[torch.dtype] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket)
            if any(part in name for part in _MATMUL_LIKE) and isinstance(out, torch.Tensor):
                self.seen.add(out.dtype)
            return out

    given, products, timings = [], ProductDtypes(), []
    real_profile, real_time = latency_profile.profile_latency, latency_profile._StepTimer.time

    def spying_profile(model, heads, **options):
        given.append(({p.dtype for p in model.parameters()}, {p.dtype for p in heads.parameters()}))
        return real_profile(model, heads, **options)

    def spying_time(timer, key):
        timings.append(key)
        with products:
            return real_time(timer, key)

    monkeypatch.setattr(latency_profile, "profile_latency", spying_profile)
    monkeypatch.setattr(latency_profile._StepTimer, "time", spying_time)
    out = tmp_path / "latency.json"
    source = (["--random-weights", "--head-type", "medusa", "--num-heads", "2"]
              if weights == "random" else ["--heads", str(tiny_medusa_dir)])
    result = runner.invoke(app, [*_quick_latency_args(out), "--model", str(tiny_model_dir),
                                 *source, "--dtype", dtype])
    assert result.exit_code == 0, result.output
    assert given == [({torch_dtype}, {torch_dtype})]
    assert timings and products.seen == {torch_dtype}
    name = str(torch_dtype).removeprefix("torch.")
    hw = LatencyModel.load(out).hardware
    assert hw["dtype"] == name and hw["random_weights"] is (weights == "random")
    assert f"({name})" in result.output


def test_latency_plot_is_written(random_latency):
    _, plot = random_latency
    width, height = _png_size(plot)
    assert width > 400 and height > 200


def test_real_weights_latency_and_calibrate_accepts_it(profiler, tiny_model_dir,
                                                       tiny_medusa_dir, tmp_path):
    import torch

    out = tmp_path / "real.json"
    threads_before = torch.get_num_threads()
    result = runner.invoke(app, [*_quick_latency_args(out), "--model", str(tiny_model_dir),
                                 "--heads", str(tiny_medusa_dir), "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == threads_before  # the caller's setting is restored
    measured = LatencyModel.load(out)
    assert measured.hardware["random_weights"] is False
    assert measured.hardware["torch_threads"] == 1
    assert measured.hardware["num_heads"] == 3  # the fixture's heads, not --num-heads
    # `entmtp calibrate --latency` copies a measured model into its run unchanged.
    from entmtp.calibrate import RunDir
    from entmtp.calibrate._pipeline import latency_stage

    run = RunDir(tmp_path / "run")
    latency_stage(run, latency_file=out, loader=lambda: pytest.fail("must not load a model"))
    assert LatencyModel.load(run.latency) == measured


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--dtype", "int8"], "--dtype"),
        (["--device", "tpu"], "--device"),
        (["--node-counts", "1,x"], "--node-counts"),
        (["--node-counts", "-1,2"], "--node-counts"),
        (["--repeats", "0"], "--repeats"),
        (["--threads", "0"], "--threads"),
        (["--max-seconds", "0"], "--max-seconds"),
        (["--max-seconds", "inf"], "--max-seconds"),
        (["--head-type", "eagle", "--random-weights"], "--head-type"),
        (["--engine", "fast", "--random-weights"], "--engine"),
        (["--random-weights", "--draft-vocab-size", "8"], "--draft-vocab-size must be in 64..128"),
        (["--random-weights", "--draft-vocab-size", "129"], "--draft-vocab-size must be in"),
    ],
)
def test_latency_bad_options_are_one_line_errors(profiler, tiny_model_dir, tmp_path, options,
                                                 needle):
    result = runner.invoke(app, [*_quick_latency_args(tmp_path / "x.json"), "--model",
                                 str(tiny_model_dir), *options])
    assert needle in _one_line_error(result)
    assert not (tmp_path / "x.json").exists()


def test_latency_max_seconds_cuts_rounds_and_says_so(profiler, tiny_model_dir, tmp_path):
    out = tmp_path / "cut.json"
    result = runner.invoke(app, [*_quick_latency_args(out), "--model", str(tiny_model_dir),
                                 "--random-weights", "--head-type", "medusa", "--num-heads", "2",
                                 "--repeats", "5", "--max-seconds", "0.001"])
    assert result.exit_code == 0, result.output
    measured = LatencyModel.load(out)
    assert measured.hardware["stopped_by_deadline"] is True
    assert measured.hardware["repeats"] == 2
    assert "--max-seconds: timed 2 round(s) per point" in " ".join(result.output.split())


def test_latency_on_missing_cuda_is_a_one_line_error(profiler, tiny_model_dir, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    result = runner.invoke(app, [*_quick_latency_args(tmp_path / "x.json"), "--model",
                                 str(tiny_model_dir), "--random-weights", "--device", "cuda",
                                 "--dtype", "bf16"])
    assert "cuda" in _one_line_error(result)


# -- entmtp retarget --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("retarget") / "demo"
    result = runner.invoke(app, ["demo", "--out", str(out), "--schedule-trials", "5"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def gpu_json(cpu_run):
    path = cpu_run.parent / "gpu-like.json"
    LatencyModel.gpu_like().save(path)
    return path


@pytest.fixture(scope="module")
def gpu_run(cpu_run, gpu_json):
    result = runner.invoke(app, ["retarget", str(cpu_run), "--latency", str(gpu_json)])
    assert result.exit_code == 0, result.output
    target = cpu_run.parent / f"{cpu_run.name}-{hardware_slug(LatencyModel.gpu_like().hardware)}"
    assert target.is_dir()
    return target


def test_retarget_searches_the_same_profile_under_the_new_latency(cpu_run, gpu_run):
    gpu = LatencyModel.load(gpu_run / "latency.json")
    assert gpu == LatencyModel.gpu_like()
    assert (gpu_run / "profile.npz").read_bytes() == (cpu_run / "profile.npz").read_bytes()
    before, after = load_bundle(cpu_run / "bundle.json"), load_bundle(gpu_run / "bundle.json")
    assert after.hardware == gpu.hardware != before.hardware
    assert (after.model, after.heads, after.task) == (before.model, before.heads, before.task)
    for tree, stats in zip(after.trees, after.tree_stats, strict=True):
        assert stats.latency_ms == pytest.approx(gpu.tree_ms(tree))
    # The prediction is the exact replay of the new schedule on the old profile, new latency.
    profile = Profile.load(gpu_run / "profile.npz")
    schedule = Schedule(tuple(after.trees), tuple(after.thresholds), after.entropy.estimator)
    assert replay(profile, schedule, gpu).tokens_per_second == \
        pytest.approx(after.predicted.tokens_per_second)
    old_schedule = Schedule(tuple(before.trees), tuple(before.thresholds),
                            before.entropy.estimator)
    assert after.predicted.tokens_per_second != pytest.approx(
        replay(profile, old_schedule, LatencyModel.cpu_like()).tokens_per_second)
    settings = json.loads((gpu_run / "front.json").read_text())["settings"]
    assert settings == json.loads((cpu_run / "front.json").read_text())["settings"]


def test_retarget_reuses_a_finished_run_and_redoes_a_changed_one(cpu_run, gpu_run, tmp_path):
    result = runner.invoke(app, ["retarget", str(cpu_run / "bundle.json"), "--latency",
                                 str(gpu_run / "latency.json"), "--out", str(gpu_run)])
    assert result.exit_code == 0, result.output
    assert "reusing" in result.output
    # The same folder under another latency model is searched again, never left stale.
    slower = LatencyModel.gpu_like(base_ms=40.0, flat_until=15)
    slower_path = tmp_path / "slower.json"
    slower.save(slower_path)
    copy = tmp_path / "copy"
    shutil.copytree(gpu_run, copy)
    result = runner.invoke(app, ["retarget", str(cpu_run), "--latency", str(slower_path),
                                 "--out", str(copy)])
    assert result.exit_code == 0, result.output
    assert "reusing" not in result.output
    bundle = load_bundle(copy / "bundle.json")
    for tree, stats in zip(bundle.trees, bundle.tree_stats, strict=True):
        assert stats.latency_ms == pytest.approx(slower.tree_ms(tree))


def test_retarget_of_a_bare_bundle_is_a_one_line_error(cpu_run, gpu_json, tmp_path):
    shutil.copy(cpu_run / "bundle.json", tmp_path / "bundle.json")
    result = runner.invoke(app, ["retarget", str(tmp_path / "bundle.json"), "--latency",
                                 str(gpu_json)])
    assert "bare bundle" in _one_line_error(result)


@pytest.mark.parametrize("content", ["not json", '{"format": "entmtp-bundle"}', '{"nodes": [0]}'])
def test_retarget_with_a_bad_latency_file_is_a_one_line_error(cpu_run, tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = runner.invoke(app, ["retarget", str(cpu_run), "--latency", str(bad), "--out",
                                 str(tmp_path / "out")])
    assert "latency" in _one_line_error(result)
    assert not (tmp_path / "out" / "bundle.json").exists()


def test_retarget_into_the_source_run_is_refused(cpu_run, gpu_json):
    result = runner.invoke(app, ["retarget", str(cpu_run), "--latency", str(gpu_json), "--out",
                                 str(cpu_run)])
    assert "source run" in _one_line_error(result)


def test_retarget_max_nodes_bounds_the_new_search(cpu_run, gpu_json, tmp_path):
    source_settings = json.loads((cpu_run / "front.json").read_text())["settings"]
    small = source_settings["max_nodes"] // 4
    out = tmp_path / "small"
    result = runner.invoke(app, ["retarget", str(cpu_run), "--latency", str(gpu_json), "--out",
                                 str(out), "--max-nodes", str(small)])
    assert result.exit_code == 0, result.output
    front = json.loads((out / "front.json").read_text())
    assert front["settings"] == {**source_settings, "max_nodes": small}
    bundle = load_bundle(out / "bundle.json")
    # The flat synthetic GPU curve pays for the largest tree allowed: the bound is what binds.
    assert max(tree.num_nodes for tree in bundle.trees) == small


def test_retarget_max_nodes_below_one_is_a_one_line_error(cpu_run, gpu_json, tmp_path):
    result = runner.invoke(app, ["retarget", str(cpu_run), "--latency", str(gpu_json), "--out",
                                 str(tmp_path / "out"), "--max-nodes", "0"])
    assert "--max-nodes" in _one_line_error(result)
    assert not (tmp_path / "out").exists()


def test_plot_latency_draws_one_curve_per_file_even_with_equal_labels(tmp_path, monkeypatch):

    drawn = {}
    monkeypatch.setattr(_latency_cmd, "plot_latency_curves",
                        lambda models, path, **options: drawn.update(models))
    medusa, hydra, copy = (tmp_path / name for name in ("m.json", "h.json", "copy.json"))
    cpu = LatencyModel.cpu_like()
    for path, head_type in ((medusa, "medusa"), (hydra, "hydra"), (copy, "hydra")):
        replace(cpu, hardware={**cpu.hardware, "kind": "measured", "device_name": "CPU X",
                               "head_type": head_type}).save(path)
    result = runner.invoke(app, ["plot-latency", str(medusa), str(hydra), str(copy), "--out",
                                 str(tmp_path / "x.png")])
    assert result.exit_code == 0, result.output
    assert len(drawn) == 3
    assert any("medusa heads" in label for label in drawn)
    assert any("copy.json" in label for label in drawn), list(drawn)


def _cpu_file(path, name: str, signature: str | None, **hardware):
    cpu = LatencyModel.cpu_like()
    record = {"kind": "measured", "device": "cpu", "device_name": name, "dtype": "float32",
              "torch_threads": 2, "model": "M", "head_type": "hydra", **hardware}
    if signature is not None:
        record["cpu_signature"] = signature
    replace(cpu, hardware=record).save(path)
    return path


def test_plot_latency_tells_cpus_of_one_name_apart_and_titles_what_they_share(tmp_path,
                                                                             monkeypatch):
    drawn = {}
    monkeypatch.setattr(_latency_cmd, "plot_latency_curves",
                        lambda models, path, **options: drawn.update(models=models, **options))
    zen5 = _cpu_file(tmp_path / "a.json", "AMD EPYC", "AuthenticAMD family 26 model 2 stepping 1")
    zen4 = _cpu_file(tmp_path / "b.json", "AMD EPYC", "AuthenticAMD family 25 model 17 stepping 1")
    xeon = _cpu_file(tmp_path / "c.json", "Intel Xeon", "GenuineIntel family 6 model 167")
    result = runner.invoke(app, ["plot-latency", str(zen5), str(zen4), str(xeon), "--out",
                                 str(tmp_path / "x.png")])
    assert result.exit_code == 0, result.output
    labels = list(drawn["models"])
    assert labels == ["AMD EPYC (family 26 model 2)", "AMD EPYC (family 25 model 17)",
                      "Intel Xeon"]
    assert drawn["title"].endswith("float32, 2 threads, M, hydra heads")


def test_plot_latency_names_the_files_of_cpus_it_cannot_tell_apart(tmp_path):
    from entmtp.cli._latency_cmd import distinct_labels

    one = LatencyModel.load(_cpu_file(tmp_path / "one.json", "AMD EPYC", None))
    other = LatencyModel.load(_cpu_file(tmp_path / "other.json", "AMD EPYC", None, dtype="bf16"))
    labels, shared = distinct_labels([("one.json", one), ("two.json", one)])
    assert labels == ["AMD EPYC (one.json)", "AMD EPYC (two.json)"]
    assert shared == "float32, 2 threads, M, hydra heads"
    labels, _ = distinct_labels([("one.json", one), ("one.json", one)])  # one file twice
    assert labels[0] != labels[1]
    labels, shared = distinct_labels([("one.json", one), ("other.json", other)])
    assert labels == ["AMD EPYC, float32", "AMD EPYC, bf16"] and "float32" not in shared


def test_plot_latency_puts_the_legend_outside_both_panels(tmp_path, monkeypatch):
    from entmtp.cli import _plots

    figures = []
    monkeypatch.setattr(_plots, "_save", lambda fig, path: figures.append(fig))
    zen5 = _cpu_file(tmp_path / "a.json", "AMD EPYC", "AuthenticAMD family 26 model 2 stepping 1")
    _latency_cmd.plot_latency_curves({"a": LatencyModel.load(zen5),
                                      "b": LatencyModel.gpu_like()}, tmp_path / "x.png")
    (fig,) = figures
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b (synthetic, not measured)"]
    for ax in fig.axes:
        assert ax.get_legend() is None
        assert not box.overlaps(ax.get_tightbbox(renderer))  # no curve, tick or axis label


def test_plot_latency_labels_synthetic_curves(tmp_path):
    cpu = tmp_path / "cpu.json"
    LatencyModel.cpu_like().save(cpu)
    out = tmp_path / "curves.png"
    result = runner.invoke(app, ["plot-latency", str(cpu), "--synthetic-gpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _png_size(out)[0] > 400
    from entmtp.cli._latency_cmd import default_label

    assert "synthetic" in default_label(LatencyModel.gpu_like(), "x")


# -- the checks: warnings on stderr, --strict refuses -------------------------------------------
def _cheap_fused(monkeypatch):
    """Every step 10 ms (+1 per node) except fused empty steps at 3 ms: a model that keeps
    failing its fused-vs-plain check."""
    from entmtp.evaluation import _latency_profile

    def time(timer, key):
        step, index, _ = key
        if step == "tree":
            return 10.0 + timer.trees[index].num_nodes + 0.01 * len(timer.keys)
        return {"autoregressive": 9.9, "prepare": 1.0, "fused_empty": 3.0}[step]

    monkeypatch.setattr(_latency_profile._StepTimer, "time", time)


def _latency_args(out, tiny_model_dir) -> list[str]:
    return [*_quick_latency_args(out), "--model", str(tiny_model_dir), "--random-weights",
            "--head-type", "medusa", "--num-heads", "2", "--remeasure", "1", "--repeats", "4"]


def test_latency_writes_a_failing_model_with_its_warning(profiler, tiny_model_dir, tmp_path,
                                                        monkeypatch):
    _cheap_fused(monkeypatch)
    out = tmp_path / "latency.json"
    result = runner.invoke(app, _latency_args(out, tiny_model_dir))
    assert result.exit_code == 0, result.output
    warnings = json.loads(out.read_text())["warnings"]
    assert any("fused empty step" in w for w in warnings)
    assert "entmtp: warning: latency measurement: fused empty step" in result.stderr
    assert "entmtp latency" in result.stderr  # says what to do
    assert LatencyModel.load(out).hardware["remeasure_passes"] == 1


def test_latency_strict_refuses_a_failing_model(profiler, tiny_model_dir, tmp_path, monkeypatch):
    _cheap_fused(monkeypatch)
    out = tmp_path / "latency.json"
    result = runner.invoke(app, [*_latency_args(out, tiny_model_dir), "--strict"])
    line = _one_line_error(result)
    assert "--strict" in line and "fused empty step" in line
    assert not out.exists()


def test_calibrate_latency_stage_strict_refuses_a_failing_file(tmp_path):
    from entmtp.calibrate import RunDir
    from entmtp.calibrate._pipeline import latency_stage
    from entmtp.core import EntmtpError

    bad = replace(LatencyModel.cpu_like(), fused_empty_ms=10.0, hardware={"kind": "measured"})
    source = bad.save(tmp_path / "bad.json")
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    with pytest.raises(EntmtpError, match="--strict"):
        latency_stage(run, latency_file=source, loader=None, strict=True)
    assert not run.latency.exists()
    latency_stage(run, latency_file=source, loader=None, strict=False)
    assert LatencyModel.load(run.latency).warnings == bad.warnings != []


# -- make demo on a busy machine ----------------------------------------------------------------
@pytest.fixture
def busy_machine(profiler, monkeypatch):
    """Every timed latency step takes a random 5-200 ms (a CPU hog's doing), and the run's
    latency stage measures a few small trees at short contexts (the tiny model's limits)."""
    import functools

    import numpy as np

    rng = np.random.default_rng(0)
    monkeypatch.setattr(profiler._StepTimer, "time", lambda timer, key: rng.uniform(5, 200))
    monkeypatch.setattr(profiler, "profile_latency", functools.partial(
        profiler.profile_latency, node_counts=(0, 1, 3), context_lengths=(16, 32), repeats=4,
        warmup=0, topk=3))


def _calibrate_args(tiny_model_dir, tmp_path, out) -> list[str]:
    from support import make_tiny_heads_dir

    heads = make_tiny_heads_dir(tiny_model_dir, tmp_path / "heads")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in
                            enumerate(["def f(x):", "Once upon", "import os", "x = [1, 2]"])))
    return ["calibrate", "--model", str(tiny_model_dir), "--heads", str(heads), "--data",
            str(data), "--split", "all", "--prompts", "4", "--max-new-tokens", "12",
            "--schedule-trials", "6", "--validation-folds", "0", "--out", str(out)]


def test_calibrate_on_a_busy_machine_says_the_measurement_was_too_noisy(
        busy_machine, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, _calibrate_args(tiny_model_dir, tmp_path, out))
    assert result.exit_code == 0, result.output
    assert "entmtp: warning: latency measurement: too noisy" in result.stderr
    latency = LatencyModel.load(out / "latency.json")
    assert latency.warnings[0].startswith("too noisy")
    assert latency.hardware["remeasure_passes"] == 2
    report = (out / "report.md").read_text()
    assert "fails its checks" in report and "too noisy" in report
    bundle = load_bundle(out / "bundle.json")
    assert bundle.latency.warnings == latency.warnings  # the bundle carries them too
    # no switching schedule rides on that noise
    assert len(bundle.trees) == 1


def test_calibrate_strict_refuses_a_too_noisy_measurement(busy_machine, tiny_model_dir,
                                                          tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, [*_calibrate_args(tiny_model_dir, tmp_path, out), "--strict"])
    assert result.exit_code == 2, result.output
    (line,) = [li for li in result.stderr.splitlines() if li.strip()]
    assert line.startswith("entmtp: error:") and "--strict" in line
    assert "too noisy" in line and "entmtp latency" in line
    assert not (out / "latency.json").exists() and not (out / "bundle.json").exists()


def test_latency_prints_and_writes_the_padded_widths(profiler, tiny_model_dir, tmp_path,
                                                     monkeypatch):
    """A 1-node step dearer than a 3-node one (a kernel's row alignment): the file pads 1-2
    nodes to 3 and the command says so."""
    from entmtp.evaluation import _latency_profile

    def time(timer, key):
        step, index, _ = key
        if step in ("tree", "padded"):
            nodes = timer.trees[index].num_nodes
            return 30.0 if step == "tree" and nodes == 1 else 10.0 + nodes
        return {"autoregressive": 9.9, "prepare": 1.0, "fused_empty": 10.5}[step]

    monkeypatch.setattr(_latency_profile._StepTimer, "time", time)
    out = tmp_path / "latency.json"
    result = runner.invoke(app, _latency_args(out, tiny_model_dir))
    assert result.exit_code == 0, result.output
    assert "padded widths: 1-2->3 nodes" in result.output
    assert json.loads(out.read_text())["padded_nodes"] == {"1": 3, "2": 3}
    assert LatencyModel.load(out).step_ms(1, 1) == LatencyModel.load(out).step_ms(3, 1)


def test_retarget_to_a_latency_file_of_another_draft_vocabulary_warns_in_the_report(cpu_run,
                                                                                     tmp_path):
    """A latency file timed with heads drafting over another number of tokens than the profiled
    heads misprices drafting: retarget says so on stderr and in report.md's latency section."""
    source = tmp_path / "source"
    shutil.copytree(cpu_run, source)
    profile = Profile.load(source / "profile.npz")
    profile.meta.vocab_size = 128
    profile.meta.extra = {**profile.meta.extra, "draft_vocab_size": 96}
    profile.save(source / "profile.npz")
    measured = LatencyModel.cpu_like()
    timed = replace(measured, hardware={**measured.hardware, "kind": "measured",
                                        "draft_vocab_size": 128})
    timed.save(tmp_path / "timed.json")
    result = runner.invoke(app, ["retarget", str(source), "--latency", str(tmp_path / "timed.json"),
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    needle = "timed drafting over 128 tokens but the profiled heads draft over 96"
    assert needle in result.output
    report = (tmp_path / "out" / "report.md").read_text()
    section = report[report.index("## Latency model noise"):]
    assert f"**Warning:** {tmp_path / 'out' / 'latency.json'} {needle}" in section
    matching = replace(timed, hardware={**timed.hardware, "draft_vocab_size": 96})
    matching.save(tmp_path / "matching.json")
    result = runner.invoke(app, ["retarget", str(source), "--latency",
                                 str(tmp_path / "matching.json"), "--out", str(tmp_path / "ok")])
    assert result.exit_code == 0 and "timed drafting" not in result.output
    assert "**Warning:**" not in (tmp_path / "ok" / "report.md").read_text()


def test_retarget_to_a_latency_file_of_another_linear_kernel_warns(cpu_run, tmp_path):
    """A CPU latency file timed with another linear kernel than this version's prices every
    tree wrong: retarget says so on stderr and in report.md; GPU files and matching ones pass."""
    from entmtp.model import row_kernel

    used = row_kernel(torch.empty(0, 0))
    measured = LatencyModel.cpu_like()
    cases = {"old": {"device": "cpu", "linear_kernel": "few-row" if used != "few-row"
                     else "onednn-packed"},
             "unnamed": {"device": "cpu"},
             "same": {"device": "cpu", "linear_kernel": used},
             "gpu": {"device": "cuda", "linear_kernel": "torch"},
             "bf16": {"device": "cpu", "dtype": "bfloat16",
                      "linear_kernel": row_kernel(torch.empty(0, 0, dtype=torch.bfloat16))}}
    for name, fields in cases.items():
        timed = replace(measured, hardware={**measured.hardware, "kind": "measured", **fields})
        timed.save(tmp_path / f"{name}.json")
        result = runner.invoke(app, ["retarget", str(cpu_run), "--latency",
                                     str(tmp_path / f"{name}.json"), "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        warned = "timed this CPU's linear layers with the" in result.output
        report = (tmp_path / name / "report.md").read_text()
        assert warned == (name in ("old", "unnamed")) == ("**Warning:**" in report), name
        if warned:
            timed_kernel = fields.get("linear_kernel", "torch")
            assert f"with the {timed_kernel!r} kernel but entmtp now computes them with {used!r}" \
                in result.output


@pytest.mark.parametrize("existing", [False, True])
def test_retarget_of_a_damaged_profile_names_it_and_leaves_out_alone(cpu_run, gpu_run, gpu_json,
                                                                     tmp_path, existing):
    """The source profile is checked before --out is touched: an earlier output keeps its
    files, byte for byte, and a new folder is not made; the error names the source's file."""
    source = tmp_path / "source"
    shutil.copytree(cpu_run, source)
    data = (source / "profile.npz").read_bytes()
    (source / "profile.npz").write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    if existing:
        shutil.copytree(gpu_run, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()} if existing else None
    result = runner.invoke(app, ["retarget", str(source), "--latency", str(gpu_json), "--out",
                                 str(out)])
    message = _one_line_error(result)
    assert str(source / "profile.npz") in message and str(out) not in message
    if existing:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert not out.exists()


# -- entmtp latency --import and the batch axis in plot-latency --------------------------------
STEP_TIMES = {  # (batch size, nodes, context) -> repeated step times, ms
    (1, 0, 128): [10.0, 12.0], (1, 0, 512): [14.0],
    (1, 3, 128): [13.0], (1, 3, 512): [15.0, 17.0, 19.5],  # mean 17.17, median 17
    (1, 7, 128): [18.0], (1, 7, 512): [20.0],
    (8, 0, 128): [20.0], (8, 0, 512): [22.0],
    (8, 3, 128): [30.0, 31.0], (8, 3, 512): [33.0],
    (32, 0, 128): [50.0], (32, 0, 512): [56.0],
    (32, 7, 128): [120.0], (32, 7, 512): [130.0],
}


def _step_time_csv(path, times=STEP_TIMES, header="batch_size,nodes,context,ms"):
    lines = [header] + [f"{b},{n},{c},{ms}" for (b, n, c), repeats in times.items()
                        for ms in repeats]
    path.write_text("\n".join(lines) + "\n")
    return path


def _import(tmp_path, csv, *extra):
    return runner.invoke(app, ["latency", "--import", str(csv), "--out",
                               str(tmp_path / "imported.json"), *extra])


def test_latency_import_writes_the_csv_means_per_batch_size(tmp_path):
    from entmtp.treesearch._batch_latency import BatchLatency

    csv = _step_time_csv(tmp_path / "vllm.csv")
    result = _import(tmp_path, csv, "--device-name", "H100, vLLM")
    assert result.exit_code == 0, result.output
    assert "batch 8: plain step 21.00 ms" in result.output
    latency = BatchLatency.load(tmp_path / "imported.json")
    assert latency.batch_sizes == (1, 8, 32)
    for size, model in latency.items():
        contexts = sorted({c for b, _, c in STEP_TIMES if b == size})
        for nodes in {n for b, n, _ in STEP_TIMES if b == size}:
            means = [sum(STEP_TIMES[size, nodes, c]) / len(STEP_TIMES[size, nodes, c])
                     for c in contexts]
            assert model.step_ms(nodes, 2) == pytest.approx(sum(means) / len(means))
        plain = [sum(STEP_TIMES[size, 0, c]) / len(STEP_TIMES[size, 0, c]) for c in contexts]
        assert model.autoregressive_ms == pytest.approx(sum(plain) / len(plain))
        assert model.hardware["kind"] == "imported"
        assert model.hardware["source"] == str(csv)
        assert model.hardware["device_name"] == "H100, vLLM"
    # a one-model reader (calibrate --latency, retarget) takes the batch-1 model
    assert LatencyModel.load(tmp_path / "imported.json") == latency[1]


def test_latency_import_takes_a_chain_draft_length_column(tmp_path):
    from entmtp.treesearch._batch_latency import BatchLatency

    csv = _step_time_csv(tmp_path / "trtllm.csv", header="batch,draft_len,context_len,step_ms")
    result = _import(tmp_path, csv)
    assert result.exit_code == 0, result.output
    latency = BatchLatency.load(tmp_path / "imported.json")
    assert latency[32].step_ms(7, 7) == pytest.approx(125.0)
    assert latency[32].hardware["node_column"] == "draft_len"


def _without(key):
    return {k: v for k, v in STEP_TIMES.items() if k != key}


BAD_STEP_TIMES = {
    "missing column": ("batch_size,nodes,ms\n1,0,10\n", "no context column"),
    "non-number": ("batch_size,nodes,context,ms\n1,0,128,fast\n", "line 2: ms 'fast'"),
    "negative ms": ("batch_size,nodes,context,ms\n1,0,128,10\n1,3,128,-12\n",
                    "line 3: ms -12 is negative"),
    "no plain step": (_without((8, 0, 128)) | {(8, 0, 512): []}, "batch size 8 has no plain"),
    "other contexts": (_without((8, 3, 512)), "batch size 8, nodes 3: timed at contexts 128"),
    "short line": ("batch_size,nodes,context,ms\n1,0,128\n", "line 2: 3 values"),
    "fractional batch": ("batch_size,nodes,context,ms\n1.5,0,128,10\n", "line 2: batch_size"),
    "header only": ("batch_size,nodes,context,ms\n", "a header and no measured step"),
    "empty": ("", "no lines"),
}


@pytest.mark.parametrize("case", list(BAD_STEP_TIMES))
def test_latency_import_of_a_bad_csv_is_one_line_and_writes_nothing(tmp_path, case):
    content, mention = BAD_STEP_TIMES[case]
    csv = tmp_path / "steps.csv"
    if isinstance(content, dict):
        _step_time_csv(csv, content)
    else:
        csv.write_text(content)
    result = _import(tmp_path, csv, "--plot", str(tmp_path / "curves.png"))
    message = _one_line_error(result)
    assert mention in message and str(csv) in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.csv"]


@pytest.mark.parametrize("options", [["--node-counts", "0,1"], ["--random-weights"],
                                     ["--model", "x"], ["--repeats", "4"]])
def test_latency_import_with_a_timing_option_is_one_line(tmp_path, options):
    csv = _step_time_csv(tmp_path / "steps.csv")
    message = _one_line_error(_import(tmp_path, csv, *options))
    assert "--import" in message and options[0] in message
    assert not (tmp_path / "imported.json").exists()


def test_latency_import_strict_refuses_failed_checks_and_writes_nothing(tmp_path):
    csv = _step_time_csv(tmp_path / "steps.csv")  # one line per point: no spread measured
    result = _import(tmp_path, csv)
    assert result.exit_code == 0 and "only 1 round(s) per point" in result.output
    (tmp_path / "imported.json").unlink()
    message = _one_line_error(_import(tmp_path, csv, "--strict"))
    assert "--strict" in message and "time the steps again in their runtime" in message
    assert not (tmp_path / "imported.json").exists()


def test_plot_latency_draws_one_curve_per_batch_size(tmp_path, monkeypatch):
    csv = _step_time_csv(tmp_path / "steps.csv")
    result = _import(tmp_path, csv, "--device-name", "GPU Y", "--plot",
                     str(tmp_path / "imported.png"))
    assert result.exit_code == 0, result.output
    assert _png_size(tmp_path / "imported.png")[0] > 400
    out = tmp_path / "batches.png"
    result = runner.invoke(app, ["plot-latency", str(tmp_path / "imported.json"), "--out",
                                 str(out)])
    assert result.exit_code == 0, result.output
    assert _png_size(out)[0] > 400
    drawn = {}
    monkeypatch.setattr(_latency_cmd, "plot_latency_curves",
                        lambda models, path, **options: drawn.update(models=models, **options))
    runner.invoke(app, ["plot-latency", str(tmp_path / "imported.json"), "--out", str(out)])
    assert list(drawn["models"]) == ["batch 1", "batch 8", "batch 32"]
    assert "GPU Y" in drawn["title"] and drawn["mark_nodes"] is None  # 7 nodes: no 63 mark
    cpu = tmp_path / "cpu.json"
    LatencyModel.cpu_like().save(cpu)
    runner.invoke(app, ["plot-latency", str(tmp_path / "imported.json"), str(cpu), "--out",
                        str(out)])
    assert list(drawn["models"])[:3] == ["GPU Y, batch 1", "GPU Y, batch 8", "GPU Y, batch 32"]
    assert len(drawn["models"]) == 4
