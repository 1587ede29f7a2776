"""`entmtp bench`: autoregressive vs static Medusa / Hydra trees vs bundles, measured live in one
process on the same prompts, interleaved per prompt (rows and prediction checks:
``entmtp.evaluation._benchmark``); with ``--targets bench/targets.py`` each bundle's prediction
check is marked PASS / MISS against the project's targets.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from entmtp.calibrate import command_line
from entmtp.core import EntmtpError, all_or_none
from entmtp.evaluation import (
    AUTOREGRESSIVE,
    BEST_STATIC,
    RATE_DEFINITION,
    REFERENCE,
    REFERENCE_ROWS,
    REFERENCE_TREE,
    BundleArm,
    OracleBound,
    PredictionCheck,
    bench_methods,
    bench_rows,
    bundle_prediction,
    capture_line,
    profile_per_head_set,
    run_side_by_side,
    runtime_report,
    torch_threads,
)
from entmtp.treesearch import Bundle

from ._bench_batches import parse_batch_sizes, run_sweep_command
from ._errors import user_errors
from ._live import (
    check_bundle_fits,
    check_head_type,
    check_max_new_tokens,
    encode_prompts,
    load_base,
    load_heads_for,
    load_task_prompts,
    read_bundle,
    run_progress,
    task_for,
    write_json,
)
from ._model_setup import (
    DATA_OPTION,
    DEVICE_OPTION,
    DTYPE_OPTION,
    ENGINE_OPTION,
    FORCE_OPTION,
    GRAPHS_OPTION,
    HEAD_TYPES,
    MAX_NEW_TOKENS_OPTION,
    MODEL_OPTION,
    PAD_OPTION,
    check_device_and_dtype,
    check_engine,
    check_outputs,
    split_option,
    task_option,
)
from ._plots import check_plots
from ._progress import output_console
from ._typer_app import app


def load_targets(path: Path) -> tuple[Any, ...]:
    """``TARGETS`` of a targets file (``bench/targets.py``): each with ``key`` (a field of the
    prediction check), ``name`` (its own), ``label``, ``at_least``, ``within``,
    ``verdict(task, prediction)`` and ``goal()``."""
    spec = importlib.util.spec_from_file_location("entmtp_bench_targets", path)
    if not Path(path).is_file():
        raise EntmtpError(f"--targets {path}: no such file; pass bench/targets.py or a file "
                          "like it")
    if spec is None or spec.loader is None:
        raise EntmtpError(f"--targets {path}: not a Python file (.py); pass bench/targets.py or "
                          "a file like it")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # any error of the user's file: one line naming it
        raise EntmtpError(f"--targets {path}: cannot load it ({type(err).__name__}: {err}); "
                          "fix the file") from err
    targets = tuple(getattr(module, "TARGETS", ()))
    if not targets:
        raise EntmtpError(f"--targets {path}: defines no TARGETS; define a tuple of targets")
    known = PredictionCheck.scalar_keys(REFERENCE_ROWS)
    for target in targets:
        if getattr(target, "key", None) not in known:
            raise EntmtpError(f"--targets {path}: target {getattr(target, 'key', target)!r} is "
                              f"not a field of the prediction check; use one of "
                              f"{', '.join(known)}")
    names = [target.name for target in targets]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:  # one verdict would hide the other's
        raise EntmtpError(f"--targets {path}: two targets are named {repeated!r}: give them "
                          "different tasks")
    return targets


def target_checks(targets: Sequence[Any], prediction: dict[str, Any],
                  task: str) -> dict[str, Any]:
    """By target name: its value in a prediction check's JSON, its goal and PASS / MISS on this
    task (None: n/a, where not measured or not a target of this task or bundle)."""
    return {t.name: {"value": prediction[t.key], "goal": t.goal(),
                     "pass": t.verdict(task, prediction)} for t in targets}


# -- bundles, their rows and threads ----------------------------------------------------------
def read_bundles(sources: Sequence[Path]) -> list[tuple[Path, Bundle]]:
    """Each ``--bundle``, at most one per head type (one-line error otherwise)."""
    read = [read_bundle(source) for source in sources]
    seen: dict[str, Path] = {}
    for path, bundle in read:
        kind = bundle.heads.type
        if kind in seen:
            raise EntmtpError(
                f"--bundle: {seen[kind]} and {path} are both for {kind} heads: pass at most one "
                "bundle per head type"
            )
        seen[kind] = path
    return read


def bundle_task(bundles: Sequence[tuple[Path, Bundle]], task: str | None,
                data: str | None) -> str | None:
    """The bundles' common task (the default task); one-line error when they disagree and
    neither --task nor --data says which prompts to use."""
    tasks = {bundle.task for _, bundle in bundles}
    if len(tasks) > 1 and task is None and data is None:
        raise EntmtpError(
            f"the bundles are for different tasks ({', '.join(sorted(tasks))}): pass --task or "
            "--data to choose the prompts"
        )
    return bundles[0][1].task if bundles else None


def bundle_threads(bundle: Bundle) -> int | None:
    """Torch threads the bundle's CPU latency model was measured with (None: not recorded, or
    measured on a GPU)."""
    hardware = bundle.latency.hardware if bundle.latency is not None else bundle.hardware
    if not hardware.get("torch_threads") or hardware.get("device", "cpu") != "cpu":
        return None
    return int(hardware["torch_threads"])


def measurement_threads(bundles: Sequence[tuple[Path, Bundle]],
                        override: int | None) -> tuple[int | None, str]:
    """(torch threads for the measurement, where that count comes from); None: torch's
    default. Bundles measured with different counts are a one-line error unless overridden."""
    if override is not None:
        if override < 1:
            raise EntmtpError(f"--threads must be at least 1, got {override}")
        return override, "--threads"
    counts = {path: n for path, bundle in bundles if (n := bundle_threads(bundle)) is not None}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{path}: {n}" for path, n in counts.items())
        raise EntmtpError(
            f"the bundles' latency models were measured with different torch thread counts "
            f"({listed}): pass --threads N to choose one"
        )
    if counts:
        return next(iter(counts.values())), "bundle latency model"
    return None, "torch default"


def load_head_sets(base, heads: Sequence[str], head_type: str | None, model: str | None,
                   bundles: Sequence[Bundle] = ()):
    """The ``--heads`` folders (at most one per head type), else the shipped heads of
    ``--head-type`` or of every type: for a type with a bundle, the ones it was calibrated
    for."""
    if not heads:
        wanted = {b.heads.type: b.heads.sha256 for b in bundles}
        return [load_heads_for(base, None, t, model, wanted.get(t))
                for t in ([head_type] if head_type else HEAD_TYPES)]
    head_sets = [load_heads_for(base, h, head_type or "medusa", model) for h in heads]
    types = [h.head_type for h in head_sets]
    for kind in HEAD_TYPES:
        if types.count(kind) > 1:
            raise EntmtpError(f"--heads: {types.count(kind)} {kind} head sets: pass at most one "
                              "heads folder per head type")
    return head_sets


def heads_for_bundle(bundle: Bundle, base, head_sets, *, hardware_warnings: bool = True):
    """The loaded head set the bundle was calibrated for (one-line error when none fits);
    ``hardware_warnings``: ``check_bundle_fits``'s."""
    candidates = [h for h in head_sets if h.head_type == bundle.heads.type]
    if not candidates:
        raise EntmtpError(
            f"the bundle is for {bundle.heads.type} heads but only "
            f"{', '.join(h.head_type for h in head_sets)} heads are loaded: pass --heads with the "
            "heads the bundle was calibrated for"
        )
    check_bundle_fits(bundle, base, candidates[0], hardware_warnings=hardware_warnings)
    return candidates[0]


