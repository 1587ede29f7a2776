"""Measured step latency of draft trees on this machine, fitted to a treesearch ``LatencyModel``.

The profiler times the steps greedy decoding runs, on the runtime it runs them on
(``SpeculativeDecoder``'s ``engine`` and ``graphs``; ``hardware["engine"]`` says which). A step
is what a live decoding step costs: drafting with the heads, the verification forward, greedy
acceptance, cache compaction and the entropies its schedule reads. Each tree is timed at several
KV-cache lengths, every step from the same saved state of its context, so all repeats see the
same context. Trees per node budget: a chain-like one (as deep as the heads allow) and a wide one
(as shallow as the top-k allows), plus any trees given.

**Static engine** (``engine="auto"`` on a Llama-family model, or ``"static"``): the engine's own
step objects (runtime/_static_step.py), timed by ``StaticEngine.timed_run`` from launch to the
step's one readback, CUDA graphs replayed when on (captured before timing starts). The model is
fitted to that host-clock time, what a decoding step pays; on CUDA the run's time between two
CUDA events (the replay alone, no launch or readback overhead) is kept beside it, as
``hardware["cuda_event_points"]`` (one point per timed point, the same statistics). What each
field of the model holds, and what the replay (treesearch/_replay.py) charges with it:

- ``verify_ms`` (and ``depth_ms``): ``TreeStep(tree, base_entropy=True)``, a base-entropy
  schedule's step, exactly. A static tree's step (one-tree schedules) is the same without the
  path's entropies: the replay charges it this figure less ``entropy_readout_ms``, the empty
  step's figure over the autoregressive one (one row's readout, a lower bound for deeper trees).
  A draft-entropy schedule's drafted step drafts from the prepared heads and prepares the next
  state's at its end instead (the same head work, but Medusa prepares the schedule's deepest
  ``D`` rows where the tree's own ``d`` would do, and one entropy instead of ``d + 1``): the
  replay charges this figure plus ``(D - d) * head_row_ms``, the slope of the per-depth
  figures below.
- ``autoregressive_ms``: ``TreeStep(empty)`` with no entropies, ``autoregressive_generate``'s
  step (which runs it on an engine without heads; an empty tree never calls them).
- ``fused_empty_ms_by_depth[d - 1]`` (heads that fuse, ``fuses_with_base``):
  ``TreeStep(empty, prepare_depth=d, fuse=True)``, a depth-``d`` draft-entropy schedule's
  empty-tree step, exactly.
- ``prepare_ms_by_depth[d - 1]``: on this engine every draft-entropy step prepares the next
  state's heads at its own end (a ``PrepareStep`` after the prefill prepares the first, in the
  prefill's time), so nothing is prepared before a choice. With fusing heads the replay's
  charges (an empty step after a drafted one adds ``prepare``, a drafted step after an empty one
  saves it) must then be 0, and are: the field holds zeros and no prepare point is timed. With
  other heads (Hydra; Medusa without the shared lm_head) an empty tree's draft-entropy step is
  the plain empty step plus the preparation at its end, which is what the replay charges
  (``verify_ms[0] + prepare``): the field holds ``PrepareStep(d)`` timed alone (the same
  ``prepare`` call; alone it pays one more launch and readback, microseconds on a GPU).

One engine serves every context: the contexts are prefixes of one random prompt, prefilled
shortest first, each context's state buffers saved after its prefill; a timed step starts from
them and the cache slots it wrote are put back after it. Graphs read the past length from the
state, so one capture serves every context. With graphs the attention spans the whole reserved
cache (``hardware["cache_capacity"]``: the longest context plus the largest tree, rounded up as
the engine reserves), as in decoding, whose reserve is the prompt plus the new tokens.

**Eager runtime** (``engine="eager"``, and models the static engine cannot run): the decoder's
eager steps (``step``, ``prepare``, ``fused_empty_step``, a plain forward for the autoregressive
step), each context with its own prefilled cache, cut back after every step. There a
draft-entropy step prepares before its choice, unless a fused empty step before it did:
``prepare_ms`` is that preparation and ``fused_empty_ms`` the fused empty step, each timed alone.

Timing is interleaved: each round times one step of every tree (and one plain decode step) at
every context length, so a slow spell of a shared machine lands on all trees and contexts alike
instead of on whichever was being timed; ``warmup`` untimed rounds come first. Every point keeps
its spread (the interquartile range of its rounds, ``LatencyPoint``); the points of a check the
model fails (``LatencyModel.findings``: a fused empty step cheaper than a plain one, an
empty-tree step off an autoregressive one, a step that gets cheaper as the tree grows, rounds
spread too widely) are timed again in fresh rounds, a bounded number of times, and a model that
still fails carries the findings as warnings. Medusa heads prepare one projection row per level
of the schedule's deepest tree, so prepare and fused steps are timed for every draft depth
1..num_heads (``prepare_ms_by_depth`` / ``fused_empty_ms_by_depth``; the scalar fields hold the
deepest); Hydra's preparation is head 1 whatever the depth. A point's time is the trimmed mean
of its ``repeats`` (``TRIM`` cut at each end): the mean, because a decode's time is the sum of
its steps, trimmed so that one stray pause does not move it.

**Batch sizes** (static engine only; ``batch_size``): every step is the engine's step of
``batch_size`` rows (``StaticEngine.set_rows``), each row prefilled with its own random prompt
to the same context, so the rows verify the same tree at the same past length; the autoregressive
point is the plain step of as many rows. The model then prices one batch step
(``hardware["batch_size"]``); ``treesearch.BatchLatency`` holds one per batch size.

**Padded widths** (static engine only; the eager runtime never pads): every fit derives the
model's ``padded_nodes`` from the raw curve (``padding_table``: a node count verified at a
cheaper larger measured count), so the checks and the re-measurements judge the effective
curve the runtime will run. After the last re-measurement the padded steps themselves, the
engine's ``TreeStep`` of each measured tree at its padded width (as decoding runs it), are timed
in interleaved rounds and kept as points with ``padded_to`` (never fitted), which a check holds
against the price ``step_ms`` gives them.
"""

