"""The offline search of one calibration run, profile + latency model in, bundle out.

profile -> acceptance table by entropy bucket -> Pareto fronts (all positions and per bucket)
-> schedule calibration over the fronts' trees -> bundle + front.json + report.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import numpy as np

from entmtp.core import EntmtpError

from ._acceptance import (
    AcceptanceTable,
    acceptance_table,
    entropy_bucket_edges,
    independence_error,
)
from ._batch_latency import BatchLatency
from ._batch_search import BatchChoice, bundle_batch_ranges, search_by_batch
from ._bundle import (
    BestStatic,
    Bundle,
    CreatedBy,
    EntropyInfo,
    HeadsInfo,
    ModelInfo,
    Predicted,
    TreeStats,
)
from ._hardware_words import hardware_lines
from ._latency import LatencyModel
from ._pareto import TreeCandidate, build_front, fronts_by_bucket, score_tree
from ._profile import Profile
from ._replay import ReplayResult, replay
from ._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule
from ._schedule_search import ScheduleSearchResult, calibrate_schedule
from ._tree import Tree

REFERENCE_TREES = ("mc_sim_7b_63",)
SIGNAL_WORDS = {BASE_ENTROPY: "the base model's entropy at each decoded position",
                DRAFT_ENTROPY: "head 1's entropy at the step, before the tree is chosen"}
MAX_SEED = 2**32 - 1  # Optuna's samplers seed numpy, which takes 32 bits


@dataclass(frozen=True)
class SearchSettings:
    max_nodes: int = 64  # largest tree considered
    report_buckets: int = 4  # entropy buckets of the acceptance table and per-bucket fronts
    shape_trials: int = 0  # Optuna NSGA-II trials per front (0: greedy family only)
    schedule_trials: int = 150  # Optuna trials of the schedule search
    max_buckets: int = 4  # most trees a schedule switches between
    max_candidates: int = 48  # trees offered to the schedule search
    seed: int = 0
    storage: str | None = None  # Optuna storage URL or journal:PATH; None = in memory
    study_name: str | None = None
    validation_folds: int = 3  # a switching schedule must beat the static tree out of sample

    def __post_init__(self) -> None:
        """Settings no search can run with, refused before any work (a run's options)."""
        minimum = {"max_nodes": 1, "report_buckets": 1, "shape_trials": 0,
                   "schedule_trials": 0, "max_buckets": 1, "max_candidates": 1, "seed": 0}
        for name, least in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise EntmtpError(f"{name} (--{name.replace('_', '-')}) must be an integer of "
                                  f"at least {least}, got {value!r}")
        if self.seed > MAX_SEED:
            raise EntmtpError(f"seed (--seed) must be at most {MAX_SEED}, got {self.seed}")
        if self.validation_folds != 0 and not (isinstance(self.validation_folds, int)
                                               and self.validation_folds >= 2):
            raise EntmtpError(f"validation_folds must be 0 (off) or an integer >= 2, got "
                              f"{self.validation_folds!r}")


@dataclass
class ReferenceResult:
    name: str
    candidate: TreeCandidate
    replay: ReplayResult


@dataclass
class SearchOutcome:
    settings: SearchSettings
    acceptance: AcceptanceTable
    front: list[TreeCandidate]
    bucket_edges: np.ndarray
    bucket_fronts: list[list[TreeCandidate]]
    schedule: ScheduleSearchResult
    references: list[ReferenceResult] = field(default_factory=list)


def reference_tree(name: str) -> Tree:
    """A shipped reference tree from ``entmtp.trees`` (e.g. Medusa's ``mc_sim_7b_63``)."""
    try:
        text = resources.files("entmtp.trees").joinpath(f"{name}.json").read_text()
    except FileNotFoundError as err:
        raise EntmtpError(f"no shipped reference tree {name!r}: see trees/README.md") from err
    return Tree.from_json(json.loads(text))


def select_candidates(
    fronts: Sequence[Sequence[TreeCandidate]], limit: int, *, extra: Sequence[Tree] = ()
) -> list[Tree]:
    """At most ``limit`` distinct trees for the schedule search: ``extra`` first, then the
    fronts' trees round-robin, each front best tokens/ms first; ordered by size.

    Each front is scored on its own positions (all, or one entropy bucket), so its best trees
    are the ones a schedule serving those positions needs. Spreading picks evenly over sizes
    instead can drop exactly those (on a machine where one drafted node is all that pays, the
    1-node tree), leaving the schedule worse than the best static tree.
    """
    if limit < 1:
        raise EntmtpError(f"the schedule search needs at least 1 candidate tree, not {limit}")
    ranked = [sorted(front, key=lambda c: (-c.tokens_per_ms, c.tree.num_nodes, c.tree.paths))
              for front in fronts]
    chosen: dict[tuple, Tree] = {}
    for tree in extra:
        if len(chosen) < limit:
            chosen.setdefault(tree.paths, tree)
    for rank in range(max((len(r) for r in ranked), default=0)):
        for front in ranked:
            if len(chosen) >= limit:
                break
            if rank < len(front):
                chosen.setdefault(front[rank].tree.paths, front[rank].tree)
    return sorted(chosen.values(), key=lambda t: (t.num_nodes, t.depth, t.paths))


def search(
    profile: Profile,
    latency: LatencyModel,
    settings: SearchSettings = SearchSettings(),
    *,
    references: tuple[str, ...] = REFERENCE_TREES,
    show_progress: bool = False,
) -> SearchOutcome:
    """Run the whole offline search on ``profile`` (the calibration split)."""
    if profile.num_positions == 0:
        raise EntmtpError("the profile has no positions: profile more prompts or longer outputs")
    if all(t.num_positions < 2 for t in profile.traces):
        raise EntmtpError("every profiled output is a single token, so there is no decoding "
                          "step to replay: profile longer outputs (--max-new-tokens >= 2)")
    entropy = profile.entropy()
    ranks = profile.ranks()
    topk = profile.meta.topk
    edges = entropy_bucket_edges(entropy, settings.report_buckets)
    table = acceptance_table(entropy, ranks, topk=topk, edges=edges)
    front_kwargs: dict[str, Any] = dict(
        max_nodes=settings.max_nodes,
        optuna_trials=settings.shape_trials,
        seed=settings.seed,
        storage=settings.storage,
        topk=topk,
    )
    name = settings.study_name or "entmtp"
    front = build_front(ranks, latency, study_name=f"{name}-shapes", **front_kwargs)
    bucket_fronts = fronts_by_bucket(
        entropy, ranks, edges, latency, study_name=f"{name}-shapes", **front_kwargs
    )
    fronts = [front, *bucket_fronts]
    if profile.has_draft_entropy:  # trees sized for confident and unsure drafts
        draft = profile.draft_entropy()
        draft_edges = entropy_bucket_edges(draft, settings.report_buckets)
        fronts += fronts_by_bucket(draft, ranks, draft_edges, latency,
                                   study_name=f"{name}-draft-shapes", **front_kwargs)
    # The empty tree is a plain decoding step: where drafts rarely pay (unsure heads, or a
    # machine where verifying one more token costs much), a schedule may skip drafting.
    candidates = select_candidates(fronts, settings.max_candidates,
                                   extra=[Tree.from_paths([])])
    schedule = calibrate_schedule(
        profile,
        candidates,
        latency,
        n_trials=settings.schedule_trials,
        seed=settings.seed,
        max_buckets=settings.max_buckets,
        storage=settings.storage,
        study_name=f"{name}-schedule",
        show_progress=show_progress,
        validation_folds=settings.validation_folds,
    )
    outcome = SearchOutcome(settings, table, front, edges, bucket_fronts, schedule)
    for ref_name in references:
        tree = reference_tree(ref_name)
        if tree.depth > profile.num_heads:
            continue
        try:
            tree.check_fits(topk=topk)
        except EntmtpError:
            continue
        scored = score_tree(tree, ranks, latency)
        outcome.references.append(ReferenceResult(ref_name, scored, replay(profile, tree, latency)))
    return outcome


def search_by_batch_size(
    profile: Profile, latencies: Mapping[int, LatencyModel], settings: SearchSettings, *,
    outcome: SearchOutcome, latency: LatencyModel,
) -> list[BatchChoice]:
    """The schedule of every batch size in ``latencies`` (treesearch/_batch_search.py): the
    whole search again under each size's model (``outcome``, the search under ``latency``, is
    reused where a size's model is that one), the batch-1 schedule being ``outcome``'s."""
    def search_at(size: int, model: LatencyModel) -> tuple[Schedule, Tree]:
        found = outcome if model == latency else search(
            profile, model, replace(settings, study_name=f"{settings.study_name or 'entmtp'}"
                                                         f"-batch{size}"), references=())
        result = found.schedule
        return result.schedule, result.candidates[result.best_static_index]

    return search_by_batch(profile, latencies, batch_one=outcome.schedule.schedule,
                           search_at=search_at)


def make_bundle(
    outcome: SearchOutcome,
    profile: Profile,
    latency: LatencyModel,
    *,
    command: str,
    version: str,
    batch_choices: Sequence[BatchChoice] = (),
    batch_latency: BatchLatency | None = None,
) -> Bundle:
    """The bundle a runtime loads: the calibrated schedule with its predictions, and with
    ``batch_choices`` (``search_by_batch_size`` under ``batch_latency``) its batch-size
    ranges and the step times they were searched with."""
    meta = profile.meta
    result = outcome.schedule
    schedule = result.schedule
    ranks = profile.ranks()
    stats = []
    estimates = result.result  # replay of the schedule
    served = _positions_served(profile, schedule)
    for index, tree in enumerate(schedule.trees):
        rows = ranks[served == index]
        scored = score_tree(tree, rows if len(rows) else ranks, latency)
        stats.append(TreeStats(scored.expected_accept_length, scored.latency_ms))
    static_tree = result.candidates[result.best_static_index]
    static_index = next(
        (i for i, tree in enumerate(schedule.trees) if tree.paths == static_tree.paths), None
    )
    return Bundle(
        model=ModelInfo(meta.model or "unknown", int(meta.vocab_size), int(meta.hidden_size)),
        heads=HeadsInfo(meta.head_type, int(profile.num_heads), int(meta.topk),
                        meta.heads_sha256 or "0" * 64),
        task=meta.task or "custom",
        entropy=EntropyInfo(schedule.signal, "nats", schedule.estimator),
        thresholds=list(schedule.thresholds),
        trees=list(schedule.trees),
        tree_stats=stats,
        predicted=Predicted(
            mean_accept_length=estimates.mean_accept_length,
            tokens_per_second=estimates.tokens_per_second,
            speedup_vs_autoregressive=estimates.speedup_vs_autoregressive,
            oracle_tokens_per_second=result.oracle.tokens_per_second,
        ),
        hardware=dict(latency.hardware),
        created_by=CreatedBy(entmtp=version, command=command),
        best_static=BestStatic(static_tree, result.best_static.tokens_per_second, static_index),
        latency=latency,
        batch_ranges=bundle_batch_ranges(list(batch_choices)) if batch_choices else [],
        batch_latency=batch_latency if batch_choices else None,
    )


def noise_line(result: ScheduleSearchResult) -> str:
    """What the noise check of the schedule search found (see calibrate_schedule)."""
    check = result.noise
    if check is None:
        return ("Latency noise check: not needed (no switching schedule beat the best static "
                "tree on the calibration traces).")
    if check.bound is None:
        return (f"Latency noise check: not applied (the latency model has no measured spread); "
                f"the switching schedule gains {check.gain:.3f}x over the best static tree.")
    if check.passed:
        return (f"Latency noise check: the switching schedule gains {check.gain:.3f}x over the "
                f"best static tree, above the {check.bound:.3f}x the latency model's noise "
                "could produce; kept it.")
    return (f"Latency noise check: the switching schedule gained only {check.gain:.3f}x over "
            f"the best static tree, within the {check.bound:.3f}x the latency model's noise "
            "could produce (3 standard errors of a difference of two step costs), so the "
            "bundle ships the best static tree.")


def _point_label(point) -> str:
    if point.step == "tree":
        return f"the step at {point.nodes} nodes, depth {point.depth}"
    if point.step == "autoregressive":
        return "the autoregressive step"
    return f"{point.step.replace('_', ' ')}, draft depth {point.depth}"


def latency_lines(latency: LatencyModel, notes: Sequence[str] = ()) -> list[str]:
    """``report.md``'s account of the latency model's noise and failed checks; ``notes``: what
    else is wrong with it for this profile (a caller's warnings, one line each)."""
    lines = ["## Latency model noise", ""]
    spread = latency.relative_spread()
    if spread is None:
        lines.append("Spread: not measured (synthetic, or measured before the profiler kept "
                     "it).")
    else:
        rounds = sorted({p.rounds for p in latency.points})
        shown_rounds = (str(rounds[0]) if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}")
        worst = max(latency.points, key=lambda p: p.iqr_ms / p.ms if p.ms > 0 else 0.0)
        lines += [f"Each point is the trimmed mean of {shown_rounds} interleaved rounds; a step's "
                  f"rounds spread by {spread:.1%} of its time (median interquartile range over "
                  f"the {len(latency.points)} points in latency.json; widest: "
                  f"{worst.iqr_ms / worst.ms:.1%}, {_point_label(worst)}, context "
                  f"{worst.context}); relative standard error of a step cost "
                  f"{latency.relative_noise():.2%}; gain the noise could produce "
                  f"{latency.noise_gain_bound():.3f}x; re-measure passes "
                  f"{latency.hardware.get('remeasure_passes', 0)}.", "",
                  "| figure | ms | points | median IQR ms | standard error ms |",
                  "|---|---:|---:|---:|---:|"]
        figures = [(f"step, {n} nodes", "tree", n, -1, v)
                   for n, v in zip(latency.nodes, latency.verify_ms, strict=True)]
        figures.append(("autoregressive step", "autoregressive", 0, -1,
                        latency.autoregressive_ms))
        for step in ("prepare", "fused_empty"):
            for depth in sorted({p.depth for p in latency.points if p.step == step}):
                cost = (latency.prepare_cost(depth) if step == "prepare"
                        else latency.fused_empty_cost(depth))
                figures.append((f"{step.replace('_', ' ')}, draft depth {depth}", step, 0,
                                depth, cost))
        for label, step, nodes, depth, ms in figures:
            mine = [p for p in latency.points if p.step == step and not p.padded_to
                    and (p.nodes == nodes if step == "tree" else depth in (-1, p.depth))]
            if not mine or ms is None:
                continue
            iqr = float(np.median([p.iqr_ms for p in mine]))
            error = latency.figure_error_ms(step, nodes=nodes, depth=depth)
            lines.append(f"| {label} | {ms:.2f} | {len(mine)} | {iqr:.2f} | {error:.2f} |")
    warnings = latency.warnings
    lines.append("")
    if latency.padded_nodes:
        lines += [f"Trees verified at padded widths (cheaper beyond noise): "
                  f"{latency.padding_summary}.", ""]
    if warnings:
        lines += ["**Warning: the latency model fails its checks; the trees below may follow "
                  "measurement noise. Re-measure on a quiet machine (`entmtp latency`) and "
                  "retarget (`entmtp retarget`).**", ""]
        lines += [f"- {w}" for w in warnings]
    else:
        lines.append("The latency model passes its checks.")
    lines += [line for note in notes for line in ("", f"**Warning:** {note}")]
    lines.append("")
    return lines


def validation_line(result: ScheduleSearchResult) -> str:
    """What the out-of-sample check of the schedule search found (see calibrate_schedule)."""
    check = result.validation
    if check is None:
        if result.noise is not None and not result.noise.passed:
            return "Cross-validation: not run (the noise check shipped the static tree)."
        if result.study.best_trial is None:
            return ("Cross-validation: not needed (no switching schedule beat the best static "
                    "tree on the calibration traces).")
        if result.validation_folds == 0:
            return ("Cross-validation: off (--validation-folds 0): the switching schedule ships "
                    "without an out-of-sample check.")
        return (f"Cross-validation: not run: fewer prompts with a decoding step than the "
                f"{result.validation_folds} folds, so none could be held out; the switching "
                "schedule ships without an out-of-sample check (profile more prompts, or use "
                "fewer --validation-folds).")
    if check.passed:
        verdict = "kept the switching schedule"
    elif check.schedule_ms < check.static_ms:
        verdict = ("shipped the best static tree instead: the switching schedule's held-out gain "
                   "is within the latency model's noise")
    else:
        verdict = "shipped the best static tree instead: the switching schedule did not generalize"
    bound = ("" if check.bound is None else
             f" (the latency model's noise could produce {check.bound:.3f}x)")
    return (f"Cross-validation ({check.folds} folds of prompts, each replayed with the schedule "
            f"and the static tree searched on the others): held-out schedule over static "
            f"{check.gain:.3f}x{bound}; {verdict}.")


def _positions_served(profile: Profile, schedule) -> np.ndarray:
    """Tree index serving each position, from the schedule's signal estimate (all positions)."""
    parts = []
    for trace in profile.traces:
        if schedule.signal == DRAFT_ENTROPY:
            estimates = trace.draft_entropy
        else:
            estimates = schedule.estimator.estimates(trace.entropy)
        parts.append(schedule.tree_indices(estimates))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# -- artefacts --------------------------------------------------------------------------------
def _candidate_json(candidate: TreeCandidate) -> dict[str, Any]:
    return {
        "paths": candidate.tree.to_json(),
        "num_nodes": candidate.tree.num_nodes,
        "depth": candidate.tree.depth,
        "expected_accept_length": candidate.expected_accept_length,
        "latency_ms": candidate.latency_ms,
        "source": candidate.source,
    }


def outcome_to_json(outcome: SearchOutcome, *, task: str) -> dict[str, Any]:
    """``front.json``: fronts, references, chosen schedule and its replayed comparison."""
    result = outcome.schedule
    return {
        "format": "entmtp-front",
        "task": task,
        "front": [_candidate_json(c) for c in outcome.front],
        "bucket_edges": [float(e) for e in outcome.bucket_edges],
        "bucket_fronts": [[_candidate_json(c) for c in f] for f in outcome.bucket_fronts],
        "references": [
            {"name": r.name, **_candidate_json(r.candidate),
             "replayed_tokens_per_second": r.replay.tokens_per_second}
            for r in outcome.references
        ],
        "schedule": {
            "thresholds": list(result.schedule.thresholds),
            "signal": result.schedule.signal,
            "estimator": result.schedule.estimator.to_json(),
            "trees": [t.to_json() for t in result.schedule.trees],
            "replayed": result.result.summary(),
        },
        "best_static": {
            "paths": result.candidates[result.best_static_index].to_json(),
            "replayed": result.best_static.summary(),
        },
        "oracle": {"replayed": result.oracle.summary()},
    }


def report_markdown(
    outcome: SearchOutcome, *, task: str, latency: LatencyModel, ranks: np.ndarray, topk: int,
    latency_notes: Sequence[str] = (), batch_choices: Sequence[BatchChoice] = (),
) -> str:
    """``report.md``: what a person reads after a calibration run; ``latency_notes``: warnings
    about the latency model beside its own checks (``latency_lines``); ``batch_choices``: the
    search per batch size, as a table (``batch_table_lines``)."""
    result = outcome.schedule
    sched = result.schedule
    lines = [f"# entmtp calibration report: task `{task}`", ""]
    lines += ["## Head-wise top-k acceptance by entropy bucket", "", "```",
              outcome.acceptance.format(), "```", ""]
    lines += ["## Pareto front (all calibration positions)", "",
              "| nodes | depth | expected accept length | latency ms | tokens/ms | source |",
              "|---:|---:|---:|---:|---:|---|"]
    for c in outcome.front:
        lines.append(f"| {c.tree.num_nodes} | {c.tree.depth} | {c.expected_accept_length:.3f} | "
                     f"{c.latency_ms:.2f} | {c.tokens_per_ms:.4f} | {c.source} |")
    thresholds = ", ".join(f"{t:.3f}" for t in sched.thresholds)
    lines += ["", "## Chosen schedule", "",
              f"Signal: `{sched.signal}` ({SIGNAL_WORDS.get(sched.signal, 'an entropy')}); "
              f"estimate: {sched.estimator.describe()}; "
              + (f"thresholds: {thresholds} nats." if thresholds else
                 "one tree at every step, no threshold."), "",
              "| tree | serves estimates (nats) | nodes | depth | nodes per depth |",
              "|---:|---|---:|---:|---|"]
    for i, tree in enumerate(sched.trees):
        lines.append(f"| {i} | {served_range(sched.thresholds, i)} | {tree.num_nodes} | "
                     f"{tree.depth} | {', '.join(str(w) for w in tree.widths) or 'none'} |")
    ar_tps = 1000.0 / latency.autoregressive_ms if latency.autoregressive_ms > 0 else float("nan")
    rows = [("entmtp schedule", result.result),
            ("best static tree of the front", result.best_static)]
    rows += [(f"{r.name} (static)", r.replay) for r in outcome.references]
    rows += [("oracle schedule (hindsight bound)", result.oracle)]
    lines += ["", "## Replayed on the calibration traces", "",
              "Latency model:", "", *hardware_lines(latency.hardware), "",
              f"Plain (autoregressive) decoding: {latency.autoregressive_ms:.2f} ms/token "
              f"({ar_tps:.2f} tokens/s). The steps are "
              "the live decoder's: tokens/s and mean accept length count the decode tokens (each "
              "output less the prefill's first token) over step time and steps."
              + _booking_note(latency), "",
              "| schedule | mean accept length | tokens/s | speedup vs AR | vs best static |",
              "|---|---:|---:|---:|---:|"]
    static_tps = result.best_static.tokens_per_second
    for label, rep in rows:
        lines.append(f"| {label} | {rep.mean_accept_length:.3f} | {rep.tokens_per_second:.2f} | "
                     f"{rep.speedup_vs_autoregressive:.3f}x | "
                     f"{rep.tokens_per_second / static_tps:.3f}x |")
    lines += ["", f"Schedule reaches {result.fraction_of_oracle:.1%} of the oracle's tokens/s.", ""]
    lines += [noise_line(result), "", validation_line(result), ""]
    lines += latency_lines(latency, latency_notes)
    lines += ["## Independence model (Medusa's tree builder) vs the empirical prefix model", "",
              "| tree | empirical accept length | independence model | relative error |",
              "|---|---:|---:|---:|"]
    static_tree = result.candidates[result.best_static_index]
    checks = [("best static tree", static_tree)] + [(r.name, r.candidate.tree)
                                                    for r in outcome.references]
    for label, tree in checks:
        err = independence_error(tree, ranks, topk)
        lines.append(f"| {label} ({tree.num_nodes} nodes) | {err['empirical']:.3f} | "
                     f"{err['independence']:.3f} | {err['relative_error']:+.1%} |")
    lines.append("")
    if batch_choices:
        lines += batch_table_lines(batch_choices)
    return "\n".join(lines)


def describe_schedule(schedule) -> str:
    """A schedule in a few words: "plain decoding", "5-node tree", "3 trees (5, 8, 0 nodes)"."""
    if len(schedule.trees) == 1:
        tree = schedule.trees[0]
        return "plain decoding" if tree.num_nodes == 0 else f"{tree.num_nodes}-node tree"
    sizes = ", ".join(str(t.num_nodes) for t in schedule.trees)
    return f"{len(schedule.trees)} trees ({sizes} nodes)"


def batch_table_lines(choices: Sequence[BatchChoice]) -> list[str]:
    """The report's table by batch size: batched replays of plain decoding, the size's best
    static tree, the schedule it decodes with and the batch-1 schedule run at that size."""
    lines = ["## By batch size", "",
             "Each measured batch size: the search again under that size's step times, then "
             "batches of that many calibration traces replayed together as the batched runtime "
             "decodes them (one tree per step for the whole batch, at the mean of the live "
             "rows' estimates; a finished row stays in the batch until the last finishes). "
             "Tokens/s are the whole batch's.", "",
             "| batch | plain decoding | best static tree | chosen schedule | tokens/s | "
             "vs plain | batch-1 schedule here |",
             "|---:|---:|---|---|---:|---:|---:|"]
    for c in choices:
        ar = c.autoregressive_tokens_per_second
        lines.append(
            f"| {c.batch_size} | {ar:.2f} | {c.best_static_tree.num_nodes} nodes, "
            f"{c.best_static_tokens_per_second:.2f} | {_chosen_words(c)} | "
            f"{c.tokens_per_second:.2f} | "
            f"{c.tokens_per_second / ar if ar > 0 else float('nan'):.3f}x | "
            f"{c.batch_one_tokens_per_second:.2f} |")
    lines.append("")
    return lines


def _chosen_words(choice: BatchChoice) -> str:
    words = describe_schedule(choice.schedule)
    return words if words == choice.source else f"{words} ({choice.source})"


def served_range(thresholds: Sequence[float], index: int) -> str:
    """The estimates tree ``index`` of a schedule with ``thresholds`` serves, in words."""
    low = thresholds[index - 1] if index > 0 else None
    high = thresholds[index] if index < len(thresholds) else None
    if low is None and high is None:
        return "all"
    if low is not None and high is not None and low >= high:
        return f"none (both thresholds {low:.3f})"
    if low is None:
        return f"below {high:.3f}"
    if high is None:
        return f"{low:.3f} and above"
    return f"{low:.3f} to {high:.3f}"


def _booking_note(latency: LatencyModel) -> str:
    """The charges besides each tree's profiled step, in words ("" when there are none)."""
    note = ""
    if latency.entropy_readout_ms > 0:
        note += (f" A one-tree schedule reads no entropy: its steps cost "
                 f"{latency.entropy_readout_ms:.2f} ms less than the profiled ones (the empty "
                 "step's entropy readout).")
    if latency.head_row_ms > 0:
        note += (f" A draft-entropy schedule's drafted step pays {latency.head_row_ms:.2f} ms "
                 "per head row it prepares beyond its own tree's depth.")
    return note
