"""The live batch sweep (``entmtp bench --batch-sizes``): at each batch size, plain decoding, the
bundle's batch-1 schedule and its schedule for that size decode the same batches of prompts side
by side, and each is held against the batched replay of the same trajectories.

**Batches.** The prompts are cut into batches of ``B`` as the batched replay cuts a profile's
trajectories (``batch_rows``: consecutive, the last filled by wrapping around), so the live
batches are the replayed ones row for row. Each batch runs every method once, in the rows of a
carryover-balanced design (one row per batch, cycled), after one unmeasured warm-up batch per
method and size (the engine's buffers for ``B`` rows, its kernels' first calls).

**Rates.** A method's tokens/s at ``B`` is every row's decode tokens over the batch steps' time
(``BatchDecodeResult``), summed over the batches; its accept length is decode tokens per live
row-step, the replay's ``mean_accept_length``. Speedups are ratios of those rates measured side
by side, with a 95% paired bootstrap interval over batches (``paired_ratio_interval``).

**Prediction.** The trajectories (plain decoding's outputs, the same under every method:
checked) are profiled once with the bundle's heads; each method's schedule is replayed on them
in the same batches (``batch_replay``) under the bundle's step times of that size
(``Bundle.batch_latency``; without them accept lengths only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from entmtp.core import EntmtpError
from entmtp.treesearch import (
    BatchLatency,
    Bundle,
    Profile,
    Replayer,
    Schedule,
    Tree,
    batch_replay,
    batch_rows,
    runtime_padding,
)

from ._paired import carryover_balanced_orders, paired_ratio_interval
from ._validation import (
    WARMUP_TOKENS,
    EncodedPrompt,
    Method,
    MethodRuns,
    accept_only_latency,
    bundle_topk,
    profile_live_trajectories,
    ratio,
)

AUTOREGRESSIVE, BATCH_ONE, ENTMTP = "autoregressive", "batch-1 bundle", "entmtp"


@dataclass
class BatchMethod:
    """One way of decoding a batch: ``run(batch ids, max_new_tokens) -> BatchDecodeResult``."""

    name: str
    run: Callable[[list[list[int]], int], Any]
    schedule: Schedule | None  # what it decodes with (None: plain decoding)
    same_as: str | None = None  # a method it decodes exactly as: shares its runs


@dataclass
class BatchRuns:
    """One method's results at one batch size, one per batch, in batch order."""

    method: BatchMethod
    results: list[Any] = field(default_factory=list)  # BatchDecodeResult per batch

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def decode_tokens(self) -> int:
        return sum(r.decode_tokens for r in self.results)

    @property
    def decode_ms(self) -> float:
        return math.fsum(r.decode_ms for r in self.results)

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.results)

    @property
    def row_steps(self) -> int:
        return sum(row.steps for r in self.results for row in r.rows)

    @property
    def tokens_per_second(self) -> float:
        return 1000.0 * self.decode_tokens / self.decode_ms if self.decode_ms > 0 else 0.0

    @property
    def mean_accept_length(self) -> float:
        return self.decode_tokens / self.row_steps if self.row_steps else 0.0

    def outputs(self) -> list[list[list[int]]]:
        return [[list(row.tokens) for row in r.rows] for r in self.results]


def batch_methods(base, decoder, bundle: Bundle, batch_size: int) -> list[BatchMethod]:
    """Plain decoding, the bundle's batch-1 schedule and its schedule at ``batch_size`` on
    ``decoder`` (a SpeculativeDecoder of the bundle's heads); the last shares the second's runs
    where the two schedules are the same."""
    from entmtp.runtime import BundleScheduler, autoregressive_generate_batch

    eos = sorted(base.eos_token_ids)

    def plain(batch: list[list[int]], max_new_tokens: int):
        return autoregressive_generate_batch(base.model, batch, max_new_tokens=max_new_tokens,
                                             eos_token_ids=eos, graphs=decoder.graphs)

    def bundle_method(name: str, schedule: Schedule) -> BatchMethod:
        scheduler = BundleScheduler(schedule)

        def run(batch: list[list[int]], max_new_tokens: int):
            return decoder.generate_batch(batch, scheduler, max_new_tokens=max_new_tokens,
                                          eos_token_ids=eos)

        return BatchMethod(name, run, schedule)

    methods = [BatchMethod(AUTOREGRESSIVE, plain, None),
               bundle_method(BATCH_ONE, bundle.schedule()),
               bundle_method(ENTMTP, bundle.schedule(batch_size))]
    if shares_batch_one(bundle, batch_size):
        methods[2].same_as = BATCH_ONE
    return methods


