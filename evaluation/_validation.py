"""Live validation: decoding methods run side by side on the same prompts, and live steps
compared with the exact replay of the same trajectories.

The replay argument (``docs/design.md``): under greedy verification a profile of the greedy
trajectories books, step for step, what live decoding does. ``compare_steps`` is the one check
of that on live results (``validate``, ``bench`` and the runtime tests use it);
``step_times_by_tree`` sets each tree's measured step time against the latency model's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from entmtp.core import EntmtpError
from entmtp.treesearch import LatencyModel, Profile, ReplayResult, Schedule, Tree, replay

from ._paired import carryover_balanced_orders

# Medusa's drafting default (FasterDecoding/Medusa, TOPK = 10): the reference trees' candidates.
REFERENCE_TOPK = 10
WARMUP_TOKENS = 4  # tokens of the unmeasured warm-up run of each method
# What MethodRuns' rates count (the reports of validate and bench say it).
RATE_DEFINITION = ("decode tokens (each output less the prefill's first token) over decoding-step "
                   "time; mean accept length: decode tokens per step (as in the replay)")


def ratio(a: float, b: float) -> float:
    """``a / b``; nan when ``b`` is not positive."""
    return a / b if b > 0 else float("nan")


@dataclass(frozen=True)
class EncodedPrompt:
    index: int  # TaskPrompt.index: position in the task's full list
    prompt_id: str
    ids: list[int]  # token ids, as the profiler encodes the prompt


# -- methods and their measured totals --------------------------------------------------------
@dataclass
class Method:
    """One way of decoding a prompt: ``run(ids, max_new_tokens) -> DecodeResult``."""

    name: str
    run: Callable[[list[int], int], Any]
    info: dict[str, Any] = field(default_factory=dict)  # heads, tree sizes ... for the report
    # makes the runtime ready for contexts up to n tokens (cache reserved, graphs captured)
    ready: Callable[[int], None] | None = None
    # the name of a method this one decodes exactly as (the same scheduler path and steps): it
    # shares that method's runs instead of measuring the same thing again at another moment
    same_as: str | None = None


@dataclass
class MethodRuns:
    """The results of one method on every prompt, in prompt order."""

    method: Method
    results: list[Any] = field(default_factory=list)  # DecodeResult per prompt

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def tokens(self) -> int:
        """Every generated token, the prefill's first included."""
        return sum(len(r.tokens) for r in self.results)

    @property
    def decode_tokens(self) -> int:
        """Tokens the decoding steps produced: each output less the prefill's first token."""
        return sum(r.decode_tokens for r in self.results)

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.results)

    @property
    def decode_ms(self) -> float:
        return math.fsum(r.decode_ms for r in self.results)

    @property
    def prefill_ms(self) -> float:
        return math.fsum(r.prefill_ms for r in self.results)

    @property
    def tokens_per_second(self) -> float:
        """Decode tokens over the steps' time (the prefill's first token and time excluded, as in
        the replay and the runtime's ``decode_tokens_per_second``)."""
        return 1000.0 * self.decode_tokens / self.decode_ms if self.decode_ms > 0 else 0.0

    @property
    def end_to_end_tokens_per_second(self) -> float:
        total = self.prefill_ms + self.decode_ms
        return 1000.0 * self.tokens / total if total > 0 else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Decode tokens per step, as the replay counts them."""
        return self.decode_tokens / self.steps if self.steps else 0.0

    def per_prompt(self) -> dict[str, list]:
        """Decode tokens, decoding-step ms and steps of each prompt, in prompt order."""
        return {"decode_tokens": [r.decode_tokens for r in self.results],
                "decode_ms": [r.decode_ms for r in self.results],
                "steps": [r.steps for r in self.results]}

    def tree_usage(self) -> dict[int, int]:
        """Steps per tree index."""
        counts: dict[int, int] = {}
        for result in self.results:
            for step in result.step_log:
                counts[step.tree_index] = counts.get(step.tree_index, 0) + 1
        return dict(sorted(counts.items()))

    def identical_to(self, reference: MethodRuns) -> list[int]:
        """Prompt positions whose tokens differ from ``reference``'s."""
        return [
            i for i, (mine, theirs) in enumerate(zip(self.results, reference.results, strict=True))
            if list(mine.tokens) != list(theirs.tokens)
        ]

    def summary(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "decode_tokens": self.decode_tokens,
            "steps": self.steps,
            "decode_ms": self.decode_ms,
            "prefill_ms": self.prefill_ms,
            "tokens_per_second": self.tokens_per_second,
            "end_to_end_tokens_per_second": self.end_to_end_tokens_per_second,
            "mean_accept_length": self.mean_accept_length,
        }


