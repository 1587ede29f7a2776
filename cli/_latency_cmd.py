"""`entmtp latency`, `entmtp retarget` and `entmtp plot-latency`: latency models for other hardware.

Acceptance (the profile) does not depend on the hardware and verification latency does not
depend on the weights' values. So a target machine measures a latency model of the model's
architecture with random weights (``entmtp latency --random-weights``), and ``entmtp retarget``
re-runs only the search stage of an existing run on that latency model: a bundle for the target
hardware without profiling again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import typer
from rich.console import Console

from entmtp.calibrate import check_latency_model, retarget_run, source_run
from entmtp.core import (
    STATIC_ENGINE,
    SYNTHETIC_LABEL,
    EntmtpError,
    all_or_none,
    deadline_after,
    hardware_label,
)
from entmtp.evaluation import measure_batch_latency, measure_latency
from entmtp.treesearch import (
    MAX_BATCH_SIZE,
    MAX_TREE_NODES,
    BatchLatency,
    LatencyModel,
    import_step_times,
    load_bundle,
)

from ._errors import user_errors
from ._model_setup import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    ENGINE_OPTION,
    FORCE_OPTION,
    GRAPHS_OPTION,
    HEAD_TYPE_OPTION,
    MODEL_OPTION,
    SEED_OPTION,
    STRICT_OPTION,
    check_engine,
    check_outputs,
)
from ._plots import check_plots
from ._progress import ConsoleReporter, warn
from ._typer_app import app

MEDUSA_TREE_NODES = 63  # the tree of the Medusa paper, marked on latency plots
# The fix for an imported file's failed checks: its times come from its own runtime.
IMPORT_HINT = ("the step times are the CSV's: time the steps again in their runtime, on a quiet "
               "machine, with each measurement's repeats as lines of their own (4 or more give "
               "a spread)")


# -- option parsing --------------------------------------------------------------------------
def parse_int_list(text: str | None, option: str, *, minimum: int = 0,
                   maximum: int | None = None) -> tuple[int, ...] | None:
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
    if maximum is not None and max(values) > maximum:
        raise EntmtpError(f"{option} {text!r}: give integers of at most {maximum}")
    return tuple(sorted(set(values)))


# -- labels ---------------------------------------------------------------------------------
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


def _label_parts(model: LatencyModel) -> list[str]:
    """``default_label``'s pieces: machine, dtype, threads, model, heads (those recorded)."""
    hw = model.hardware
    if _is_synthetic(model):
        return [hardware_label(hw, "")]
    parts = [str(hw.get("device_name") or "unnamed hardware")]
    if hw.get("dtype"):
        parts.append(str(hw["dtype"]))
    if hw.get("device") == "cpu" and hw.get("torch_threads"):
        threads = hw["torch_threads"]
        parts.append(f"{threads} thread{'s' if threads != 1 else ''}")
    if hw.get("model"):
        parts.append(str(hw["model"]))
    if hw.get("head_type"):
        parts.append(f"{hw['head_type']} heads")
    return parts


def _cpu_model(hw: Mapping) -> str | None:
    """``family 25 model 17`` of an x86 signature (the part that tells CPUs of one marketing
    name apart), else the whole signature."""
    signature = hw.get("cpu_signature")
    if not signature:
        return None
    words = str(signature).split()
    if "family" in words and "model" in words:
        start = words.index("family")
        return " ".join(words[start:words.index("model") + 2])
    return str(signature)


def distinct_labels(entries: list[tuple[str, LatencyModel]]) -> tuple[list[str], str]:
    """A legend label per (file name, model), and the words every label shared (dropped from
    the labels, for the title). Two machines of one name (``AMD EPYC`` names several CPU
    generations) are told apart by their CPU's family and model, and files that still read
    the same by their names."""
    parts = [_label_parts(model) for _, model in entries]
    names = [p[0] for p in parts]
    for i, (_, model) in enumerate(entries):
        same = [j for j, name in enumerate(names) if name == names[i]]
        cpus = {_cpu_model(entries[j][1].hardware) for j in same}
        if len(same) > 1 and len(cpus) > 1 and _cpu_model(model.hardware):
            parts[i][0] = f"{names[i]} ({_cpu_model(model.hardware)})"
    shared: list[str] = []
    if len(entries) > 1:
        for piece in parts[0][1:]:
            if all(piece in p[1:] for p in parts):
                shared.append(piece)
    labels = [", ".join(piece for piece in p if piece not in shared) for p in parts]
    same = [labels.count(label) > 1 for label in labels]
    labels = [f"{label} ({file_name})" if again and file_name else label
              for label, again, (file_name, _) in zip(labels, same, entries, strict=True)]
    repeated = [labels.count(label) > 1 for label in labels]  # the same file twice
    labels = [f"{label} #{labels[:i].count(label) + 1}" if again else label
              for i, (label, again) in enumerate(zip(labels, repeated, strict=True))]
    return labels, ", ".join(shared)


