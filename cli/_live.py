"""Shared pieces of the live-decoding commands (validate, bench, decode): loading a bundle with
its model and heads, encoding prompts, running decoding methods side by side, profiling the
generated trajectories and comparing live steps with the exact replay."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from entmtp.core import atomic_write_json
from entmtp.treesearch import Bundle, EntmtpError, LatencyModel, Profile, load_bundle
from entmtp.treesearch._profile import ProfileMeta, Trace
from entmtp.treesearch._replay import ReplayResult

from ._model_setup import (  # noqa: F401 - re-exported for the live commands
    HEAD_TYPES,
    load_base,
    load_heads_for,
    quiet_transformers,
)

# Medusa's drafting default (FasterDecoding/Medusa, TOPK = 10): the reference trees' candidates.
REFERENCE_TOPK = 10
WARMUP_TOKENS = 4  # tokens of the unmeasured warm-up run of each method


# -- loading ----------------------------------------------------------------------------------
def read_bundle(source: Path) -> tuple[Path, Bundle]:
    from ._export import resolve_bundle_path  # command modules import `app`: not at import time

    path = resolve_bundle_path(Path(source))
    return path, load_bundle(path)


def check_bundle_fits(bundle: Bundle, base, heads) -> None:
    """One-line ``EntmtpError`` when the bundle was calibrated for another model or head set."""
    bundle.check_compatible(
        vocab_size=base.vocab_size,
        hidden_size=base.hidden_size,
        head_type=heads.head_type,
        num_heads=heads.num_heads,
        heads_sha256=heads.sha256(),
    )


def check_head_type(head_type: str | None) -> None:
    if head_type is not None and head_type not in HEAD_TYPES:
        raise EntmtpError(f"--head-type {head_type!r}: use one of {', '.join(HEAD_TYPES)}")


# -- prompts ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EncodedPrompt:
    index: int  # TaskPrompt.index: position in the task's full list
    prompt_id: str
    ids: list[int]


def task_for(task: str | None, data: str | None, fallback: str | None) -> str:
    """The task to load: the option, else the bundle's task; any valid name labels ``--data``."""
    from entmtp.calibrate._tasks import TASKS

    if task is not None:
        if task not in TASKS:
            raise EntmtpError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
        return task
    if fallback in TASKS:
        return str(fallback)
    if data is not None:
        return TASKS[0]
    raise EntmtpError(
        f"the bundle's task {fallback!r} is not a built-in task: pass --task "
        f"({', '.join(TASKS)}) or --data FILE.jsonl"
    )


def load_task_prompts(*, task: str, data: str | None, split: str, num_prompts: int,
                      seed: int) -> list[Any]:
    """TaskPrompts (loaded before the model, so that bad prompt options fail fast)."""
    from entmtp.calibrate._tasks import load_prompts

    return load_prompts(task, data=data, split=split, num_prompts=num_prompts, seed=seed)


def encode_prompts(base, prompts: Sequence[Any], max_new_tokens: int) -> list[EncodedPrompt]:
    """Token ids of each TaskPrompt, as the profiler encodes them."""
    encoded = []
    for prompt in prompts:
        ids = base.encode_task_prompt(prompt)
        if not ids:
            raise EntmtpError(f"prompt {prompt.prompt_id} encodes to no tokens: drop it")
        base.check_fits_context(prompt.prompt_id, len(ids), max_new_tokens)
        encoded.append(EncodedPrompt(prompt.index, prompt.prompt_id, list(ids)))
    return encoded