# called after each measured run with the end-to-end tokens/s of all runs so far (nan: no time)
RunProgress = Callable[[float], None]


def run_side_by_side(
    methods: Sequence[Method],
    prompts: Sequence[EncodedPrompt],
    *,
    max_new_tokens: int,
    progress: RunProgress | None = None,
) -> list[MethodRuns]:
    """Every method on every prompt, interleaved: prompt ``p`` runs the methods in row
    ``p`` (cycled) of a carryover-balanced design, so drift in machine load and the state one
    method leaves the next spread over all methods. Each method first decodes a few tokens
    unmeasured (warm-up: lazy initialisation, plan caches). A method with ``same_as`` is not
    run: it shares the runs of the method it names."""
    runs = [MethodRuns(m) for m in methods]
    if not prompts:
        return runs
    index = {method.name: i for i, method in enumerate(methods)}
    measured = [i for i, method in enumerate(methods) if method.same_as is None]
    for method in methods:
        target = method.same_as
        if target is not None and (target not in index or methods[index[target]].same_as):
            raise EntmtpError(f"method {method.name} shares the runs of {method.same_as}, which "
                              "is not a measured method of the same run")
    longest = max(len(p.ids) for p in prompts) + max_new_tokens
    for m in measured:
        if methods[m].ready is not None:
            methods[m].ready(longest)
        methods[m].run(prompts[0].ids, min(WARMUP_TOKENS, max_new_tokens))
    slots: list[list[Any]] = [[None] * len(prompts) for _ in methods]
    produced, seconds = 0, 0.0
    orders = carryover_balanced_orders(len(measured))
    for p, prompt in enumerate(prompts):
        for position in orders[p % len(orders)]:
            m = measured[position]
            result = methods[m].run(prompt.ids, max_new_tokens)
            slots[m][p] = result
            produced += len(result.tokens)
            seconds += (result.prefill_ms + result.decode_ms) / 1000.0
            if progress is not None:
                progress(produced / seconds if seconds > 0 else math.nan)
    for run, results in zip(runs, slots, strict=True):
        same_as = run.method.same_as
        run.results = list(slots[index[same_as]]) if same_as is not None else results
    return runs


def speculative_method(name: str, decoder, scheduler, *, eos: Sequence[int],
                       info: dict[str, Any] | None = None) -> Method:
    """Decoding with ``decoder`` (a SpeculativeDecoder) and ``scheduler``'s trees."""

    def run(ids: list[int], max_new_tokens: int):
        return decoder.generate(ids, scheduler, max_new_tokens=max_new_tokens, eos_token_ids=eos)

    def ready(max_context: int) -> None:
        decoder.warm_up(scheduler, max_context=max_context)

    return Method(name, run, dict(info or {}), ready)


def autoregressive_method(model, *, eos: Sequence[int], engine: str = "auto",
                          graphs: bool = True) -> Method:
    """Plain greedy decoding on the runtime ``engine`` / ``graphs`` choose."""
    from entmtp.runtime import (
        StaticScheduler,
        autoregressive_generate,
        autoregressive_static_engine,
    )

    def run(ids: list[int], max_new_tokens: int):
        return autoregressive_generate(model, ids, max_new_tokens=max_new_tokens,
                                       eos_token_ids=eos, engine=engine, graphs=graphs)

    def ready(max_context: int) -> None:
        ar_engine = autoregressive_static_engine(model, engine=engine, graphs=graphs)
        if ar_engine is not None:
            ar_engine.warm_up(StaticScheduler(Tree.from_paths([])), max_context)

    return Method("autoregressive", run, {}, ready)