from __future__ import annotations

import datetime
import heapq
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from entmtp.core import EAGER_ENGINE, STATIC_ENGINE, EntmtpError, describe_machine
from entmtp.model import entropy_from_logits, linear_kernel
from entmtp.runtime import (
    DecodingState,
    SpeculativeDecoder,
    TreeStep,
    greedy_accept,
    greedy_choice,
    truncate_cache,
)
from entmtp.treesearch import LatencyModel, LatencyPoint, Tree, with_padding

DEFAULT_NODE_COUNTS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_CONTEXT_LENGTHS = (128, 512)
DEFAULT_REPEATS = 10
MIN_ROUNDS = 2  # timed rounds a deadline leaves every point (a spread needs two)
DEFAULT_REMEASURE = 2  # passes that time the points of failed checks again
TRIM = 0.1  # fraction of a point's timed steps cut at each end before the mean
# What each engine's steps book in the model's fields (the module doc has the details).
STATIC_BOOKING = (
    "static engine steps from launch to readback: verify_ms = base-entropy tree steps; "
    "autoregressive_ms = the empty tree's step without entropies; fused_empty_ms = the fused "
    "empty step of a draft-entropy schedule; prepare_ms = the preparation a draft-entropy step "
    "does at its end (0 for fusing heads: every step prepares the next inside its own time)")
EAGER_BOOKING = (
    "eager steps: verify_ms = step + commit + the path's entropies; autoregressive_ms = one "
    "plain step (DecodingState.plain_step, as eager autoregressive decoding); prepare_ms = the "
    "heads run before a draft-entropy choice; fused_empty_ms = the empty step whose projection "
    "also prepares the next")
# Which clock the fitted figures read (the model's ``hardware["clock"]``).
CLOCK = ("host clock, launch to readback (what a decoding step pays): every fitted figure; "
         "cuda_event_points, on CUDA only: CUDA events around the same runs, kept beside")
EAGER_CLOCK = "host clock, launch to the step's results on the host: every fitted figure"


def trimmed_mean(times: Sequence[float], trim: float = TRIM) -> float:
    """Mean of ``times`` without the ``floor(trim * n)`` smallest and largest values."""
    if not times:
        raise EntmtpError("no timings to average")
    if not 0.0 <= trim < 0.5:
        raise EntmtpError(f"trim must be in [0, 0.5), got {trim}")
    ordered = sorted(float(t) for t in times)
    cut = int(trim * len(ordered))
    return statistics.fmean(ordered[cut: len(ordered) - cut])