# -- the checks -------------------------------------------------------------------------------
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
    mark_nodes: int | None = MEDUSA_TREE_NODES,
) -> Path:
    """Step time vs tree size for several latency models in one figure.

    Left: ms per step (log scale, so a 20 ms GPU and a 500 ms CPU share an axis); right: the
    same divided by the step without a tree, which shows the shape that decides how large a tree
    pays. Synthetic models are labelled as such. ``mark_nodes`` draws Medusa's 63-node tree
    (None: no mark, and the axis ends at the largest measured tree).
    """
    import numpy as np
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    from ._plots import _pyplot, _save

    if not models:
        raise EntmtpError("no latency models to plot")
    plt = _pyplot()
    fig, (absolute, relative) = plt.subplots(1, 2, figsize=(12, 4.8))
    measured = [m for m in models.values() if not _is_synthetic(m)] or list(models.values())
    top = max(max(model.nodes[-1] for model in measured),
              mark_nodes + 1 if mark_nodes is not None else 0)
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
        if mark_nodes is not None:
            ax.axvline(mark_nodes, color="0.5", linestyle=":", linewidth=1)
        ax.set_xlabel("draft tree nodes (tokens verified = nodes + 1)")
        ax.grid(alpha=0.3)
    if mark_nodes is not None:
        low, high = absolute.get_xlim()
        near_right = mark_nodes > low + 0.75 * (high - low)  # the text goes where there is room
        absolute.text(mark_nodes, absolute.get_ylim()[1],
                      f"{mark_nodes}-node tree " if near_right else f" {mark_nodes}-node tree",
                      fontsize=7, va="top", ha="right" if near_right else "left", color="0.4")
    for ax in (absolute, relative):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # node counts are whole
    absolute.set_yscale("log")
    absolute.yaxis.set_major_formatter(ScalarFormatter())  # "20" rather than "2 x 10^1"
    absolute.yaxis.set_minor_formatter(ScalarFormatter())
    absolute.set_ylabel("ms per draft + verify step (depth term excluded)")
    relative.set_ylabel("step time / step time without a tree")
    # one legend for both panels, under them: it covers no curve and no axis label
    handles, labels = absolute.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), frameon=False,
               fontsize=8, ncol=2 if len(labels) > 3 and max(map(len, labels)) < 60 else 1)
    fig.suptitle(title or "Verification latency vs tree size")
    return _save(fig, path)


def batch_mark(models: Mapping[str, LatencyModel]) -> int | None:
    """The 63-node mark of a plot of batch curves: drawn where a curve reaches it (imported
    chains of a few tokens would otherwise sit in the axis's first tenth)."""
    reach = max(model.nodes[-1] for model in models.values())
    return MEDUSA_TREE_NODES if reach >= MEDUSA_TREE_NODES else None