def runtime_report(decoders: Sequence[Any], model, *, engine: str, graphs: bool
                   ) -> dict[str, Any]:
    """The runtime the rows ran on: ``engine`` / ``graphs`` as given, the decoders' one-line
    note, every CUDA graph capture (time, memory growth) of their static engines and of the
    autoregressive one, and every capture that failed (its step ran without graphs).
    ``capture_memory_bytes`` is the engines' graph pools' growth (one pool per engine)."""
    from entmtp.runtime import autoregressive_static_engine

    notes = list(dict.fromkeys(d.runtime_note for d in decoders))
    engines = [("autoregressive", autoregressive_static_engine(model, engine=engine,
                                                                graphs=graphs))]
    engines += [(f"decoder {i}", d.static_engine) for i, d in enumerate(decoders)]
    engines = [(name, static) for name, static in engines if static is not None]
    captures = [{"runtime": name, "step": r.step, "capture_ms": r.capture_ms,
                 "memory_bytes": r.memory_bytes}
                for name, static in engines for r in static.capture_log]
    failures = [{"runtime": name, "step": f.step, "error": f.error}
                for name, static in engines for f in static.capture_failures]
    return {
        "engine": engine,
        "graphs": graphs,
        "runtime_note": notes[0] if len(notes) == 1 else notes,
        "graph_captures": len(captures),
        "capture_ms": sum(c["capture_ms"] for c in captures),
        "capture_memory_bytes": sum(static.graph_memory_bytes for _, static in engines),
        "captures": captures,
        "capture_failures": failures,
    }


def capture_line(runtime: dict[str, Any]) -> str | None:
    """One line on a ``runtime_report``'s CUDA graph captures and the captures that failed;
    None when there were neither."""
    count = runtime["graph_captures"]
    failures = runtime.get("capture_failures", [])
    parts = []
    if count:
        parts.append(f"captured {count} CUDA graph{'s' if count != 1 else ''} in "
                     f"{runtime['capture_ms']:.0f} ms, "
                     f"{runtime['capture_memory_bytes'] / 2**20:.1f} MiB of graph memory")
    if failures:
        many = len(failures) != 1
        parts.append(f"{len(failures)} capture{'s' if many else ''} failed, "
                     f"{'those steps run' if many else 'that step runs'} without graphs "
                     "(--no-graphs skips capture): "
                     + ", ".join(f"{f['runtime']} {f['step']} ({f['error']})" for f in failures))
    return "; ".join(parts) if parts else None


def tree_info(tree: Tree) -> dict[str, Any]:
    return {"num_nodes": tree.num_nodes, "depth": tree.depth}


def reference_for_heads(name: str, num_heads: int) -> tuple[Tree, bool]:
    """A shipped reference tree cut to the heads' depth (deeper paths dropped), and whether a
    cut was needed."""
    from entmtp.treesearch import reference_tree

    tree = reference_tree(name)
    if tree.depth <= num_heads:
        return tree, False
    return Tree.from_paths([p for p in tree.paths if len(p) <= num_heads]), True


# -- the replay of live trajectories ----------------------------------------------------------
def bundle_topk(topk: int | tuple[int, ...]) -> int:
    """The candidates per head a profile needs for a bundle's drafting top-k (the largest)."""
    return max(topk) if isinstance(topk, tuple) else int(topk)


def profile_live_trajectories(base, heads, prompts: Sequence[EncodedPrompt],
                              reference: MethodRuns, *, topk: int) -> Profile:
    """The profile of ``reference``'s outputs (greedy decoding of ``prompts``) with ``heads``:
    what the replay of these prompts needs."""
    from ._trajectory_profile import profile_trajectories

    return profile_trajectories(base, heads, [(p, p.ids) for p in prompts],
                                [r.tokens for r in reference.results], topk=topk)


def accept_only_latency() -> LatencyModel:
    """A flat latency model for replays whose step times are not used (accept lengths only)."""
    return LatencyModel((0,), (1.0,), autoregressive_ms=1.0)