def budget_tree(num_nodes: int, depth: int, *, topk: int, num_heads: int) -> Tree:
    """A tree of exactly ``num_nodes`` nodes whose depth is ``depth`` where possible.

    The depth is clipped to ``[1, num_heads]`` and ``num_nodes``, and raised when ``topk``-wide
    levels cannot hold the nodes. Nodes are the rank-0 chain to that depth, then the paths with
    the smallest rank sums (shallower first), i.e. the shape of a typical searched tree.
    """
    if num_nodes <= 0:
        return Tree.from_paths([])
    target = min(max(depth, 1), num_heads, num_nodes)
    while True:
        capacity = sum(topk**d for d in range(1, target + 1))
        if capacity >= num_nodes or target >= num_heads:
            break
        target += 1
    if capacity < num_nodes:
        raise EntmtpError(
            f"a tree of {num_nodes} nodes does not fit {num_heads} heads of top-{topk}: measure "
            "fewer nodes"
        )
    chosen = {(0,) * d for d in range(1, target + 1)}
    heap: list[tuple[int, int, tuple[int, ...]]] = [(r, 1, (r,)) for r in range(topk)]
    heapq.heapify(heap)
    while len(chosen) < num_nodes:
        _, length, path = heapq.heappop(heap)
        if path not in chosen:
            chosen.add(path)
        if length < target:
            for r in range(topk):
                child = (*path, r)
                heapq.heappush(heap, (sum(child), length + 1, child))
    return Tree.from_paths(sorted(chosen))


def _unwrap_model(model: Any) -> torch.nn.Module:
    if hasattr(model, "get_output_embeddings"):
        return model
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "get_output_embeddings"):
        return inner
    raise EntmtpError(
        f"expected a transformers causal LM (or entmtp's BaseModel), got {type(model).__name__}"
    )