def batch_curves(label: str, latency: BatchLatency, *, alone: bool) -> dict[str, LatencyModel]:
    """The curves of one file: its model under ``label`` (batch size 1 alone), else one per
    batch size, "batch 8" (``alone``: the only file drawn) or "LABEL, batch 8"."""
    if not latency.batched:
        return {label: latency[1]}
    return {(f"batch {size}" if alone else f"{label}, batch {size}"): model
            for size, model in latency.items()}


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
@app.command()
@user_errors
def latency(
    model: str | None = MODEL_OPTION,
    random_weights: bool = typer.Option(False, "--random-weights", help="Build the model from "
                                        "its config with random weights and random heads: the "
                                        "same step times, no weight files needed."),
    heads: str | None = typer.Option(None, "--heads", help="Heads folder (default: the shipped "
                                     "heads; with --random-weights: random heads)."),
    head_type: str = HEAD_TYPE_OPTION,
    num_heads: int = typer.Option(4, "--num-heads", help="Random heads to build "
                                  "(--random-weights without --heads)."),
    draft_vocab_size: int | None = typer.Option(None, "--draft-vocab-size", help="Random heads "
                                                "draft over this many tokens, as heads made by "
                                                "`entmtp heads draft-vocab` do (default: the "
                                                "whole vocabulary)."),
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
    max_seconds: float | None = typer.Option(None, "--max-seconds", help="End the timing by "
                                             "this many seconds after the command starts: "
                                             "fewer rounds (2 at least), no re-measure past "
                                             "it; the file records it."),
    strict: bool = STRICT_OPTION,
    seed: int = SEED_OPTION,
    out: Path = typer.Option(Path("latency.json"), "--out", help="Latency model JSON to write."),
    plot: Path | None = typer.Option(None, "--plot", help="Also draw the curve to this plot "
                                     "(.png, .pdf or .svg)."),
    compare: list[Path] = typer.Option([], "--compare", help="Latency JSON to draw next to it "
                                       "(repeatable; default: a synthetic counterpart)."),
    import_csv: Path | None = typer.Option(
        None, "--import", help="Time nothing here: turn step times measured in another runtime "
        "(vLLM, TensorRT-LLM, SGLang benchmarks) into a latency file with a batch axis. A CSV "
        "whose header line names the columns batch_size (or batch), nodes (or draft_len / "
        "draft_length: a chain's draft length), context (or context_len / context_length) and "
        "ms (or step_ms), e.g. the header batch_size,nodes,context,ms; other columns are "
        "ignored, lines starting with # too. One line per measured step; nodes 0 is the plain "
        "step, which every batch size needs; lines of one batch size, nodes and context are "
        "repeats of one measurement (their mean is its time)."),
    device_name: str | None = typer.Option(None, "--device-name", help="With --import: the "
                                           "hardware and runtime the steps were timed on, e.g. "
                                           "'H100, vLLM 0.11' (default: the CSV's name)."),
    batch_sizes: str | None = typer.Option(
        None, "--batch-sizes", help="Also time steps of several sequences at once, e.g. "
        "1,2,4,8,16,32: each size's steps on the static runtime (every row verifying the same "
        "tree), one size after the other, into one latency file with a batch axis (default: "
        "batch size 1 alone, a file of the one-model format)."),
    force: bool = FORCE_OPTION,
) -> None:
    """Measure verification latency vs tree size on this machine's CPU or GPU.

    Example (on a GPU machine, no weight files needed):
    entmtp latency --random-weights --dtype bf16 --device cuda --out h200.json

    Example (step times from another runtime): entmtp latency --import vllm.csv --out vllm.json
    """
    measuring = {"--model": model, "--heads": heads, "--draft-vocab-size": draft_vocab_size,
                 "--node-counts": node_counts, "--depths": depths,
                 "--context-lengths": context_lengths, "--repeats": repeats, "--warmup": warmup,
                 "--threads": threads, "--remeasure": remeasure, "--max-seconds": max_seconds,
                 "--random-weights": random_weights or None, "--batch-sizes": batch_sizes}
    if import_csv is not None:
        given = [name for name, value in measuring.items() if value is not None]
        if given:
            raise EntmtpError(f"--import reads step times timed elsewhere, so {given[0]} (which "
                              "sets up timing on this machine) does not apply: give one or the "
                              "other")
        _import_latency(import_csv, out=out, plot=plot, compare=list(compare), strict=strict,
                        device_name=device_name)
        return
    if device_name is not None:
        raise EntmtpError("--device-name names the hardware of --import's step times: give it "
                          "with --import (a measured file records this machine's)")
    deadline = deadline_after(max_seconds)
    console = Console()
    check_engine(engine)
    check_outputs(out)
    check_plots(plot)
    for path in compare:  # read now: a bad one must not fail after --out is written
        LatencyModel.load(path)
    sizes = parse_int_list(batch_sizes, "--batch-sizes", minimum=1, maximum=MAX_BATCH_SIZE)
    if sizes is not None and sizes != (1,):
        _measure_batches(sizes, console=console, out=out, plot=plot, compare=list(compare),
                         strict=strict, deadline=deadline, model=model, heads=heads,
                         head_type=head_type, num_heads=num_heads,
                         random_weights=random_weights, dtype=dtype, device=device,
                         node_counts=parse_int_list(node_counts, "--node-counts",
                                                    maximum=MAX_TREE_NODES),
                         depths=parse_int_list(depths, "--depths", minimum=1),
                         context_lengths=parse_int_list(context_lengths, "--context-lengths",
                                                        minimum=1),
                         repeats=repeats, warmup=warmup, seed=seed, threads=threads,
                         remeasure=remeasure, engine=engine, graphs=graphs,
                         draft_vocab_size=draft_vocab_size)
        return
    with console.status(f"timing draft + verify steps on {device} ({dtype})..."):
        measured = measure_latency(
            model=model, heads=heads, head_type=head_type, num_heads=num_heads,
            random_weights=random_weights, dtype=dtype, device=device,
            node_counts=parse_int_list(node_counts, "--node-counts", maximum=MAX_TREE_NODES),
            depths=parse_int_list(depths, "--depths", minimum=1),
            context_lengths=parse_int_list(context_lengths, "--context-lengths", minimum=1),
            repeats=repeats, warmup=warmup, seed=seed, threads=threads, remeasure=remeasure,
            engine=engine, graphs=graphs, draft_vocab_size=draft_vocab_size, deadline=deadline,
        )
    if measured.hardware.get("stopped_by_deadline"):
        warn(f"--max-seconds: timed {measured.hardware['repeats']} round(s) per point, not "
             f"{repeats or 'the default'}; re-measure passes past the deadline skipped")
    for warning in check_latency_model(measured, strict=strict, source="latency measurement"):
        warn(warning)
    with all_or_none():  # --out and --plot, or neither
        measured.save(out)
        if plot is not None:
            models = _plot_models({default_label(measured, "measured"): measured}, list(compare))
            plot_latency_curves(models, plot)
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
    if hw.get("engine") == STATIC_ENGINE and measured.fused_empty_ms is not None:
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
        console.print(f"wrote {plot}")