def shares_batch_one(bundle: Bundle, batch_size: int) -> bool:
    """Whether the bundle decodes ``batch_size`` rows with its batch-1 schedule (the entmtp
    row then shares the batch-1 row's runs)."""
    return bundle.schedule(batch_size) == bundle.schedule()


def run_batches_side_by_side(methods: Sequence[BatchMethod], batches: Sequence[list[list[int]]],
                             *, max_new_tokens: int,
                             progress: Callable[[], None] | None = None) -> list[BatchRuns]:
    """Every method on every batch, interleaved (``carryover_balanced_orders``), after one
    unmeasured warm-up batch each; a method with ``same_as`` shares that method's runs."""
    if not batches:
        raise EntmtpError("a batch sweep needs at least one batch of prompts")
    runs = [BatchRuns(m) for m in methods]
    measured = [i for i, m in enumerate(methods) if m.same_as is None]
    for m in measured:
        methods[m].run(batches[0], min(WARMUP_TOKENS, max_new_tokens))
    slots: list[list[Any]] = [[None] * len(batches) for _ in methods]
    orders = carryover_balanced_orders(len(measured))
    for b, batch in enumerate(batches):
        for position in orders[b % len(orders)]:
            m = measured[position]
            slots[m][b] = methods[m].run(batch, max_new_tokens)
            if progress is not None:
                progress()
    index = {m.name: i for i, m in enumerate(methods)}
    for run, results in zip(runs, slots, strict=True):
        same_as = run.method.same_as
        run.results = list(slots[index[same_as]]) if same_as is not None else results
    return runs


def sweep_batches(prompts: Sequence[EncodedPrompt], batch_size: int
                  ) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The prompt indices of each batch (``batch_rows``) and their token ids."""
    rows = batch_rows(len(prompts), batch_size)
    return rows, [[list(prompts[i].ids) for i in batch] for batch in rows]


def trajectories_of(plain: BatchRuns, rows: Sequence[list[int]], count: int) -> list[Any]:
    """Each prompt's plain-decoding result (``DecodeResult``), by prompt index, from the
    batches ``rows`` (a wrapped-around prompt decodes the same tokens again: its first)."""
    found: dict[int, Any] = {}
    for batch, result in zip(rows, plain.results, strict=True):
        for prompt, row in zip(batch, result.rows, strict=True):
            found.setdefault(prompt, row)
    missing = [i for i in range(count) if i not in found]
    if missing:
        raise EntmtpError(f"prompts {missing} were in no batch")
    return [found[i] for i in range(count)]


def profile_sweep(base, heads, bundle: Bundle, prompts: Sequence[EncodedPrompt],
                  trajectories: Sequence[Any]) -> Profile:
    """The trajectories profiled with the bundle's heads (what every replay of them needs)."""
    reference = MethodRuns(Method(AUTOREGRESSIVE, lambda ids, n: None), list(trajectories))
    return profile_live_trajectories(base, heads, prompts, reference,
                                     topk=bundle_topk(bundle.heads.topk))


def predicted(profile: Profile, schedule: Schedule | None, bundle: Bundle, batch_size: int
              ) -> dict[str, float | None]:
    """The batched replay of ``schedule`` (None: plain decoding) on ``profile`` at
    ``batch_size``: accept length, and tokens/s where the bundle has that size's step times."""
    schedule = schedule if schedule is not None else Schedule.static(Tree.from_paths([]))
    latencies = bundle.batch_latency
    if latencies is None and bundle.latency is not None:
        latencies = BatchLatency({1: bundle.latency})  # a batch-1 bundle: its own step times
    timed = latencies is not None and batch_size <= latencies.batch_sizes[-1]
    latency = latencies.for_batch(batch_size) if timed else accept_only_latency()
    result = batch_replay(Replayer(profile, schedule.trees, latency), schedule, batch_size)
    return {"mean_accept_length": result.mean_accept_length,
            "tokens_per_second": result.tokens_per_second if timed else None}


