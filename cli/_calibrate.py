"""`entmtp calibrate`: profile -> latency -> fronts -> schedule -> bundle, resumable per stage
(the pipeline is ``entmtp.calibrate.calibrate``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from entmtp.calibrate import CalibrateArguments
from entmtp.calibrate import calibrate as run_calibration

from ._bench_batches import parse_batch_sizes
from ._errors import user_errors
from ._model_setup import (
    DATA_OPTION,
    DEVICE_OPTION,
    DTYPE_OPTION,
    ENGINE_OPTION,
    FORCE_OPTION,
    GRAPHS_OPTION,
    HEAD_TYPE_OPTION,
    HEADS_OPTION,
    MAX_NEW_TOKENS_OPTION,
    MODEL_OPTION,
    SEED_OPTION,
    STRICT_OPTION,
    split_option,
    task_option,
)
from ._progress import ConsoleReporter
from ._typer_app import app

_DEFAULT = CalibrateArguments()


@app.command()
@user_errors
def calibrate(
    task: str = task_option(_DEFAULT.task),
    model: str | None = MODEL_OPTION,
    heads: str | None = HEADS_OPTION,
    head_type: str = HEAD_TYPE_OPTION,
    data: str | None = DATA_OPTION,
    split: str = split_option(_DEFAULT.split),
    prompts: int = typer.Option(_DEFAULT.prompts, "--prompts", help="Number of prompts to "
                                "profile."),
    max_new_tokens: int = MAX_NEW_TOKENS_OPTION,
    topk: int = typer.Option(_DEFAULT.topk, "--topk", help="Candidates each head drafts."),
    seed: int = SEED_OPTION,
    out: Path | None = typer.Option(None, "--out", help="Run folder (default runs/TASK-TYPE)."),
    latency: Path | None = typer.Option(None, "--latency", help="Use a latency model measured "
                                        "elsewhere (entmtp latency) instead of measuring here."),
    num_shards: int | None = typer.Option(None, "--num-shards", help="Profile in S shards (one "
                                          "process or machine each, sharing --out; default: "
                                          "torchrun's WORLD_SIZE, else 1); run once more "
                                          "without shard options to merge them."),
    shard_index: int | None = typer.Option(None, "--shard-index", help="Which shard this "
                                           "process profiles, 0..S-1 (with --num-shards; "
                                           "default: torchrun's RANK)."),
    storage: str | None = typer.Option(None, "--storage", help="Optuna storage: journal:PATH or "
                                       "an RDB URL, shared by several workers."),
    schedule_trials: int = typer.Option(_DEFAULT.schedule_trials, "--schedule-trials",
                                        help="Optuna trials of the entropy-schedule search."),
    validation_folds: int = typer.Option(
        _DEFAULT.validation_folds, "--validation-folds", help="Ship a switching schedule only if "
        "it also beats the static tree on prompts left out of its search (K-fold; 0: off)."),
    shape_trials: int = typer.Option(_DEFAULT.shape_trials, "--shape-trials", help="Optuna "
                                     "NSGA-II trials of tree shapes per front, beside the "
                                     "greedy trees (0: the greedy trees only)."),
    max_nodes: int = typer.Option(_DEFAULT.max_nodes, "--max-nodes", help="Largest tree the "
                                  "search considers (draft tokens per step)."),
    batch_size: int = typer.Option(_DEFAULT.batch_size, "--batch-size", help="Prompts generated "
                                   "together while profiling."),
    batch_sizes: str | None = typer.Option(
        None, "--batch-sizes", help="Serving batch sizes to time and search for, e.g. "
        "1,2,4,8,16: the latency stage times the runtime's steps of each size, and the bundle "
        "gets a schedule per batch-size range (default: batch size 1 alone)."),
    strict: bool = STRICT_OPTION,
    fresh: bool = typer.Option(False, "--fresh", help="Start the run folder again: delete its "
                               "profile, latency and search files (a folder made with other "
                               "arguments is refused without it)."),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    engine: str = ENGINE_OPTION,
    graphs: bool = GRAPHS_OPTION,
    force: bool = FORCE_OPTION,
) -> None:
    """Profile a task, measure latency, search fronts and a schedule, write bundle.json.

    Example: entmtp calibrate --task code --prompts 24 --out runs/code

    Example: entmtp calibrate --task code --head-type medusa --batch-sizes 1,2,4,8 --max-nodes 16
    --out runs/code-batched
    """
    arguments = CalibrateArguments(
        task=task, model=model, heads=heads, head_type=head_type, data=data, split=split,
        prompts=prompts, max_new_tokens=max_new_tokens, topk=topk, seed=seed, device=device,
        dtype=dtype, out=out, latency=latency, num_shards=num_shards, shard_index=shard_index,
        storage=storage, schedule_trials=schedule_trials, validation_folds=validation_folds,
        shape_trials=shape_trials, max_nodes=max_nodes, batch_size=batch_size, strict=strict,
        fresh=fresh, engine=engine, graphs=graphs,
        batch_sizes=parse_batch_sizes(batch_sizes) or (1,))
    console = Console()
    with ConsoleReporter(console) as reporter:
        run = run_calibration(arguments, progress=reporter)
    if run.bundle.exists():
        console.print(f"wrote {run.bundle} and {run.report}")