def _save_batch_latency(latency: BatchLatency, *, out: Path, plot: Path | None,
                        compare: list[Path], fallback: str) -> None:
    """Write a latency file with a batch axis and, with ``plot``, its curves (one per batch
    size) beside ``compare``'s: both, or neither."""
    with all_or_none():
        latency.save(out)
        if plot is not None:
            label = default_label(latency[latency.batch_sizes[0]], fallback)
            models = batch_curves(label, latency, alone=not compare)
            for path in compare:
                other = LatencyModel.load(path)
                models[default_label(other, path.stem)] = other
            plot_latency_curves(models, plot, title=f"Verification latency vs tree size: {label}",
                                mark_nodes=batch_mark(models))


def _measure_batches(sizes: tuple[int, ...], *, console: Console, out: Path, plot: Path | None,
                     compare: list[Path], strict: bool, **measuring) -> None:
    """`entmtp latency --batch-sizes`: time every batch size, check each model, write one file
    with the batch axis (and its plot); nothing written on a refusal."""
    device, dtype = measuring["device"], measuring["dtype"]
    with console.status(f"timing batched draft + verify steps on {device} ({dtype}), batch "
                        f"sizes {', '.join(map(str, sizes))}..."):
        measured = measure_batch_latency(batch_sizes=sizes, **measuring)
    for size, model in measured.items():
        if model.hardware.get("stopped_by_deadline"):
            warn(f"batch size {size}: --max-seconds cut the rounds to "
                 f"{model.hardware['repeats']} per point")
        for warning in check_latency_model(model, strict=strict,
                                           source=f"latency measurement at batch size {size}"):
            warn(warning)
    _save_batch_latency(measured, out=out, plot=plot, compare=compare, fallback="measured")
    hw = measured[sizes[0]].hardware
    console.print(f"{hw['device_name']} ({hw['dtype']}), {hw['model']}, batch sizes "
                  f"{', '.join(map(str, sizes))}:")
    for size, model in measured.items():
        largest = model.nodes[-1]
        console.print(f"batch {size}: plain step {model.autoregressive_ms:.2f} ms, "
                      f"{model.step_ms(largest, 0):.2f} ms at {largest} nodes "
                      f"({model.step_ms(largest, 0) / model.autoregressive_ms:.2f}x); "
                      f"{spread_line(model)}")
    console.print(f"wrote {out}")
    if plot is not None:
        console.print(f"wrote {plot}")


