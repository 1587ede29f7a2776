"""`entmtp validate`: live decoding with a bundle's schedule against its prediction.

Held-out prompts are decoded twice on the same machinery, interleaved: with the bundle's
entropy schedule and autoregressively. The autoregressive outputs are the greedy trajectories;
profiled and replayed with the bundle's schedule they must give the live steps one for one
(positions, accept lengths, trees; up to float ties), which is the check of the exact-replay
argument on this machine.

Predicted and measured numbers are on one footing: tokens/s is decode tokens (each output less
the prefill's first token) over the decoding steps' time, and mean accept length is decode
tokens per step, as the replay that made the bundle's prediction counts them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from entmtp.core import EntmtpError
from entmtp.evaluation import (
    RATE_DEFINITION,
    EncodedPrompt,
    MethodRuns,
    autoregressive_method,
    bundle_topk,
    capture_line,
    check_replay,
    profile_live_trajectories,
    ratio,
    run_side_by_side,
    runtime_report,
    speculative_method,
)
from entmtp.treesearch import runtime_padding

from ._bench_batches import run_sweep_command
from ._errors import user_errors
from ._live import (
    bundle_source,
    check_bundle_fits,
    check_head_type,
    check_max_new_tokens,
    encode_prompts,
    load_base,
    load_heads_for,
    load_task_prompts,
    predicted_speed,
    run_progress,
    slow_warning,
    task_for,
    write_json,
)
from ._model_setup import (
    BUNDLE_HEAD_TYPE_OPTION,
    BUNDLE_HEADS_OPTION,
    DATA_OPTION,
    DEVICE_OPTION,
    DTYPE_OPTION,
    ENGINE_OPTION,
    FORCE_OPTION,
    GRAPHS_OPTION,
    MAX_NEW_TOKENS_OPTION,
    MODEL_OPTION,
    PAD_OPTION,
    check_engine,
    check_outputs,
    split_option,
    task_option,
)
from ._progress import output_console, status_console, warn
from ._typer_app import app

MAX_MISMATCHES_SHOWN = 10


def replay_check(base, heads, bundle, prompts: list[EncodedPrompt], live: MethodRuns,
                 reference: MethodRuns, *, console: Console) -> dict[str, Any]:
    """Profile the autoregressive trajectories, replay the schedule, compare with live steps."""
    with console.status("profiling the greedy trajectories for the replay check..."):
        profile = profile_live_trajectories(base, heads, prompts, reference,
                                            topk=bundle_topk(bundle.heads.topk))
    return check_replay(profile, bundle.schedule(), bundle.latency, live.results,
                        [p.prompt_id for p in prompts]).to_json()


def _table(report: dict[str, Any]) -> Table:
    table = Table(title=f"validate: {report['prompts']} {report['split']} prompts of "
                        f"{report['task']}", title_justify="left",
                  caption=f"predicted: on {report['predicted_on']}. tokens/s and accept length "
                          "count decode tokens: the prefill's first token and time are "
                          "excluded", caption_justify="left")
    table.add_column("")
    table.add_column("predicted", justify="right")
    table.add_column("measured", justify="right")
    table.add_row("mean accept length", f"{report['predicted_mean_accept_length']:.3f}",
                  f"{report['measured_mean_accept_length']:.3f}")
    table.add_row("tokens/s", f"{report['predicted_tokens_per_second']:.2f}",
                  f"{report['measured_tokens_per_second']:.2f}")
    table.add_row("speedup vs autoregressive", f"{report['predicted_speedup']:.3f}x",
                  f"{report['measured_speedup']:.3f}x")
    predicted_ar = report["predicted_autoregressive_tokens_per_second"]
    table.add_row("autoregressive tokens/s", "" if predicted_ar is None else f"{predicted_ar:.2f}",
                  f"{report['autoregressive_tokens_per_second']:.2f}")
    return table


@app.command()
@user_errors
def validate(
    source: Path | None = typer.Argument(None, help="A bundle.json or a run folder holding one "
                                         "(or --task: a shipped bundle)."),
    model: str | None = MODEL_OPTION,
    heads: str | None = BUNDLE_HEADS_OPTION,
    head_type: str | None = BUNDLE_HEAD_TYPE_OPTION,
    task: str | None = task_option(None, ": the prompts (default: the bundle's task); without a "
                                   "bundle, also the shipped bundle of this task that fits this "
                                   "machine best"),
    data: str | None = DATA_OPTION,
    split: str = split_option("heldout"),
    prompts: int = typer.Option(8, "--prompts", help="Number of prompts to decode."),
    max_new_tokens: int = MAX_NEW_TOKENS_OPTION,
    seed: int = typer.Option(0, "--seed", help="Seed of the calibration / held-out split."),
    check_replay: bool = typer.Option(True, "--replay/--no-replay", help="Also profile the "
                                      "prompts and compare live steps with the exact replay."),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    engine: str = ENGINE_OPTION,
    graphs: bool = GRAPHS_OPTION,
    pad: bool = PAD_OPTION,
    json_path: Path | None = typer.Option(None, "--json", help="Write the report as JSON."),
    batch_size: int = typer.Option(1, "--batch-size", help="Decode the prompts in batches of "
                                   "this many (the last filled by wrapping around) with the "
                                   "bundle's schedule for that size, beside plain decoding and "
                                   "the batch-1 schedule, each against the batched replay of the "
                                   "same trajectories (as bench --batch-sizes)."),
    force: bool = FORCE_OPTION,
) -> None:
    """Decode held-out prompts live with a bundle's schedule and compare with its prediction.

    The results go to stdout; the bundle picked, the model loading, progress and warnings to
    stderr.

    Example: entmtp validate --task code --prompts 8

    Example: entmtp validate runs/code --prompts 8 --json validate.json

    Example: entmtp validate --task code --prompts 12 --batch-size 4
    """
    console = output_console()
    status = status_console()
    check_head_type(head_type)
    check_engine(engine)
    check_max_new_tokens(max_new_tokens)
    if batch_size < 1:
        raise EntmtpError(f"--batch-size {batch_size}: give 1 or more prompts per batch")
    check_outputs(json_path)  # before anything is read or loaded
    bundle_path, bundle, picked = bundle_source(source, task, head_type, model=model,
                                                device=device, dtype=dtype)
    task_name = task_for(task, data, bundle.task)
    task_prompts = load_task_prompts(task=task_name, data=data, split=split,
                                     num_prompts=prompts, seed=seed)
    base = load_base(model, device=device, dtype=dtype)
    draft_heads = load_heads_for(base, heads, head_type or bundle.heads.type, model,
                                 bundle.heads.sha256)
    timed_here = check_bundle_fits(bundle, base, draft_heads, hardware_warnings=not picked)
    encoded = encode_prompts(base, task_prompts, max_new_tokens)
    if batch_size != 1:
        run_sweep_command(
            console, base=base, heads=draft_heads, bundle_path=bundle_path, bundle=bundle,
            encoded=encoded, batch_sizes=(batch_size,), max_new_tokens=max_new_tokens,
            engine=engine, graphs=graphs, pad=pad, threads=None, thread_source="torch's",
            json_path=json_path, title=f"validate: {len(encoded)} {split} prompts of "
                                      f"{task_name}",
            report={"model": base.name, "task": task_name, "data": data, "split": split,
                    "prompts": len(encoded), "max_new_tokens": max_new_tokens,
                    "heads_sha256": bundle.heads.sha256})
        return

    from entmtp.runtime import BundleScheduler, SpeculativeDecoder

    decoder = SpeculativeDecoder(base.model, draft_heads, topk=bundle.heads.topk, engine=engine,
                                 graphs=graphs,
                                 padded_nodes=runtime_padding(bundle.latency, pad=pad))
    status.print(f"[dim]{escape(decoder.runtime_note)}[/dim]", highlight=False)
    eos = sorted(base.eos_token_ids)
    entmtp = speculative_method("entmtp", decoder, BundleScheduler(bundle.schedule()), eos=eos)
    reference = autoregressive_method(base.model, eos=eos, engine=engine, graphs=graphs)
    with run_progress(status, "decoding", 2 * len(encoded)) as progress:
        live, ar = run_side_by_side([entmtp, reference], encoded, max_new_tokens=max_new_tokens,
                                    progress=progress)
    differ = live.identical_to(ar)
    prediction = predicted_speed(bundle)
    report: dict[str, Any] = {
        "bundle": str(bundle_path),
        "model": base.name,
        "heads": {"type": draft_heads.head_type, "num_heads": draft_heads.num_heads,
                  "sha256": draft_heads.sha256()},
        "task": task_name,
        "data": data,
        "split": split,
        "prompts": len(encoded),
        "max_new_tokens": max_new_tokens,
        "rate_definition": RATE_DEFINITION,
        "predicted_mean_accept_length": bundle.predicted.mean_accept_length,
        "measured_mean_accept_length": live.mean_accept_length,
        "predicted_tokens_per_second": bundle.predicted.tokens_per_second,
        "measured_tokens_per_second": live.tokens_per_second,
        "autoregressive_tokens_per_second": ar.tokens_per_second,
        "predicted_autoregressive_tokens_per_second": prediction.autoregressive_tokens_per_second,
        "predicted_on": prediction.timed_on,
        "predicted_speedup": bundle.predicted.speedup_vs_autoregressive,
        "measured_speedup": ratio(live.tokens_per_second, ar.tokens_per_second),
        "lossless": not differ,
        "not_lossless_prompts": [encoded[i].prompt_id for i in differ],
        "tree_usage": {str(k): v for k, v in live.tree_usage().items()},
        "entmtp": live.summary(),
        "autoregressive": ar.summary(),
        "runtime": runtime_report([decoder], base.model, engine=engine, graphs=graphs),
    }
    if check_replay:
        report.update(replay_check(base, draft_heads, bundle, encoded, live, ar, console=status))
    console.print(_table(report))
    verdict = "lossless: every output equals autoregressive decoding" if report["lossless"] else (
        f"NOT lossless on {len(differ)} prompt(s): {', '.join(report['not_lossless_prompts'])}")
    console.print(verdict)
    captures = capture_line(report["runtime"])
    if captures is not None:
        console.print(f"[dim]{escape(captures)}[/dim]")
    if check_replay:
        console.print(
            f"replay check: {report['steps_equal']}/{report['steps_compared']} steps equal "
            f"({report['replay_step_agreement']:.1%}); replayed mean accept length "
            f"{report['replayed_mean_accept_length']:.3f}"
        )
        for m in report["mismatches"][:MAX_MISMATCHES_SHOWN]:
            console.print(f"  {m['prompt_id']} position {m['position']}: live accept "
                          f"{m['live_accept']} tree {m['live_tree']} vs replayed "
                          f"{m['replayed_accept']} tree {m['replayed_tree']}")
    slow = slow_warning(bundle, live.tokens_per_second, live.mean_accept_length,
                        timed_here=timed_here)
    if slow is not None:
        warn(slow)
    write_json(json_path, report, console)