@dataclass(frozen=True)
class ReplayCheck:
    """Live decoding with a schedule against its replay on the same trajectories."""

    replayed: ReplayResult  # the schedule replayed on the trajectories' profile
    comparison: StepComparison  # live steps against the replayed ones
    timed: bool  # the replay's step times come from a measured latency model

    def to_json(self) -> dict[str, Any]:
        comparison, replayed = self.comparison, self.replayed
        return {
            "replay_step_agreement": comparison.agreement,
            "steps_compared": comparison.steps_compared,
            "steps_equal": comparison.steps_equal,
            "max_estimate_difference": comparison.max_estimate_difference,
            "replayed_steps": replayed.steps,
            "replayed_decode_tokens": replayed.tokens,
            "replayed_mean_accept_length": replayed.mean_accept_length,
            # on the latency model, over these prompts' trajectories
            "replayed_tokens_per_second": replayed.tokens_per_second if self.timed else None,
            "mismatches": [m.to_json() for m in comparison.mismatches],
        }


def check_replay(profile: Profile, schedule: Schedule | Tree, latency: LatencyModel | None,
                 live: Sequence[Any], prompt_ids: Sequence[str]) -> ReplayCheck:
    """Replay ``schedule`` on ``profile`` (``latency`` None: accept lengths only) and compare
    the live results (``live[j]``: the decoding whose trajectory is trace ``j``) with it."""
    replayed = replay(profile, schedule, latency or accept_only_latency())
    return ReplayCheck(replayed, compare_steps(live, replayed, prompt_ids), latency is not None)


# -- live vs replayed steps -------------------------------------------------------------------
def step_tokens(result: Any) -> list[int]:
    """Tokens each live step added to the output (the replay's accept length): the next step's
    position less its own; the last step's run to the last generated token."""
    positions = [s.position for s in result.step_log]
    ends = [*positions[1:], len(result.tokens) - 1]
    return [end - position for position, end in zip(positions, ends, strict=True)]


@dataclass(frozen=True)
class StepMismatch:
    prompt_id: str
    position: int
    live_accept: int | None  # None: the live decoder ran no step here
    replayed_accept: int | None  # None: the replay ran no step here
    live_tree: int | None
    replayed_tree: int | None
    live_estimate: float | None
    replayed_estimate: float | None

    def to_json(self) -> dict[str, Any]:
        def num(x: float | None) -> float | None:
            return None if x is None or not math.isfinite(x) else float(x)

        return {"prompt_id": self.prompt_id, "position": self.position,
                "live_accept": self.live_accept, "replayed_accept": self.replayed_accept,
                "live_tree": self.live_tree, "replayed_tree": self.replayed_tree,
                "live_estimate": num(self.live_estimate),
                "replayed_estimate": num(self.replayed_estimate)}


@dataclass(frozen=True)
class StepComparison:
    steps_compared: int  # positions where either ran a step
    steps_equal: int  # ... where both ran one with the same accept length and tree
    max_estimate_difference: float  # over the equal steps where both estimated (0.0: none)
    mismatches: list[StepMismatch]

    @property
    def agreement(self) -> float:
        return self.steps_equal / self.steps_compared if self.steps_compared else 1.0


def compare_steps(
    live: Sequence[Any], replayed: ReplayResult, prompt_ids: Sequence[str]
) -> StepComparison:
    """Live steps against the replay's steps, position by position, prompt by prompt.

    ``live[j]`` (a DecodeResult) must be the decoding of the prompt whose trajectory is trace
    ``j`` of the replayed profile. A live step's accept length is the tokens it added to the
    output (``step_tokens``), which is what the replay books.
    """
    compared = equal = 0
    estimate_difference = 0.0
    mismatches: list[StepMismatch] = []
    for j, (result, prompt_id) in enumerate(zip(live, prompt_ids, strict=True)):
        mine = replayed.step_trace == j
        rep = {
            p: (a, k, e) for p, a, k, e in zip(
                replayed.step_position[mine].tolist(), replayed.step_accept[mine].tolist(),
                replayed.step_tree[mine].tolist(), replayed.step_estimate[mine].tolist(),
                strict=True)
        }
        own = {
            s.position: (a, s.tree_index, s.entropy_estimate)
            for s, a in zip(result.step_log, step_tokens(result), strict=True)
        }
        for position in sorted(set(rep) | set(own)):
            live_step, rep_step = own.get(position), rep.get(position)
            compared += 1
            if live_step is not None and rep_step is not None and live_step[:2] == rep_step[:2]:
                equal += 1
                if math.isfinite(live_step[2]) and math.isfinite(rep_step[2]):
                    estimate_difference = max(estimate_difference,
                                              abs(live_step[2] - rep_step[2]))
                continue
            mismatches.append(StepMismatch(
                prompt_id, position,
                _field(live_step, 0, int), _field(rep_step, 0, int),
                _field(live_step, 1, int), _field(rep_step, 1, int),
                _field(live_step, 2, float), _field(rep_step, 2, float),
            ))
    return StepComparison(compared, equal, estimate_difference, mismatches)