def bench_machine(model, torch_threads: int | None) -> dict[str, Any]:
    """Where and when the rows were measured (the results tables in docs/results cite it)."""
    from entmtp.evaluation import run_record

    return run_record(model, torch_threads=torch_threads)


# -- predictions ------------------------------------------------------------------------------
# -- output -----------------------------------------------------------------------------------
def _short(name: str) -> str:
    return {AUTOREGRESSIVE: "AR"}.get(name, name.removesuffix(f"-{REFERENCE_TREE}"))


def _static_for(row: dict[str, Any], statics: dict[str, str]) -> str | None:
    """The best-static row a row's "vs static" column compares with: its head type's."""
    if row["heads"] in statics:
        return statics[row["heads"]]
    return next(iter(statics.values())) if row["heads"] is None and len(statics) == 1 else None


def _table(rows: Sequence[dict[str, Any]], oracles: Sequence[OracleBound],
           title: str) -> Table:
    fixed = [r["name"] for r in rows if r["role"] in (AUTOREGRESSIVE, REFERENCE)]
    statics = {r["heads"]: r["name"] for r in rows if r["role"] == BEST_STATIC}
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False, padding=0)
    table.add_column("row", no_wrap=True)
    columns = ["tok/s", "accept", "step ms [IQR]", "lossless",
               *(f"vs {_short(b)}" for b in fixed)]
    if statics:
        columns.append("vs static")
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        against = [*fixed, *([_static_for(row, statics)] if statics else [])]
        spread = row["step_ms"]
        cells = [escape(row["name"]), f"{row['tokens_per_second']:.1f}",
                 f"{row['mean_accept_length']:.2f}",
                 f"{_num(spread['median_ms'], '.1f')} [{_num(spread['iqr_ms'], '.1f')}]",
                 "yes" if row["lossless"] else "NO"]
        cells += [f"{row['speedup'][b]:.2f}x" if b in row["speedup"] else "-" for b in against]
        table.add_row(*cells)
    for oracle in oracles:
        if oracle.replayed is not None:
            table.add_row(escape(f"{oracle.name} est."),
                          f"{oracle.estimated_measured_tokens_per_second:.1f}",
                          f"{oracle.replayed.mean_accept_length:.2f}", "-", "-",
                          *["-"] * (len(columns) - 4))
    return table


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _prediction_table(predictions: Sequence[PredictionCheck]) -> Table:
    table = Table(title="prediction check (replay of these prompts' greedy trajectories with "
                        "each bundle's latency model; calib: the bundle's own prediction)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False, padding=0)
    for name in ("row", "accept", "replay", "calib", "tok/s", "replay", "calib", "oracle",
                 "% oracle", "vs static", "replay", "AR meas/model"):
        table.add_column(name, justify="left" if name == "row" else "right", no_wrap=True)
    for p in predictions:
        table.add_row(
            escape(p.row), _num(p.measured.mean_accept_length, ".3f"),
            _num(p.replayed.mean_accept_length, ".3f"),
            _num(p.calibration_predicted.mean_accept_length, ".3f"),
            _num(p.measured.tokens_per_second, ".1f"),
            _num(p.replayed.tokens_per_second, ".1f"),
            _num(p.calibration_predicted.tokens_per_second, ".1f"),
            _num(p.oracle.tokens_per_second, ".1f"),
            _num(p.fraction_of_oracle, ".1%"),
            _num(p.speedup_vs_best_static, ".3f"),
            _num(p.replayed_speedup_vs_best_static, ".3f"),
            _num(p.autoregressive_measured_over_modelled, ".3f"),
        )
    return table


def _step_time_table(predictions: Sequence[PredictionCheck]) -> Table | None:
    """Measured vs modelled step ms per tree of each bundle's schedule and best static tree."""
    table = Table(title="step time by tree (steps where live and replay ran the same tree at "
                        "the same position; ms: measured / modelled; drift: that ratio over "
                        "autoregressive decoding's in the same run, 1 when the step moved with "
                        "the machine)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False, padding=0)
    for name in ("row", "tree", "nodes", "depth", "steps", "measured", "IQR", "modelled",
                 "ratio", "drift"):
        table.add_column(name, justify="left" if name == "row" else "right", no_wrap=True)
    entries = []
    for p in predictions:
        # measured over modelled autoregressive *speed*: the inverse of its step-time ratio
        speed = p.autoregressive_measured_over_modelled
        entries += [(p.row, t, speed) for t in p.step_time_by_tree or ()]
        if p.best_static is not None:
            entries += [(p.best_static.row, t, speed)
                        for t in p.best_static.step_time_by_tree or ()]
    for row, t, speed in entries:
        drift = (None if t.measured_over_modelled is None or speed is None
                 else t.measured_over_modelled * speed)
        table.add_row(escape(row), str(t.tree), str(t.num_nodes), str(t.depth), str(t.steps),
                      _num(t.measured_ms, ".1f"), _num(t.measured_iqr_ms, ".1f"),
                      _num(t.modelled_ms, ".1f"), _num(t.measured_over_modelled, ".3f"),
                      _num(drift, ".3f"))
    return table if entries else None


def target_line(targets: Sequence[Any], prediction: dict[str, Any]) -> str:
    """One line per bundle: each target's value and PASS / MISS (n/a: not measured, or not
    this task's or bundle's target)."""
    parts = []
    for target in targets:
        check = prediction["targets"][target.name]
        value = check["value"]
        if target.at_least is None and target.within is None:
            shown = ""
        elif target.key == "fraction_of_oracle":
            shown = _num(value, ".1%") + " "
        elif target.within is not None:
            shown = _num(value, ".3f") + " "
        else:
            shown = _num(value, ".2f") + "x "
            interval = prediction.get(f"{target.key}_ci95")
            if interval:
                shown += f"[{interval[0]:.2f}-{interval[1]:.2f}] "
        verdict = {True: "PASS", False: "MISS", None: "n/a"}[check["pass"]]
        goal = f" ({check['goal']})" if shown else ""
        parts.append(f"{target.label} {shown}{verdict}{goal}")
    return f"{prediction['row']}: " + ", ".join(parts)


def plot_bench(rows: Sequence[dict[str, Any]], path: str | os.PathLike, *, title: str) -> Path:
    """Bar chart of tokens/s per row (hatched: rows with ``measured: False``)."""
    from ._plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 1.3 * len(rows), 4.5))
    names = [row["name"] for row in rows]
    values = [row["tokens_per_second"] for row in rows]
    bars = ax.bar(range(len(rows)), values, color="tab:blue")
    for bar, row in zip(bars, rows, strict=True):
        if not row.get("measured", True):
            bar.set_hatch("//")
            bar.set_facecolor("white")
            bar.set_edgecolor("tab:blue")
        ax.annotate(f"{bar.get_height():.1f}", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tokens per second")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


@app.command()
@user_errors
def bench(
    task: str | None = task_option(None, " (default: the bundles' task, else chat); without "
                                   "--bundle, --model and --heads, also the shipped bundles of "
                                   "this task that fit this machine best"),
    data: str | None = DATA_OPTION,
    bundle_sources: list[Path] | None = typer.Option(
        None, "--bundle", help="A bundle.json or run folder (repeatable, one per head type): "
        "adds its best-static and entmtp rows and the prediction check."),
    model: str | None = MODEL_OPTION,
    heads: list[str] | None = typer.Option(
        None, "--heads", help="A Medusa, Hydra or entmtp heads folder (repeatable, one per head "
        "type): only these heads' rows; default: the shipped Medusa and Hydra heads."),
    head_type: str | None = typer.Option(None, "--head-type", help="Only this type's shipped "
                                         "heads (medusa or hydra)."),
    split: str = split_option("heldout"),
    prompts: int = typer.Option(8, "--prompts", help="Number of prompts to decode."),
    max_new_tokens: int = MAX_NEW_TOKENS_OPTION,
    seed: int = typer.Option(0, "--seed", help="Seed of the calibration / held-out split."),
    threads: int | None = typer.Option(None, "--threads", help="Torch threads for the "
                                       "measurement (default: the count the bundles' latency "
                                       "models were measured with, else torch's default)."),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    engine: str = ENGINE_OPTION,
    graphs: bool = GRAPHS_OPTION,
    pad: bool = PAD_OPTION,
    json_path: Path | None = typer.Option(None, "--json", help="Write the rows as JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Bar chart of tokens/s (.png, .pdf "
                                     "or .svg)."),
    targets_file: Path | None = typer.Option(
        None, "--targets", help="A targets file (bench/targets.py): mark each bundle's "
        "prediction check PASS / MISS against its TARGETS."),
    batch_sizes: str | None = typer.Option(
        None, "--batch-sizes", help="Instead of one prompt at a time: the batch sweep of one "
        "bundle, e.g. 1,2,4,8,16. At each size the prompts decode in batches of that many "
        "(the last filled by wrapping around), plain decoding, the bundle's batch-1 schedule "
        "and its schedule for that size side by side, each against the batched replay."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="The batch sweep at this "
                                          "one batch size (--batch-sizes with one size)."),
    force: bool = FORCE_OPTION,
) -> None:
    """Measure autoregressive, static Medusa/Hydra trees and bundles side by side, live.

    Example: entmtp bench --task code --prompts 8 --bundle runs/code --plot bench.png --targets
    bench/targets.py

    Example: entmtp bench --task code --head-type medusa --prompts 12 --batch-sizes 1,2,4,8,16
    """
    console = output_console()
    targets = load_targets(targets_file) if targets_file is not None else ()
    check_head_type(head_type)
    check_engine(engine)
    check_device_and_dtype(device, dtype)
    check_max_new_tokens(max_new_tokens)
    picked = not bundle_sources and task is not None and model is None and not heads
    if picked:  # the pick line said how each fits this machine
        from ._bundles import pick_shipped_per_head_type

        bundle_sources = pick_shipped_per_head_type(task, head_type, device=device, dtype=dtype)
    bundles = read_bundles(bundle_sources or [])
    sweep_sizes = parse_batch_sizes(batch_sizes)
    if batch_size is not None:
        if sweep_sizes is not None:
            raise EntmtpError("--batch-size is --batch-sizes with one size: give one of them")
        sweep_sizes = parse_batch_sizes(str(batch_size), "--batch-size")
    if sweep_sizes is not None and len(bundles) != 1:
        raise EntmtpError(f"the batch sweep measures one bundle, got {len(bundles)}: give one "
                          "--bundle, or --task with --head-type")
    if sweep_sizes is not None and (plot is not None or targets):
        raise EntmtpError("--plot and --targets are for the per-prompt bench: the batch sweep "
                          "prints its tables and writes --json")
    thread_count, thread_source = measurement_threads(bundles, threads)
    task_name = task_for(task, data, bundle_task(bundles, task, data) or "chat")
    task_prompts = load_task_prompts(task=task_name, data=data, split=split,
                                     num_prompts=prompts, seed=seed)
    check_outputs(json_path)
    check_plots(plot)
    base = load_base(model, device=device, dtype=dtype)
    head_sets = load_head_sets(base, heads or [], head_type, model,
                               [bundle for _, bundle in bundles])
    arms = [BundleArm(path, bundle, heads_for_bundle(bundle, base, head_sets,
                                                     hardware_warnings=not picked),
                      len(bundles) > 1)
            for path, bundle in bundles]
    encoded = encode_prompts(base, task_prompts, max_new_tokens)
    if sweep_sizes is not None:
        arm = arms[0]
        run_sweep_command(
            console, base=base, heads=arm.heads, bundle_path=arm.path, bundle=arm.bundle,
            encoded=encoded, batch_sizes=sweep_sizes, max_new_tokens=max_new_tokens,
            engine=engine, graphs=graphs, pad=pad, threads=thread_count,
            thread_source=thread_source, json_path=json_path,
            title=f"batch sweep: {len(encoded)} {split} prompts of {task_name}, "
                  f"{max_new_tokens} new tokens",
            report={"model": base.name, "task": task_name, "data": data, "split": split,
                    "prompts": len(encoded), "max_new_tokens": max_new_tokens,
                    "heads_sha256": arm.bundle.heads.sha256,
                    "machine": bench_machine(base.model, thread_count)})
        return
    methods, decoders = bench_methods(base, head_sets, arms, engine=engine, graphs=graphs,
                                      pad=pad)
    for note in dict.fromkeys(d.runtime_note for d in decoders):  # once
        console.print(f"[dim]{note}[/dim]")
    on_cpu = next(base.model.parameters()).device.type == "cpu"
    with torch_threads(thread_count if on_cpu else None) as used_threads:
        measured = [m for m in methods if m.same_as is None]
        with run_progress(console, f"bench ({len(measured)} methods)",
                          len(measured) * len(encoded)) as progress:
            runs = run_side_by_side(methods, encoded, max_new_tokens=max_new_tokens,
                                    progress=progress)
        rows = bench_rows(runs)
        kinds = ", ".join(dict.fromkeys(arm.head_type for arm in arms))
        with console.status(f"profiling the greedy trajectories with the {kinds} heads for the "
                            "prediction check..."):
            profiles = profile_per_head_set(base, arms, encoded, runs[0])
    prompt_ids = [p.prompt_id for p in encoded]
    checks = {arm.head_type: bundle_prediction(arm, profiles[arm.head_type], runs, rows,
                                               prompt_ids)
              for arm in arms}
    predictions = {kind: check.to_json() for kind, check in checks.items()}
    for prediction in predictions.values():
        prediction["targets"] = target_checks(targets, prediction, task_name)
    oracles = [check.oracle for check in checks.values()]
    title = f"bench: {len(encoded)} {split} prompts of {task_name}, {max_new_tokens} new tokens"
    console.print(_table(rows, oracles, title))
    for row in rows:
        if row.get("same_runs_as"):
            console.print(f"[dim]{row['same_runs_as']} and {row['name']}: one tree on the same "
                          "steps, measured once[/dim]")
    if checks:
        console.print(_prediction_table(list(checks.values())))
        step_table = _step_time_table(list(checks.values()))
        if step_table is not None:
            console.print(step_table)
        if targets:
            for prediction in predictions.values():
                console.print(escape(target_line(targets, prediction)), soft_wrap=True)
        for check in checks.values():
            for warning in check.warnings:
                typer.echo(f"entmtp: warning: bench row {check.row!r}: {warning}", err=True)
    console.print(f"torch threads: {used_threads} ({thread_source})" if on_cpu else
                  "device: not the CPU (torch threads unchanged)")
    report = {
        "model": base.name,
        "task": task_name,
        "data": data,
        "split": split,
        "prompts": len(encoded),
        "max_new_tokens": max_new_tokens,
        "bundles": [str(arm.path) for arm in arms],
        # the head sets measured (each bundle was checked against its loaded heads)
        "heads_sha256": {arm.head_type: arm.bundle.heads.sha256 for arm in arms},
        "threads": {"torch_threads": used_threads, "source": thread_source, "cpu": on_cpu},
        "machine": bench_machine(base.model, used_threads),
        # after the runs: their graph captures included
        "runtime": runtime_report(decoders, base.model, engine=engine, graphs=graphs),
        "command": command_line(),
        "rate_definition": RATE_DEFINITION,
        "targets": {t.name: t.goal() for t in targets},
        "rows": rows,
        "predictions": predictions,
    }
    captures = capture_line(report["runtime"])
    if captures is not None:
        console.print(f"[dim]{escape(captures)}[/dim]")
    with all_or_none():  # --json and --plot, or neither
        write_json(json_path, report, console)
        if plot is not None:
            plotted = list(rows)
            plotted += [{"name": f"{o.name} (est.)", "measured": False,
                         "tokens_per_second": o.estimated_measured_tokens_per_second}
                        for o in oracles if o.replayed is not None]
            plot_bench(plotted, plot, title=title)
            console.print(f"wrote {plot}")