def sweep_rows(runs: Sequence[BatchRuns], predictions: dict[str, dict[str, float | None]]
               ) -> list[dict[str, Any]]:
    """One JSON row per method at one batch size: rates, speedups over plain decoding and the
    batch-1 bundle with their intervals over batches, lossless, and the prediction check."""
    by_name = {run.name: run for run in runs}
    plain = by_name[AUTOREGRESSIVE]
    reference = plain.outputs()
    rows = []
    for run in runs:
        baselines = [by_name[b] for b in (AUTOREGRESSIVE, BATCH_ONE)
                     if b in by_name and by_name[b] is not run]
        guess = predictions.get(run.name, {})
        rows.append({
            "name": run.name,
            "same_runs_as": run.method.same_as,
            "schedule_trees": (None if run.method.schedule is None
                               else [t.num_nodes for t in run.method.schedule.trees]),
            "tokens_per_second": run.tokens_per_second,
            "mean_accept_length": run.mean_accept_length,
            "decode_tokens": run.decode_tokens,
            "steps": run.steps,
            "row_steps": run.row_steps,
            "decode_ms": run.decode_ms,
            "lossless": run.outputs() == reference,
            "speedup": {b.name: ratio(run.tokens_per_second, b.tokens_per_second)
                        for b in baselines},
            "speedup_ci95": {b.name: _interval(run, b) for b in baselines},
            "predicted_mean_accept_length": guess.get("mean_accept_length"),
            "predicted_tokens_per_second": guess.get("tokens_per_second"),
            "accept_over_predicted": ratio(run.mean_accept_length,
                                           guess.get("mean_accept_length") or math.nan),
            "tokens_per_second_over_predicted": (
                None if guess.get("tokens_per_second") is None
                else ratio(run.tokens_per_second, guess["tokens_per_second"])),
            "per_batch": {"decode_tokens": [r.decode_tokens for r in run.results],
                          "decode_ms": [r.decode_ms for r in run.results]},
        })
    return rows


def _interval(run: BatchRuns, baseline: BatchRuns) -> list[float] | None:
    mine = [r.decode_ms for r in run.results]
    theirs = [r.decode_ms for r in baseline.results]
    if len(mine) < 2 or min(mine + theirs) <= 0:
        return None  # one batch: nothing to resample
    return list(paired_ratio_interval([r.decode_tokens for r in run.results], mine,
                                      [r.decode_tokens for r in baseline.results], theirs))


def sweep_decoder(base, heads, bundle: Bundle, *, engine: str, graphs: bool, pad: bool):
    """The decoder every bundle method of the sweep runs on (the bundle's padded widths)."""
    from entmtp.runtime import SpeculativeDecoder

    return SpeculativeDecoder(base.model, heads, topk=bundle.heads.topk, engine=engine,
                              graphs=graphs, padded_nodes=runtime_padding(bundle.latency, pad=pad))


@dataclass(frozen=True)
class SweepAtSize:
    """The sweep's results at one batch size."""

    batch_size: int
    batches: int
    rows: list[dict[str, Any]]  # sweep_rows

    def row(self, name: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["name"] == name)

    def to_json(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "batches": self.batches, "rows": self.rows}


def run_batch_sweep(
    base, heads, bundle: Bundle, prompts: Sequence[EncodedPrompt], batch_sizes: Sequence[int],
    *, max_new_tokens: int, engine: str = "auto", graphs: bool = True, pad: bool = True,
    progress: Callable[[], None] | None = None,
) -> list[SweepAtSize]:
    """The sweep (module doc) at every size of ``batch_sizes``, one size after the other, then
    the trajectories profiled once and every method's replay at every size."""
    if not prompts:
        raise EntmtpError("a batch sweep needs at least one prompt")
    sizes = sorted(set(int(b) for b in batch_sizes))
    if not sizes or sizes[0] < 1:
        raise EntmtpError(f"batch sizes {list(batch_sizes)}: give sizes of 1 or more")
    decoder = sweep_decoder(base, heads, bundle, engine=engine, graphs=graphs, pad=pad)
    measured: list[tuple[int, list[list[int]], list[BatchRuns]]] = []
    for size in sizes:
        rows, batches = sweep_batches(prompts, size)
        methods = batch_methods(base, decoder, bundle, size)
        measured.append((size, rows, run_batches_side_by_side(
            methods, batches, max_new_tokens=max_new_tokens, progress=progress)))
    size, rows, runs = measured[0]
    trajectories = trajectories_of(runs[0], rows, len(prompts))
    profile = profile_sweep(base, heads, bundle, prompts, trajectories)
    out = []
    for size, rows, runs in measured:
        guesses = {run.name: predicted(profile, run.method.schedule, bundle, size)
                   for run in runs}
        out.append(SweepAtSize(size, len(rows), sweep_rows(runs, guesses)))
    return out


def sweep_measured_runs(prompts: int, batch_sizes: Sequence[int], bundle: Bundle) -> int:
    """Batch runs the sweep measures (for a progress bar): per size, its batches times the
    methods that are measured (not sharing another's runs)."""
    total = 0
    for size in sorted(set(batch_sizes)):
        methods = 2 if shares_batch_one(bundle, size) else 3
        total += len(batch_rows(prompts, size)) * methods
    return total