def _import_latency(source: Path, *, out: Path, plot: Path | None, compare: list[Path],
                    strict: bool, device_name: str | None) -> None:
    """`entmtp latency --import`: read, check and write; nothing written on a refusal."""
    console = Console()
    check_outputs(out)
    check_plots(plot)
    for path in compare:  # read now: a bad one must not fail after --out is written
        LatencyModel.load(path)
    imported = import_step_times(source, device_name=device_name)
    failed = [(size, warning) for size, model in imported.items() for warning in model.warnings]
    if failed and strict:
        raise EntmtpError(f"{source} at batch size {failed[0][0]} fails {len(failed)} latency "
                          f"check(s) (--strict): {failed[0][1]}; {IMPORT_HINT}")
    for size, warning in failed:
        warn(f"{source} at batch size {size}: {warning}")
    if failed:
        warn(f"{source}: {IMPORT_HINT}")
    _save_batch_latency(imported, out=out, plot=plot, compare=compare, fallback=source.stem)
    hw = imported[imported.batch_sizes[0]].hardware
    console.print(f"{hw['device_name']}: {hw['lines']} measured steps, batch sizes "
                  f"{', '.join(map(str, imported.batch_sizes))}, contexts "
                  f"{', '.join(map(str, hw['context_lengths']))}")
    for size, model in imported.items():
        largest = model.nodes[-1]
        console.print(f"batch {size}: plain step {model.autoregressive_ms:.2f} ms, "
                      f"{model.step_ms(largest, 0):.2f} ms at {largest} nodes "
                      f"({', '.join(map(str, model.nodes[1:]))} nodes timed)")
    console.print(f"wrote {out}")
    if plot is not None:
        console.print(f"wrote {plot}")


@app.command("plot-latency")
@user_errors
def plot_latency(
    files: list[Path] = typer.Argument(..., help="Latency model JSON files."),
    out: Path = typer.Option(..., "--out", help="Plot to write (.png, .pdf or .svg)."),
    synthetic_gpu: bool = typer.Option(False, "--synthetic-gpu", help="Add the synthetic "
                                       "GPU-like model, labelled as not measured."),
    force: bool = FORCE_OPTION,
) -> None:
    """Draw several latency models (e.g. a CPU and a GPU one) in one figure.

    Example: entmtp plot-latency trees/latency/cpu2-medusa-smollm2-135m.json
    trees/latency/gpu-nvidia-h200-smollm2-135m-medusa.json --out cpu2-vs-h200.png
    """
    check_plots(out)
    loaded = [(path, BatchLatency.load(path)) for path in files]
    extra = [LatencyModel.gpu_like()] if synthetic_gpu else []
    labels, shared = distinct_labels(
        [(path.name, latency[latency.batch_sizes[0]]) for path, latency in loaded]
        + [("", model) for model in extra])
    models: dict[str, LatencyModel] = {}
    for (_, latency), label in zip(loaded, labels, strict=False):
        models.update(batch_curves(label, latency, alone=len(files) == 1 and not synthetic_gpu))
    for model, label in zip(extra, labels[len(loaded):], strict=True):
        models[label] = model
    if len(files) == 1 and len(models) > 1 and not synthetic_gpu:  # one file's batch sizes
        plot_latency_curves(models, out, title=f"Verification latency vs tree size: {labels[0]}",
                            mark_nodes=batch_mark(models))
    else:
        plot_latency_curves(models, out, title="Verification latency vs tree size"
                            + (f": {shared}" if shared else ""))
    typer.echo(f"wrote {out}")


# -- entmtp retarget --------------------------------------------------------------------------
@app.command()
@user_errors
def retarget(
    source: Path = typer.Argument(..., help="Run folder (or its bundle.json), or a shipped "
                                  "profile folder (trees/profiles/TASK-TYPE), to re-search."),
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
    force: bool = FORCE_OPTION,
) -> None:
    """Re-search a calibration run for other hardware, reusing its profile (no model needed).

    Example: entmtp retarget trees/profiles/code-medusa --latency
    trees/latency/gpu-nvidia-h200-smollm2-135m-medusa.json --out runs/code-medusa-h200
    """
    console = Console()
    with ConsoleReporter(console) as reporter:
        target = retarget_run(source, latency_file, out=out, progress=reporter,
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