def hardware_info(model: torch.nn.Module) -> dict[str, Any]:
    """Where the measurement ran: the machine (``entmtp.core.describe_machine``, the same record
    every command writes), torch/transformers versions, dtype, attention and linear kernels."""
    import transformers

    weight = model.get_output_embeddings().weight
    device = weight.device
    return {
        **describe_machine(str(device), torch_threads=torch.get_num_threads()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(weight.dtype).replace("torch.", ""),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        # "onednn-packed", "few-row" or "torch" (model/_row_gemm.py)
        "linear_kernel": linear_kernel(model.get_output_embeddings()),
    }


def run_record(model: torch.nn.Module, /, **settings: Any) -> dict[str, Any]:
    """A benchmark's ``meta``: ``hardware_info(model)``, then its ``settings`` (which may
    override a key, e.g. ``torch_threads``), then the UTC ``date`` of the run."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return {**hardware_info(model), **settings, "date": now.strftime("%Y-%m-%d %H:%M UTC")}


def profile_latency(
    model: Any,
    heads: torch.nn.Module,
    *,
    node_counts: Sequence[int] = DEFAULT_NODE_COUNTS,
    depths: Sequence[int] | None = None,
    context_lengths: Sequence[int] = DEFAULT_CONTEXT_LENGTHS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = 2,
    trees: Iterable[Tree] | None = None,
    topk: int = 10,
    seed: int = 0,
    remeasure: int = DEFAULT_REMEASURE,
    clock: Any = None,
    engine: str = "auto",
    graphs: bool = True,
    deadline: float | None = None,
    wall_clock: Callable[[], float] = time.monotonic,
    batch_size: int = 1,
) -> LatencyModel:
    """Time trees of ``node_counts`` nodes (each at ``depths``, default 1 and all heads) and
    ``trees`` at every context length, and fit a ``LatencyModel`` (with ``autoregressive_ms``, a
    plain one-token decode step, the hardware it ran on, and every point with its spread).

    The points of a failed check (``LatencyModel.findings``) are timed again, in fresh
    interleaved rounds, at most ``remeasure`` times; a model that still fails carries the
    findings as its ``warnings``. ``clock``: an object whose ``now()`` gives ms (default: the
    decoder's, which waits for queued device work). ``engine`` / ``graphs``: as for
    ``SpeculativeDecoder``; the steps timed are those its greedy ``generate`` runs (the module
    doc says which); ``hardware`` records which.

    ``deadline`` (a ``wall_clock()`` value; None: none): the rounds stop early, after at least
    ``MIN_ROUNDS`` timed ones, where the next would end past it, and re-measure and padding
    passes past it are skipped; ``hardware`` then records ``stopped_by_deadline`` and the
    rounds every point got (``repeats``).

    ``batch_size``: time the static engine's steps of that many rows (module doc).
    """
    model = _unwrap_model(model)
    if int(batch_size) < 1:
        raise EntmtpError(f"batch size {batch_size}: give 1 or more sequences per step")
    if repeats < 1 or warmup < 0 or remeasure < 0:
        raise EntmtpError("latency profiling needs repeats >= 1, warmup >= 0 and remeasure >= 0")
    if not context_lengths or min(context_lengths) < 1:
        raise EntmtpError("latency profiling needs context lengths of at least 1 token")
    depths = tuple(depths) if depths is not None else (1, heads.num_heads)
    measured = _trees_to_measure(node_counts, depths, trees, topk=topk,
                                 num_heads=heads.num_heads)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    deepest = max(t.depth for t in measured)
    if max_positions and max(context_lengths) + deepest + 1 > max_positions:
        raise EntmtpError(
            f"context length {max(context_lengths)} plus a tree does not fit the model's "
            f"{max_positions} positions: measure shorter contexts"
        )
    contexts = [int(c) for c in dict.fromkeys(context_lengths)]
    timer = _StepTimer(model, heads, measured, contexts, topk=topk, seed=seed, clock=clock,
                       engine=engine, graphs=graphs, batch_size=int(batch_size))
    stopped = False  # by the deadline: fewer rounds, or a pass skipped

    def timed_rounds(keys: Sequence[_Key], rounds_warmup: int) -> dict[_Key, list[float]]:
        nonlocal stopped
        times, cut = timer.rounds(keys, warmup=rounds_warmup, repeats=repeats,
                                  deadline=deadline, wall_clock=wall_clock)
        stopped = stopped or cut
        return times

    def out_of_time() -> bool:
        nonlocal stopped
        late = deadline is not None and wall_clock() >= deadline
        stopped = stopped or late
        return late

    samples = timed_rounds(timer.keys, warmup)

    def fit(passes: int) -> LatencyModel:
        taken = min(len(samples[key]) for key in timer.keys)
        return _fit(timer, samples, context_lengths=contexts, repeats=taken, warmup=warmup,
                    topk=topk, heads=heads, passes=passes)

    def remeasure_failed(latency: LatencyModel, passes: int) -> tuple[LatencyModel, int]:
        for _ in range(remeasure):
            findings = latency.findings()
            again = [key for key in timer.keys
                     if any(f.involves(_point(timer, key, samples[key])) for f in findings)]
            if not again or out_of_time():
                break
            passes += 1
            samples.update(timed_rounds(again, min(warmup, 1)))
            latency = fit(passes)
        return latency, passes

    latency, passes = remeasure_failed(fit(0), 0)
    # Out of time, the padded widths the curve suggests stay as derived, untimed.
    padded_keys = [] if out_of_time() else timer.add_padded(latency.padding)
    if padded_keys:
        # In the same rounds as the steps they are priced at: a padded step is checked against
        # that price, and a drift of the machine between two phases would read as a dear step.
        samples.update(timed_rounds(padded_keys + timer.priced_keys(padded_keys), warmup))
        latency, passes = remeasure_failed(fit(passes), passes)
    if stopped:
        latency = replace(latency, hardware={**latency.hardware, "stopped_by_deadline": True})
    return latency


# A timed point: (step kind, index, context); index is the tree's (tree steps; "padded": the
# tree at its padded width) or the draft depth (prepare / fused_empty), 0 for the autoregressive
# step.
_Key = tuple[str, int, int]


class _StepTimer:
    """Times steps of every kind at every context, on the runtime greedy decoding runs (the
    decoder's static engine, else its eager steps); ``keys`` lists the points, contexts
    interleaved."""

    def __init__(self, model, heads, trees: list[Tree], contexts: list[int], *, topk: int,
                 seed: int, clock: Any, engine: str = "auto", graphs: bool = True,
                 batch_size: int = 1) -> None:
        self.model = model
        self.trees = trees
        self.batch_size = batch_size
        self.decoder = SpeculativeDecoder(model, heads, topk=topk, engine=engine, graphs=graphs)
        self.clock = clock if clock is not None else self.decoder.clock
        self.draft_depths = self.decoder.drafter.prepare_depths()
        generator = torch.Generator().manual_seed(seed)
        vocab = model.get_output_embeddings().weight.shape[0]
        shape = (max(contexts),) if batch_size == 1 else (batch_size, max(contexts))
        prompt = torch.randint(0, vocab, shape, generator=generator)
        self.steps = fixed_context_steps(self.decoder, trees, prompt, contexts, clock=self.clock)
        self.order = torch.Generator().manual_seed(seed + 1)  # of the keys in each round
        # CUDA-event ms of the timed rounds' runs (static engine on CUDA), beside the host ms
        self.device_times: dict[_Key, list[float]] = {}
        self._timed_round = False
        self.keys: list[_Key] = []
        for length in contexts:
            self.keys += [("tree", i, length) for i in range(len(trees))]
            self.keys.append(("autoregressive", 0, length))
            for depth in self.draft_depths:
                if self.steps.books_prepare:
                    self.keys.append(("prepare", depth, length))
                if self.decoder.fuses_empty:
                    self.keys.append(("fused_empty", depth, length))

    def rounds(self, keys: Sequence[_Key], *, warmup: int, repeats: int,
               deadline: float | None = None,
               wall_clock: Callable[[], float] = time.monotonic,
               ) -> tuple[dict[_Key, list[float]], bool]:
        """``warmup`` untimed then ``repeats`` timed rounds; each round times one step of every
        key (contexts interleaved), so a slow spell lands on all of them alike, in an order
        drawn afresh for each round, so that what runs before a step (a large tree's step
        leaves the caches cold) is noise spread over every key, not a bias of some. With a
        ``deadline``, stops after a round (``MIN_ROUNDS`` timed ones at least) when the next
        would end past it, judged by the longest round so far; returns the times and whether
        it stopped early."""
        times: dict[_Key, list[float]] = {key: [] for key in keys}
        self.device_times.update({key: [] for key in keys})
        longest = 0.0
        for round_index in range(warmup + repeats):
            started = wall_clock()
            self._timed_round = round_index >= warmup
            for position in torch.randperm(len(keys), generator=self.order).tolist():
                key = keys[position]
                elapsed = self.time(key)
                if round_index >= warmup:
                    times[key].append(elapsed)
            now = wall_clock()
            longest = max(longest, now - started)
            timed = round_index + 1 - warmup
            last = round_index + 1 == warmup + repeats
            if (deadline is not None and not last and timed >= min(MIN_ROUNDS, repeats)
                    and now + longest > deadline):
                return times, True
        return times, False

    def time(self, key: _Key) -> float:
        """Host ms of one step at ``key``, the figure the model fits; the same run's CUDA-event
        ms (where there is one) goes to ``device_times``."""
        host_ms, device_ms = self.steps.timing(key)
        if device_ms is not None and self._timed_round:
            self.device_times.setdefault(key, []).append(device_ms)
        return host_ms

    def event_points(self) -> list[dict[str, Any]]:
        """The points of ``device_times`` as the model's points (``LatencyPoint.to_json``)."""
        return [_point(self, key, self.device_times[key]).to_json() for key in self.keys
                if self.device_times.get(key)]

    @property
    def pads(self) -> bool:
        """Whether the runtime timed verifies trees at padded widths (the static engine)."""
        return isinstance(self.steps, _StaticSteps)

    def add_padded(self, padding: dict[int, int]) -> list[_Key]:
        """Keys of the measured trees that ``padding`` pads, at their padded widths (contexts
        interleaved; none on a runtime that does not pad); ``keys`` then lists them too."""
        if not self.pads:
            return []
        padded = {i: padding[t.num_nodes] for i, t in enumerate(self.trees)
                  if t.num_nodes in padding}
        if not padded:
            return []
        self.steps.add_padded(padded)
        keys = [("padded", i, length) for length in self.steps.contexts for i in padded]
        self.keys += [key for key in keys if key not in self.keys]
        return keys

    def priced_keys(self, padded_keys: Sequence[_Key]) -> list[_Key]:
        """Keys of the unpadded trees ``padded_keys`` are verified at (every depth measured
        at that node count), at the same contexts."""
        keys = []
        for _, index, length in padded_keys:
            width = self.steps.padded_steps[index].width - 1
            keys += [("tree", i, length) for i, tree in enumerate(self.trees)
                     if tree.num_nodes == width and ("tree", i, length) not in keys]
        return keys

    def describe(self) -> dict[str, Any]:
        """What was timed, for the model's ``hardware`` record."""
        events = self.event_points()
        return {"runtime_note": self.decoder.runtime_note, **self.steps.describe(),
                "clock": CLOCK if self.pads else EAGER_CLOCK,
                **({"cuda_event_points": events} if events else {})}


def fixed_context_steps(
    decoder: SpeculativeDecoder, trees: Sequence[Tree], prompt: torch.Tensor,
    contexts: Sequence[int], *, clock: Any = None,
) -> _StaticSteps | _EagerSteps:
    """The profiler's timed steps on ``decoder``'s greedy runtime at ``contexts`` (prefixes of
    ``prompt`` [P], P >= every context; or [rows, P]: the static engine's batch steps, each row
    prefilled with its own): ``time((kind, index, context))`` is the ms of one step from that
    context's saved state, which it restores after. Kinds: ``tree`` (index: into ``trees``),
    ``autoregressive``, and by draft depth ``prepare`` (when ``books_prepare``) and
    ``fused_empty`` (fusing heads). ``clock``: default the decoder's."""
    runner = _StaticSteps if decoder.static_engine is not None else _EagerSteps
    if runner is _EagerSteps and prompt.dim() == 2 and prompt.shape[0] > 1:
        raise EntmtpError(f"batched steps run on the static runtime only, and this one runs "
                          f"eagerly: {decoder.runtime_note}")
    return runner(decoder, list(trees), [int(c) for c in contexts],
                  decoder.drafter.prepare_depths(), prompt,
                  clock if clock is not None else decoder.clock)


class _StaticSteps:
    """The static engine's own steps (``StaticEngine.timed_run``: launch to readback, graphs
    replayed on CUDA), each from the saved state of its context; the cache slots a step writes
    are put back after it.

    One engine serves every context: the contexts are prefixes of one random prompt, prefilled
    shortest first, so the cache holds the longest and each context's state (past length,
    pending token, hidden state, prepared heads) is saved after its own prefill. Graphs read the
    past length from the state, so one capture of a step serves every context.
    """

    def __init__(self, decoder: SpeculativeDecoder, trees: list[Tree], contexts: list[int],
                 draft_depths: list[int], prompt: torch.Tensor, clock: Any) -> None:
        engine = decoder.static_engine
        self.engine, self.clock = engine, clock
        self.trees, self.contexts = trees, contexts
        self.prompt = prompt if prompt.dim() == 2 else prompt[None]  # [rows, P]
        engine.set_rows(self.prompt.shape[0])
        empty = Tree.from_paths([])
        # Base-entropy schedules' steps; a static tree's skip the entropies, a draft-entropy
        # schedule's drafted steps draft from the prepared heads and prepare at their end.
        # Raw widths: the curve the padding table is derived from.
        self.tree_steps = [engine.tree_step(tree, base_entropy=True, width=tree.num_nodes + 1)
                           for tree in trees]
        self.padded_steps: dict[int, TreeStep] = {}  # by tree index, once the table is known
        self.autoregressive = engine.tree_step(empty)  # autoregressive_generate's step
        # Fusing heads: every draft-entropy step prepares the next at its end (an empty one in
        # its projection), so no step prepares before its choice: the replay's prepare charge
        # is 0. Otherwise an empty tree's draft-entropy step adds the preparation at its end.
        self.books_prepare = not decoder.fuses_empty
        self.prepare = ({d: engine.prepare_step(d) for d in draft_depths}
                        if self.books_prepare else {})
        self.fused = ({d: engine.tree_step(empty, prepare_depth=d, fuse=True)
                       for d in draft_depths} if decoder.fuses_empty else {})
        self.preparing = engine.prepare_step(max(draft_depths))
        steps = [*self.tree_steps, self.autoregressive, *self.prepare.values(),
                 *self.fused.values(), self.preparing]
        with torch.inference_mode():
            # Padded widths are measured node counts: no padded step needs more room.
            engine.reserve(max(contexts) + max(step.cache_width for step in steps))
            engine.reserve_prepared()
        self._capture_and_prefill(steps)

    @torch.inference_mode()
    def _capture_and_prefill(self, steps: list) -> None:
        """Capture ``steps`` (before the prefills: a capture's warm-up writes cache slots), then
        prefill every context and save its state."""
        engine = self.engine
        engine.capture(steps)
        self.states: dict[int, list[torch.Tensor]] = {}
        prompt = self.prompt.to(engine.device)
        for length in sorted(self.contexts):
            for row, row_prompt in enumerate(prompt):
                engine.prefill(row_prompt[:length], row)
            engine.run(self.preparing, length)
            self.states[length] = engine.save_state()

    def add_padded(self, widths: dict[int, int]) -> None:
        """The steps of trees ``widths`` keys (indices) at those padded node counts: the
        engine's own padded ``TreeStep``, as decoding with the table runs it."""
        for index, padded in widths.items():
            tree = self.trees[index]
            self.padded_steps[index] = self.engine.tree_step(tree, base_entropy=True,
                                                             width=padded + 1)
        if self.engine.graphs:  # captures write cache slots: prefill the contexts again
            self._capture_and_prefill(list(self.padded_steps.values()))

    def step(self, key: _Key):
        kind, index, _ = key
        if kind == "tree":
            return self.tree_steps[index]
        if kind == "padded":
            return self.padded_steps[index]
        if kind == "autoregressive":
            return self.autoregressive
        return self.prepare[index] if kind == "prepare" else self.fused[index]

    def time(self, key: _Key) -> float:
        """Host ms of one step at ``key`` (``timing``'s first figure)."""
        return self.timing(key)[0]

    @torch.inference_mode()
    def timing(self, key: _Key) -> tuple[float, float | None]:
        """Host ms of one step at ``key``, launch to readback, and on CUDA its ms between two
        CUDA events (``StaticEngine.timed_run``; None elsewhere)."""
        engine, length = self.engine, key[2]
        step = self.step(key)
        engine.restore_state(self.states[length])
        slots = slice(length, length + step.cache_width)
        kept = engine.cache[..., slots, :].clone()  # a longer context's prompt sits there
        timed = engine.timed_run(step, length, self.clock.now)
        engine.cache[..., slots, :] = kept
        return timed.host_ms, timed.device_ms

    def describe(self) -> dict[str, Any]:
        engine = self.engine
        log = engine.capture_log
        return {
            "engine": STATIC_ENGINE, "graphs": engine.graphs,
            "window": "full" if engine.full_window else "filled",
            "cache_capacity": engine.capacity,
            "graph_captures": len(log),
            "capture_ms": sum(r.capture_ms for r in log),
            "capture_memory_bytes": engine.graph_memory_bytes,  # the graph pool's growth
            **({"capture_failures": [f.line for f in engine.capture_failures]}
               if engine.capture_failures else {}),
            "booking": STATIC_BOOKING,
        }


class _EagerSteps:
    """The eager runtime's steps (``SpeculativeDecoder.step`` and friends, and
    ``DecodingState.plain_step`` for the autoregressive one); each context keeps its own
    prefilled state and cache, cut back after every step."""

    books_prepare = True

    def __init__(self, decoder: SpeculativeDecoder, trees: list[Tree], contexts: list[int],
                 draft_depths: list[int], prompt: torch.Tensor, clock: Any) -> None:
        self.decoder, self.clock = decoder, clock
        self.empty_plan = decoder.plan(Tree.from_paths([]))
        self.plans = [decoder.plan(tree) for tree in trees]
        self.states: dict[int, tuple[DecodingState, tuple]] = {}
        for length in contexts:
            state, _ = decoder.prefill(prompt[:length], greedy_choice)
            self.states[length] = (state, (state.past_len, state.pending, state.hidden))

    def timing(self, key: _Key) -> tuple[float, None]:
        """Host ms of one step at ``key``; no device time (no CUDA events on this runtime)."""
        return self.time(key), None

    def time(self, key: _Key) -> float:
        step, index, length = key
        state, saved = self.states[length]
        decoder = self.decoder
        start = self.clock.now()
        with torch.inference_mode():
            if step == "tree":
                outcome = decoder.step(state, self.plans[index], greedy_accept)
                decoder.commit(state, outcome, outcome.path)
                entropy_from_logits(outcome.logits[outcome.path]).tolist()
            elif step == "autoregressive":
                state.plain_step(decoder.model)
            elif step == "prepare":  # reads the state only
                prepared = decoder.prepare(state, index)
                float(entropy_from_logits(prepared.first_logits))
            else:  # an empty-tree step that also prepares the next step's heads
                outcome, prepared = decoder.fused_empty_step(state, self.empty_plan,
                                                             greedy_accept, index)
                decoder.commit(state, outcome, outcome.path)
                float(entropy_from_logits(prepared.first_logits))  # the next step's choice
        elapsed = self.clock.now() - start
        truncate_cache(state.cache, length)
        state.past_len, state.pending, state.hidden = saved
        return elapsed

    def describe(self) -> dict[str, Any]:
        return {"engine": EAGER_ENGINE, "graphs": False, "booking": EAGER_BOOKING}


def _point(timer: _StepTimer, key: _Key, times: Sequence[float]) -> LatencyPoint:
    step, index, length = key
    low, median, high = (float(q) for q in np.percentile(times, [25, 50, 75]))
    tree = timer.trees[index] if step in ("tree", "padded") else None
    return LatencyPoint(
        step="tree" if step == "padded" else step, context=length, ms=trimmed_mean(times),
        median_ms=median, iqr_ms=max(high - low, 0.0), rounds=len(times),
        nodes=tree.num_nodes if tree is not None else 0,
        depth=tree.depth if tree is not None else index,
        padded_to=timer.steps.padded_steps[index].width - 1 if step == "padded" else 0,
    )


def _fit(timer: _StepTimer, samples: dict[_Key, list[float]], *, context_lengths: list[int],
         repeats: int, warmup: int, topk: int, heads, passes: int) -> LatencyModel:
    points = [_point(timer, key, samples[key]) for key in timer.keys]
    rows = [(p.nodes, p.depth, p.ms) for p in points if p.step == "tree" and not p.padded_to]

    def mean_of(step: str, depth: int | None = None) -> float | None:
        chosen = [p.ms for p in points
                  if p.step == step and (depth is None or p.depth == depth)]
        return statistics.fmean(chosen) if chosen else None

    autoregressive = {p.context: p.ms for p in points if p.step == "autoregressive"}
    hardware = {
        **hardware_info(timer.model),
        "context_lengths": context_lengths,
        "repeats": int(repeats),
        "warmup": int(warmup),
        "statistic": f"trimmed mean ({TRIM:.0%} cut at each end) of interleaved rounds "
                     "(contexts interleaved too); spread: interquartile range of the rounds",
        "remeasure_passes": passes,
        "topk": int(topk),
        "head_type": getattr(heads, "head_type", ""),
        "num_heads": int(heads.num_heads),
        # the tokens each draft projection scores: the vocabulary, or the heads' subset of it
        "draft_vocab_size": int(getattr(heads, "draft_vocab_size",
                                        getattr(heads, "vocab_size", 0))),
        "autoregressive_ms_by_context": {str(k): v for k, v in autoregressive.items()},
        "batch_size": timer.batch_size,  # sequences per timed step
        **timer.describe(),
    }
    depths = timer.draft_depths
    # Unbooked (the static engine with fusing heads): no step prepares before its choice.
    prepare_by_depth = [mean_of("prepare", d) if timer.steps.books_prepare else 0.0
                        for d in depths]
    fused_by_depth = [m for d in depths if (m := mean_of("fused_empty", d)) is not None]
    per_depth = len(depths) > 1
    model = LatencyModel.from_measurements(
        rows,
        autoregressive_ms=statistics.fmean(autoregressive.values()),
        prepare_ms=prepare_by_depth[-1],
        fused_empty_ms=fused_by_depth[-1] if fused_by_depth else None,
        prepare_ms_by_depth=prepare_by_depth if per_depth else (),
        fused_empty_ms_by_depth=fused_by_depth if per_depth else (),
        hardware=hardware,
    )
    model = replace(model, points=tuple(points))
    return with_padding(model) if timer.pads else model


def _trees_to_measure(
    node_counts: Sequence[int], depths: Sequence[int], trees: Iterable[Tree] | None, *,
    topk: int, num_heads: int,
) -> list[Tree]:
    if not node_counts and not trees:
        raise EntmtpError("latency profiling needs node counts or trees to measure")
    if any(n < 0 for n in node_counts):
        raise EntmtpError(f"node counts must be >= 0, got {list(node_counts)}")
    if any(d < 1 for d in depths):
        raise EntmtpError(f"tree depths must be >= 1, got {list(depths)}")
    out: list[Tree] = []
    for n in sorted(set(int(n) for n in node_counts)):
        for depth in depths:
            tree = budget_tree(n, int(depth), topk=topk, num_heads=num_heads)
            if tree not in out:
                out.append(tree)
    for tree in trees or ():
        tree.check_fits(topk=topk, num_heads=num_heads)
        if tree not in out:
            out.append(tree)
    return out