def check_max_new_tokens(max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise EntmtpError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")


# -- methods and their measured totals --------------------------------------------------------
@dataclass
class Method:
    """One way of decoding a prompt: ``run(ids, max_new_tokens) -> DecodeResult``."""

    name: str
    run: Callable[[list[int], int], Any]
    info: dict[str, Any] = field(default_factory=dict)  # heads, tree sizes ... for the report
    # makes the runtime ready for contexts up to n tokens (cache reserved, graphs captured)
    ready: Callable[[int], None] | None = None


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


def run_side_by_side(
    methods: Sequence[Method],
    prompts: Sequence[EncodedPrompt],
    *,
    max_new_tokens: int,
    console: Console,
    description: str,
) -> list[MethodRuns]:
    """Every method on every prompt, interleaved: prompt ``p`` runs the methods in an order
    rotated by ``p``, so drift in machine load spreads over all methods. Each method first
    decodes a few tokens unmeasured (warm-up: lazy initialisation, plan caches)."""
    from ._calibrate import progress_bar
    runs = [MethodRuns(m) for m in methods]
    if not prompts:
        return runs
    longest = max(len(p.ids) for p in prompts) + max_new_tokens
    for method in methods:
        if method.ready is not None:
            method.ready(longest)
        method.run(prompts[0].ids, min(WARMUP_TOKENS, max_new_tokens))
    slots: list[list[Any]] = [[None] * len(prompts) for _ in methods]
    with progress_bar(console) as bar:
        job = bar.add_task(description, total=len(prompts) * len(methods), rate="")
        produced, seconds = 0, 0.0
        for p, prompt in enumerate(prompts):
            shift = p % len(methods)
            for m in [*range(shift, len(methods)), *range(shift)]:
                result = methods[m].run(prompt.ids, max_new_tokens)
                slots[m][p] = result
                produced += len(result.tokens)
                seconds += (result.prefill_ms + result.decode_ms) / 1000.0
                rate = f"{produced / seconds:.1f} tok/s" if seconds > 0 else ""
                bar.update(job, advance=1, rate=rate)
    for run, results in zip(runs, slots, strict=True):
        run.results = results
    return runs


def speculative_method(name: str, decoder, scheduler, *, eos: Sequence[int],
                       info: dict[str, Any] | None = None) -> Method:
    def run(ids: list[int], max_new_tokens: int):
        return decoder.generate(ids, scheduler, max_new_tokens=max_new_tokens, eos_token_ids=eos)

    def ready(max_context: int) -> None:
        decoder.warm_up(scheduler, max_context=max_context)

    return Method(name, run, dict(info or {}), ready)


def autoregressive_method(model, *, eos: Sequence[int], engine: str = "auto",
                          graphs: bool = True) -> Method:
    from entmtp.runtime._decode import autoregressive_generate, autoregressive_static_engine

    def run(ids: list[int], max_new_tokens: int):
        return autoregressive_generate(model, ids, max_new_tokens=max_new_tokens,
                                       eos_token_ids=eos, engine=engine, graphs=graphs)

    def ready(max_context: int) -> None:
        ar_engine = autoregressive_static_engine(model, engine=engine, graphs=graphs)
        if ar_engine is not None:
            from entmtp.runtime._scheduler import StaticScheduler
            from entmtp.treesearch._tree import Tree

            ar_engine.warm_up(StaticScheduler(Tree.from_paths([])), max_context)

    return Method("autoregressive", run, {}, ready)


def runtime_report(decoders: Sequence[Any], model, *, engine: str, graphs: bool
                   ) -> dict[str, Any]:
    """The runtime the rows ran on: ``--engine`` / ``--graphs`` as given, the decoders' one-line
    note, and every CUDA graph capture (time, memory growth) of their static engines and of the
    autoregressive one."""
    from entmtp.runtime._decode import autoregressive_static_engine

    notes = list(dict.fromkeys(d.runtime_note for d in decoders))
    engines = [("autoregressive", autoregressive_static_engine(model, engine=engine,
                                                                graphs=graphs))]
    engines += [(f"decoder {i}", d.static_engine) for i, d in enumerate(decoders)]
    captures = [{"runtime": name, "step": r.step, "capture_ms": r.capture_ms,
                 "memory_bytes": r.memory_bytes}
                for name, static in engines if static is not None for r in static.capture_log]
    return {
        "engine": engine,
        "graphs": graphs,
        "runtime_note": notes[0] if len(notes) == 1 else notes,
        "graph_captures": len(captures),
        "capture_ms": sum(c["capture_ms"] for c in captures),
        "capture_memory_bytes": sum(c["memory_bytes"] for c in captures),
        "captures": captures,
    }


def tree_info(tree) -> dict[str, Any]:
    return {"num_nodes": tree.num_nodes, "depth": tree.depth}


def reference_for_heads(name: str, num_heads: int):
    """A shipped reference tree cut to the heads' depth (deeper paths dropped), and whether a
    cut was needed."""
    from entmtp.treesearch import Tree
    from entmtp.treesearch._run import reference_tree

    tree = reference_tree(name)
    if tree.depth <= num_heads:
        return tree, False
    return Tree.from_paths([p for p in tree.paths if len(p) <= num_heads]), True


# -- profiling the generated trajectories -----------------------------------------------------
def profile_trajectories(
    base, heads, prompts: Sequence[EncodedPrompt], trajectories: Sequence[Sequence[int]], *,
    topk: int, batch_size: int = 8, task: str = "", split: str = "",
) -> Profile:
    """The profile of given greedy trajectories (e.g. the autoregressive outputs): the
    profiler's teacher-forced scoring, without generating again."""
    import torch

    from entmtp.calibrate._profiler import score_trajectories

    traces: list[Trace] = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            chunk = list(range(start, min(start + batch_size, len(prompts))))
            scored = score_trajectories(
                base.model, heads, [prompts[i].ids for i in chunk],
                [list(trajectories[i]) for i in chunk], topk=topk,
            )
            for i, result in zip(chunk, scored, strict=True):
                traces.append(Trace(prompts[i].index, prompts[i].prompt_id, result.entropy,
                                    result.ranks, prompt_length=len(prompts[i].ids),
                                    draft_entropy=result.draft_entropy))
    meta = ProfileMeta(
        model=base.name, vocab_size=base.vocab_size, hidden_size=base.hidden_size,
        head_type=heads.head_type, num_heads=heads.num_heads, heads_sha256=heads.sha256(),
        task=task, topk=topk, split=split,
        max_new_tokens=max((len(t) for t in trajectories), default=0),
    )
    return Profile(meta, traces)


def accept_only_latency() -> LatencyModel:
    """A flat latency model for replays whose step times are not used (accept lengths only)."""
    return LatencyModel((0,), (1.0,), autoregressive_ms=1.0)


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


@dataclass
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


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(25th, 50th, 75th) percentiles; nan for no values."""
    if not values:
        return (math.nan, math.nan, math.nan)
    import numpy as np

    low, median, high = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return float(low), float(median), float(high)


def step_spread(results: Sequence[Any]) -> dict[str, Any]:
    """The spread of the measured step times of decode results: steps, median and
    interquartile range (ms) over every step of every prompt."""
    times = [step.step_ms for result in results for step in result.step_log]
    low, median, high = quartiles(times)
    return {"steps": len(times), "median_ms": median, "iqr_ms": high - low}


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
    live: Sequence[Any], replayed: ReplayResult, prompt_ids: Sequence[str], trees: Sequence[Any],
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


def _field(step: tuple | None, index: int, kind: type) -> Any:
    return None if step is None else kind(step[index])


# -- output -----------------------------------------------------------------------------------
def write_json(path: Path | None, payload: dict[str, Any], console: Console) -> None:
    if path is None:
        return
    try:
        atomic_write_json(path, _finite(payload))
    except OSError as err:
        raise EntmtpError(f"cannot write {path}: {err.strerror}; choose another --json") from err
    console.print(f"wrote {path}")


def _finite(value: Any) -> Any:
    """JSON has no NaN / Infinity: write them as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")