def _field(step: tuple | None, index: int, kind: type) -> Any:
    return None if step is None else kind(step[index])


# -- step times -------------------------------------------------------------------------------
def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(25th, 50th, 75th) percentiles; nan for no values."""
    if not values:
        return (math.nan, math.nan, math.nan)
    low, median, high = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return float(low), float(median), float(high)


@dataclass(frozen=True)
class StepSpread:
    """The spread of measured step times over every step of every prompt."""

    steps: int
    median_ms: float  # nan: no steps
    iqr_ms: float  # interquartile range; nan: no steps

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "median_ms": self.median_ms, "iqr_ms": self.iqr_ms}


def step_spread(results: Sequence[Any]) -> StepSpread:
    """Steps, median and interquartile range (ms) of the measured step times of decode
    results."""
    times = [step.step_ms for result in results for step in result.step_log]
    low, median, high = quartiles(times)
    return StepSpread(len(times), median, high - low)


@dataclass(frozen=True)
class TreeStepTime:
    """A tree's live step time against the latency model's, over the steps where the live
    decoder and the replay ran that tree at the same position."""

    tree: int  # index into the replay's trees
    num_nodes: int
    depth: int
    steps: int
    measured_ms: float  # mean live step time (draft + verify + bookkeeping)
    modelled_ms: float  # mean of the replay's booked step times (prepare / fusion included)
    measured_iqr_ms: float = math.nan  # interquartile range of the live step times

    @property
    def measured_over_modelled(self) -> float:
        return ratio(self.measured_ms, self.modelled_ms)

    def to_json(self) -> dict[str, Any]:
        return {"tree": self.tree, "num_nodes": self.num_nodes, "depth": self.depth,
                "steps": self.steps, "measured_ms": self.measured_ms,
                "modelled_ms": self.modelled_ms, "measured_iqr_ms": self.measured_iqr_ms,
                "measured_over_modelled": self.measured_over_modelled}


def step_times_by_tree(
    live: Sequence[Any], replayed: ReplayResult, prompt_ids: Sequence[str],
    trees: Sequence[Tree],
) -> list[TreeStepTime]:
    """Per tree, the mean measured and modelled step time over the steps both ran with it.

    Where a tree's ratio stands apart from the others, the latency model misprices that tree
    (the search then prefers or avoids it wrongly); a ratio shared by all trees is the machine
    running faster or slower than when the model was measured. ``live`` as in
    ``compare_steps``; ``trees[k]`` is the replay's tree ``k``.
    """
    measured: dict[int, list[float]] = {}
    modelled: dict[int, list[float]] = {}
    for j, (result, _) in enumerate(zip(live, prompt_ids, strict=True)):
        mine = replayed.step_trace == j
        booked = {p: (k, ms) for p, k, ms in zip(
            replayed.step_position[mine].tolist(), replayed.step_tree[mine].tolist(),
            replayed.step_ms[mine].tolist(), strict=True)}
        for step in result.step_log:
            match = booked.get(step.position)
            if match is None or match[0] != step.tree_index:
                continue
            measured.setdefault(match[0], []).append(step.step_ms)
            modelled.setdefault(match[0], []).append(match[1])
    out = []
    for k in sorted(measured):
        low, _, high = quartiles(measured[k])
        out.append(TreeStepTime(k, trees[k].num_nodes, trees[k].depth, len(measured[k]),
                                math.fsum(measured[k]) / len(measured[k]),
                                math.fsum(modelled[k]) / len(modelled[k]), high - low))
    return out
