"""Static-shape decoding steps: one step object per tree, graph-ready, one readback per step.

``StaticEngine`` owns a preallocated KV cache (``StaticLlama``'s, sized for prompt + max new
tokens + the largest tree) and the decoding state as persistent device buffers: the pending
token, the hidden state of the last cached position and the past length. For each tree of a
scheduler (the empty tree, i.e. the autoregressive step, included) it builds one ``TreeStep``
whose index tensors come from the tree's ``TreePlan``. A step drafts (the ``Drafter``), verifies
(one forward over the tree), accepts greedily (the longest path of nodes whose token is the
argmax of their parent's logits, ties to the first leaf, as ``greedy_accept``), compacts the
accepted path inside the cache (``compact_static_cache``) and updates the state buffers, all as
tensor ops of fixed shapes with no host sync. Its outputs stay on the device until the host reads
them with one copy of one buffer, ``out``, whose views are ``out_ints`` = [accepted length, next
token, tokens of the accepted path padded to depth + 1] and ``out_floats`` = [base entropies
of the accepted path's logits (base-signal schedules), head 1's entropy at the new state
(draft-entropy schedules)].

Draft-entropy schedules choose a step's tree from head 1's entropy at the step's state, so every
step of such a schedule ends by preparing the next state (the heads' first results, as the eager
``prepare``; a ``PrepareStep`` does it once after the prefill) and the host reads that entropy
with the step's other outputs. An empty-tree step whose Medusa heads share the lm_head prepares
in the same projection as its base logits (``[hidden; head features]``, the eager fused empty
step, ``fused_empty_ms``). Per generation the heads run as often as in the eager runtime, plus
one preparation after the last step; the latency model's per-step prepare cost (booked on the
step it serves) describes the same work.

The accepted path is committed whole. The host cuts drafts after an EOS or past
``max_new_tokens``, which only happens on a generation's last step, so the state the cut would
change is never read again.

On CUDA with ``graphs`` each step is captured as a CUDA graph on first use (warm-up on a side
stream, then capture; the state buffers are restored after every warm-up run) and replayed;
attention then reads the whole static cache under a mask that blocks the unfilled slots. On the
CPU (no graphs) attention reads only the filled slots (``window="filled"``), since dynamic shapes
cost nothing there; ``window="full"`` runs the graph-shaped step on any device (tests).

**Batches.** An engine decodes ``rows`` sequences together (``set_rows``; one by default), every
row verifying the same tree in one forward: the cache is ``[layers, 2, rows, kv_heads, capacity,
head_dim]`` and the state holds each row's pending token, hidden state and past length as
tensors ``[rows]``. Each row writes its tree at its own cache slots (its past length on), attends
to its own past under a per-row mask, accepts and compacts its own path; a finished row is masked
out (``finish``: its past length stops moving, its outputs are never read), so the step keeps
its shapes and graphs. With one row the step is the unbatched one: the same ops on ``[1, ...]``
tensors, the cache written at one set of slots and, on the filled window, the plan's own mask.
Prompts are prefilled one row at a time (``prefill(prompt, row)``), each as it would be alone.

**Captures.** All captures of an engine share one side stream and one graph memory pool (as
vLLM and SGLang capture theirs), so graph memory is about the largest step's, not the sum of
every step's: a step's outputs and the state live in buffers allocated outside the pool, and
steps replay one at a time on one stream, so one step's intermediates may reuse another's. A
reallocated cache makes every graph stale: they are dropped together, and the next captures
share a new pool. A capture's memory is the growth of the allocator's reserved memory with the
cache emptied before and after, i.e. the pool's growth. The heads' draft-vocabulary rows are
refreshed before a capture, and a rebuild inside one raises (it would record rows that are never
computed). A capture that fails never ends the run: the state is restored, one line says which
step failed and why (``capture_failures`` keeps it), and that step runs without graphs from
then on, never captured again.

**Padded widths.** A CPU matmul's time may depend on the row count's alignment (a kernel
can run 16 rows faster than 12), so a tree may be cheaper to verify at the width of a larger
one. ``padded_nodes`` (the latency model's table: node count -> the node count it is verified
at) makes an ``n``-node tree's step run ``w = padded + 1`` rows: the ``q = n + 1`` tree rows,
then ``w - q`` padding rows whose token is the pending token at the root's position. Padding rows
attend to the past and to themselves; no tree row attends to them (``padded_tree_mask``), so the
tree rows' results are the unpadded step's, up to the kernels' rounding for another row count.
They are never in ``retrieve`` (never accepted), their keys and values go to the cache slots
after the tree's (the step's ``cache_width`` is ``w``: the reserve counts it) and compaction
moves only the accepted path. Empty trees (the autoregressive and fused empty steps) are never
padded.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from entmtp.core import EntmtpError
from entmtp.model import StaticLlama, compact_static_cache, entropy_from_logits
from entmtp.treesearch import Tree, padding_summary

from ._drafter import Drafter
from ._engine import reads_base_entropy, reads_draft_entropy
from ._records import PhaseTimes, Prefilled, StepMarks, StepRun
from ._scheduler import Scheduler
from ._tree_attention import TreePlan, tree_plan

WINDOWS = ("filled", "full")
CAPACITY_QUANTUM = 128  # the cache grows in whole multiples: fewer re-captures
GRAPH_WARMUP_RUNS = 2


@dataclass(frozen=True)
class CaptureRecord:
    """One CUDA graph capture."""

    step: str  # which step: "tree q=<nodes+1> depth=<d>" or "prepare"
    capture_ms: float  # warm-up + capture wall time
    memory_bytes: int  # growth of the reserved memory, cache emptied before and after: the pool's


@dataclass(frozen=True)
class CaptureFailure:
    """A step whose CUDA graph capture failed; it runs without graphs from then on."""

    step: str  # the step's name, as ``CaptureRecord.step``
    error: str  # the first line of the first error the capture raised

    @property
    def line(self) -> str:
        return (f"CUDA graph capture of {self.step} failed: {self.error}; this step runs "
                "without graphs (--no-graphs skips capture)")


@dataclass(frozen=True)
class StepTiming:
    """One timed run of a step (``StaticEngine.timed_run``)."""

    host_ms: float  # host clock, launch to readback: what a decoding step pays
    device_ms: float | None  # CUDA events around the run (the replay); None off CUDA


@dataclass(frozen=True)
class StepOptions:
    """Which variant of each tree's step a scheduler needs."""

    base_entropy: bool  # output the accepted path's base entropies (base-signal schedules)
    prepare_depth: int  # > 0: draft-entropy schedule; prepare the next state for this depth
    fuse_empty: bool  # empty trees prepare in their base projection (Medusa, shared lm_head)

    @classmethod
    def of(cls, scheduler: Scheduler, fuses_empty: bool) -> StepOptions:
        by_draft = reads_draft_entropy(scheduler)
        max_depth = max((tree.depth for tree in scheduler.trees), default=0)
        return cls(
            base_entropy=reads_base_entropy(scheduler),
            prepare_depth=max(max_depth, 1) if by_draft else 0,
            fuse_empty=by_draft and fuses_empty,
        )


@dataclass(frozen=True)
class StepReadback:
    """What the host reads after a step."""

    length: int  # accepted path length, root included
    next_token: int
    path_tokens: list[int]  # tokens of the accepted path, root first
    base_entropies: list[float]  # of the path's logits (empty unless requested)
    draft_entropy: float  # head 1's entropy at the new state (nan unless the step prepared)


class StaticEngine:
    """Static-shape steps for ``model`` drafting with ``drafter`` (None: autoregressive only).

    ``topk``: candidates per head for the trees' plans. ``graphs``: capture steps as CUDA
    graphs (CUDA only; ignored elsewhere). ``window``: ``filled`` (attend over the filled cache
    slots only; CPU default) or ``full`` (the whole cache under a mask: fixed shapes; CUDA
    default, required for graphs). ``padded_nodes``: node count -> the node count its tree is
    verified at (the latency model's ``padding``; see the module doc); None or empty: unpadded.
    """

    def __init__(
        self, model: torch.nn.Module, drafter: Drafter | None, *, topk: int | tuple[int, ...] = 1,
        graphs: bool = True, window: str | None = None,
        padded_nodes: Mapping[int, int] | None = None,
    ) -> None:
        self.net = StaticLlama(model)
        self.drafter = drafter
        self.topk = topk
        self.device, self.dtype = self.net.device, self.net.dtype
        self.graphs = bool(graphs) and self.device.type == "cuda"
        if window is None:
            window = "full" if self.device.type == "cuda" else "filled"
        if window not in WINDOWS:
            raise EntmtpError(f"window {window!r} is unknown: use one of {', '.join(WINDOWS)}")
        if self.graphs and window != "full":
            raise EntmtpError("CUDA graphs need window='full' (fixed shapes)")
        self.full_window = window == "full"
        self.padded_nodes = check_padding(padded_nodes)
        self.cache: torch.Tensor | None = None  # [layers, 2, rows, kv_heads, capacity, head_dim]
        self.columns: torch.Tensor | None = None  # [capacity] int64: arange(capacity)
        self.capacity = 0
        self.generation = 0  # bumped when the cache is reallocated: graphs capture its address
        self.rows = 1  # sequences decoded together
        self._allocate_state()
        # [rows, prepared_rows, V'] heads' first logits (draft signal)
        self.prepared: torch.Tensor | None = None
        self._steps: dict[tuple, TreeStep] = {}  # by (tree, flags)
        self._steps_by_id: dict[tuple, tuple[Tree, TreeStep]] = {}  # the same, by id(tree)
        self._prepare_steps: dict[int, PrepareStep] = {}
        self.capture_log: list[CaptureRecord] = []
        self.capture_failures: list[CaptureFailure] = []
        self.graph_memory_bytes = 0  # the current graph pool's growth over its captures
        self.timing_events = self.device.type == "cuda"  # timed_run also reads CUDA events
        self._pool: tuple[int, int] | None = None  # graph pool handle of the current buffers
        self._stream: torch.cuda.Stream | None = None  # the side stream of every capture
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    # -- buffers ---------------------------------------------------------------------------
    def _allocate_state(self) -> None:
        rows, device = self.rows, self.device
        self.pending = torch.zeros(rows, dtype=torch.int64, device=device)  # [rows]
        # [rows, hidden]: final-norm hidden state of each row's last cached position
        self.hidden = torch.zeros(rows, self.net.hidden_size, dtype=self.dtype, device=device)
        self.past_len = torch.zeros(rows, dtype=torch.int64, device=device)  # [rows]
        self.live = torch.ones(rows, dtype=torch.int64, device=device)  # [rows] 1: decoding

    @torch.inference_mode()
    def set_rows(self, rows: int) -> None:
        """Decode ``rows`` sequences together from now on. Another count reallocates the state,
        the cache and the prepared buffer and drops every step (their outputs are per row) and
        graph."""
        rows = int(rows)
        if rows < 1:
            raise EntmtpError(f"a batch needs at least one row, got {rows}")
        if rows == self.rows:
            return
        self._drop_graphs()
        self._steps.clear()
        self._steps_by_id.clear()
        self._prepare_steps.clear()
        self.rows = rows
        self._allocate_state()
        capacity, self.capacity = self.capacity, 0
        self.cache = None
        if capacity:
            self.reserve(capacity)
        if self.prepared is not None:
            self.prepared = None
            self.reserve_prepared()

    @torch.inference_mode()
    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` cache slots per row (reallocating drops every captured
        graph)."""
        if capacity <= self.capacity:
            return
        capacity = -(-capacity // CAPACITY_QUANTUM) * CAPACITY_QUANTUM
        self._drop_graphs()
        self.cache = None  # free the old cache before allocating the new one
        self.cache = self.net.new_cache(capacity, batch=self.rows)
        self.columns = torch.arange(capacity, device=self.device)
        self.capacity = capacity

    @torch.inference_mode()
    def finish(self, rows: Iterable[int]) -> None:
        """Mask ``rows`` out: their past lengths stop moving (steps still compute them)."""
        for row in rows:
            self.live[row] = 0

    def reserve_prepared(self) -> None:
        """The buffer of the heads' first results: one row per Medusa head (a schedule whose
        deepest tree has depth ``d`` uses rows ``:d``), Hydra's head 1. Allocated once, so
        schedules of any depth share it and every captured graph."""
        if self.prepared is not None:
            return
        heads = self.drafter.heads
        rows = self.drafter.prepared_rows
        dtype = heads.projection_weight(1)[0].dtype if hasattr(heads, "projection_weight") \
            else self.dtype
        columns = getattr(heads, "draft_vocab_size", heads.vocab_size)
        self._drop_graphs()
        self.prepared = torch.zeros(self.rows, rows, columns, dtype=dtype, device=self.device)

    def _drop_graphs(self) -> None:
        """A buffer the graphs captured the address of is reallocated: every graph is stale.
        Dropped together, they free their pool; the next captures share a new one."""
        self.generation += 1
        for step in [*self._steps.values(), *self._prepare_steps.values()]:
            step.graph = None
        self._pool = None
        self.graph_memory_bytes = 0

    def state_tensors(self) -> list[torch.Tensor]:
        tensors = [self.pending, self.hidden, self.past_len, self.live]
        return tensors + ([self.prepared] if self.prepared is not None else [])

    def save_state(self) -> list[torch.Tensor]:
        """A copy of the state buffers. With ``restore_state`` a step can run again from the
        same state (warm-up, timing): a step writes cache slots at or after the past length
        only, which the next step writes before it reads them."""
        return [t.clone() for t in self.state_tensors()]

    def restore_state(self, saved: list[torch.Tensor]) -> None:
        for tensor, value in zip(self.state_tensors(), saved, strict=True):
            tensor.copy_(value)

    # -- steps -----------------------------------------------------------------------------
    def width_of(self, tree: Tree) -> int:
        """Rows ``tree``'s step verifies: its tokens, or its padded node count's plus one."""
        if tree.num_nodes == 0:
            return 1
        return self.padded_nodes.get(tree.num_nodes, tree.num_nodes) + 1

    def tree_step(self, tree: Tree, *, base_entropy: bool = False, prepare_depth: int = 0,
                  fuse: bool = False, width: int | None = None) -> TreeStep:
        """The (cached) step of ``tree``.

        ``base_entropy``: output the accepted path's base entropies. ``prepare_depth`` > 0
        (draft-entropy schedules): draft from the prepared buffer and prepare the next state
        for trees of depth <= ``prepare_depth``. ``fuse``: an empty tree whose Medusa heads
        share the lm_head prepares in its base projection. ``width``: rows to verify (>= the
        tree's tokens; None: ``width_of(tree)``, the engine's padding).
        """
        width = self.width_of(tree) if width is None else int(width)
        flags = (base_entropy, prepare_depth, fuse, width)
        known = self._steps_by_id.get((id(tree), *flags))
        if known is not None:  # holding the tree keeps its id from being reused
            return known[1]
        # Keyed by the tree's paths (Tree compares by value): equal trees of different
        # schedulers share one step and its graph.
        step = self._steps.get((tree, *flags))
        if step is None:
            plan = tree_plan(tree, self.topk, self.device)
            step = TreeStep(self, plan, base_entropy=base_entropy, prepare_depth=prepare_depth,
                            fuse=fuse, width=width)
            self._steps[(tree, *flags)] = step
        self._steps_by_id[(id(tree), *flags)] = (tree, step)
        return step

    def step_for(self, tree: Tree, options: StepOptions) -> TreeStep:
        return self.tree_step(tree, base_entropy=options.base_entropy,
                              prepare_depth=options.prepare_depth,
                              fuse=options.fuse_empty and tree.num_nodes == 0)

    @torch.inference_mode()
    def warm_up(self, scheduler: Scheduler, max_context: int, *, fuses_empty: bool = False,
                rows: int | None = None) -> None:
        """Reserve the cache for contexts up to ``max_context`` (prompt + new tokens; for
        ``rows`` sequences when given) and build every step ``scheduler`` may run; with graphs
        also capture them now, so that decoding never pays a capture (else each step is
        captured on its first use)."""
        if rows is not None:
            self.set_rows(rows)
        options = StepOptions.of(scheduler, fuses_empty)
        steps: list[TreeStep | PrepareStep] = [self.step_for(t, options) for t in scheduler.trees]
        self.reserve(max_context + max(step.cache_width for step in steps))
        if options.prepare_depth:
            self.reserve_prepared()
            steps.append(self.prepare_step(options.prepare_depth))
        self.capture(steps)

    @torch.inference_mode()
    def capture(self, steps: Iterable[TreeStep | PrepareStep]) -> None:
        """With graphs, capture each of ``steps`` now that is not captured for the current
        buffers (nothing otherwise), so that no later run pays a capture. A capture's warm-up
        runs from the current state and writes cache slots at or after its past length."""
        if self.graphs:
            for step in steps:
                self._ensure_graph(step)

    def prepare_step(self, max_depth: int) -> PrepareStep:
        step = self._prepare_steps.get(max_depth)
        if step is None:
            step = PrepareStep(self, max_depth)
            self._prepare_steps[max_depth] = step
        return step

    @torch.inference_mode()
    def prefill(self, prompt: torch.Tensor, row: int = 0) -> torch.Tensor:
        """Run ``prompt`` [P] into row ``row``'s cache from slot 0; set the row's state (live
        again); return its last logits [V].

        Not captured (its shape is the prompt's). The pending token is the logits' argmax.
        """
        length = int(prompt.shape[0])
        positions = torch.arange(length, device=self.device)
        causal = torch.ones(length, length, dtype=torch.bool, device=self.device).tril()
        if self.full_window:
            mask = torch.zeros(length, self.capacity, dtype=torch.bool, device=self.device)
            mask[:, :length] = causal
            kv_len = None
        else:
            mask, kv_len = causal, length
        hidden = self.net.backbone(self.cache[:, :, row], prompt, positions, positions, mask,
                                   kv_len)
        last = hidden[-1:]
        logits = self.net.logits(last)[0]
        self.pending[row] = logits.argmax()
        self.hidden[row] = last[0]
        self.past_len[row] = length
        self.live[row] = 1
        return logits

    @torch.inference_mode()
    def run(self, step: TreeStep | PrepareStep, past_len: int) -> None:
        """Run ``step`` at host-known ``past_len`` (replaying its graph when graphs are on and
        its capture did not fail)."""
        graph = self._ensure_graph(step) if self.graphs else None
        if graph is None:
            step.body(past_len)
        else:
            graph.replay()

    @torch.inference_mode()
    def timed_run(self, step: TreeStep | PrepareStep, past_len: int,
                  clock: Callable[[], float] | None = None) -> StepTiming:
        """One run of ``step`` from the current state, launch to readback as decoding runs it
        by ``clock``, and on CUDA the run (the replay) alone between two CUDA events; the state
        is restored afterwards, so a profiler can time every tree at one fixed context (the
        step writes cache slots at or after ``past_len`` only: a caller that keeps other data
        there restores it). ``clock``: ms now (default: the host's ``perf_counter``; a clock
        that waits for queued device work keeps earlier work out of the step's time). Capture
        the step first (``capture``), or its first run includes the capture."""
        clock = clock if clock is not None else _host_ms
        saved = self.save_state()
        events = self._timing_events() if self.timing_events else None
        start = clock()
        if events is not None:
            events[0].record()
        self.run(step, past_len)
        if events is not None:
            events[1].record()
        step.readback()
        host_ms = clock() - start
        device_ms = None
        if events is not None:
            events[1].synchronize()
            device_ms = float(events[0].elapsed_time(events[1]))
        self.restore_state(saved)
        return StepTiming(host_ms, device_ms)

    def _timing_events(self) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        if self._events is None:
            self._events = (torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True))
        return self._events

    def _ensure_graph(self, step: TreeStep | PrepareStep) -> torch.cuda.CUDAGraph | None:
        """The step's graph for the current buffers, captured now if it has none; None once a
        capture of the step failed (it then runs without graphs, never captured again)."""
        if step.capture_error is not None:
            return None
        if step.graph is None or step.graph_generation != self.generation:
            step.graph = None
            step.graph = self._capture(step)
            step.graph_generation = self.generation
        return step.graph

    def _capture(self, step: TreeStep | PrepareStep) -> torch.cuda.CUDAGraph | None:
        """Warm up and capture ``step`` (``_record``), timing it and measuring the pool's growth;
        the state buffers are restored whatever happens. A failure is kept in
        ``capture_failures``, printed as one line and marks the step (None: no graph)."""
        self._refresh_heads()
        reserved = self._reserved_memory()
        start = time.perf_counter()
        original = self.save_state()
        errors: list[BaseException] = []
        graph = None
        try:
            graph = self._record(step, errors)
        except Exception as error:  # whatever failed, the step runs without graphs instead
            if not errors:
                errors.append(error)
        finally:
            self.restore_state(original)
            torch.cuda.synchronize(self.device)
        if graph is None:
            failure = CaptureFailure(step.name, _first_line(errors[0]))
            step.capture_error = failure.error
            self.capture_failures.append(failure)
            print(failure.line, file=sys.stderr, flush=True)
            return None
        grown = self._reserved_memory() - reserved
        self.graph_memory_bytes += grown
        self.capture_log.append(CaptureRecord(step.name, (time.perf_counter() - start) * 1000.0,
                                              grown))
        return graph

    def _record(self, step: TreeStep | PrepareStep, errors: list[BaseException]
                ) -> torch.cuda.CUDAGraph:
        """Warm up ``step`` on the engine's side stream, restoring the state after each run,
        then capture it there into the engine's graph pool (PyTorch's documented recipe: static
        inputs, no host sync inside). An error of the step's body goes to ``errors`` first: the
        capture context's exit then raises its own, second error."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        side = self._stream
        # The warm-up runs from the live state unless its past length (left by an earlier
        # generation, whose cache the next prefill overwrites) leaves no room for the step's
        # cache writes. Mid-generation the reserve always leaves that room.
        self.past_len.clamp_(max=self.capacity - step.cache_width)
        warm = self.save_state()
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_RUNS):
                step.body(None)
                self.restore_state(warm)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with self._heads_frozen(), torch.cuda.graph(graph, pool=self._pool, stream=side):
            try:
                step.body(None)
            except Exception as error:
                errors.append(error)
                raise
        return graph

    def _reserved_memory(self) -> int:
        """The allocator's reserved memory with its unused cached blocks released (a graph's
        pool keeps its own), so that two readings differ by what stayed allocated."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        return int(torch.cuda.memory_reserved(self.device))

    def _refresh_heads(self) -> None:
        refresh = getattr(getattr(self.drafter, "heads", None), "refresh_draft_rows", None)
        if refresh is not None:
            refresh()

    @contextmanager
    def _heads_frozen(self) -> Iterator[None]:
        """The heads refuse to rebuild their draft rows inside (a capture records, not runs)."""
        heads = getattr(self.drafter, "heads", None)
        freezes = hasattr(heads, "draft_rows_frozen")
        if freezes:
            heads.draft_rows_frozen = True
        try:
            yield
        finally:
            if freezes:
                heads.draft_rows_frozen = False


class TreeStep:
    """Draft, verify, accept and compact one tree (``plan``) from the engine's state buffers."""

    def __init__(self, engine: StaticEngine, plan: TreePlan, *, base_entropy: bool,
                 prepare_depth: int, fuse: bool, width: int | None = None) -> None:
        if (plan.depth or prepare_depth) and engine.drafter is None:
            raise EntmtpError("a tree with drafted nodes needs draft heads")
        if fuse and (plan.num_nodes or not prepare_depth
                     or not engine.drafter.can_fuse_with_base):
            raise EntmtpError("only an empty tree with Medusa heads fuses the next preparation")
        width = plan.size if width is None else int(width)
        if width < plan.size or (width > plan.size and plan.num_nodes == 0):
            raise EntmtpError(f"a tree of {plan.num_nodes} nodes cannot be verified at width "
                              f"{width}: use at least {plan.size} rows (an empty tree: 1)")
        self.engine = engine
        self.plan = plan
        self.base_entropy = base_entropy
        self.prepare_depth = int(prepare_depth)
        self.fuse = bool(fuse)
        self.width = width  # rows verified: the tree's q, then padding rows
        self.cache_width = width  # cache slots it writes after the past length
        self.name = (f"tree q={plan.size} depth={plan.depth}"
                     + (f" width={width}" if width > plan.size else "")
                     + (f" prepare={prepare_depth}" if prepare_depth else "")
                     + (" fused" if fuse else ""))
        device = engine.device
        path_width = plan.depth + 1
        padding = width - plan.size
        self.rows = engine.rows
        self.slots = torch.arange(width, device=device)  # [w] cache slot offsets
        # [w] rotary position offsets: node depths, then the root's for the padding rows
        self.depths = torch.cat([plan.depths, plan.depths.new_zeros(padding)])
        self.tree_mask = plan.padded_tree_mask(width)  # [w, w] bool
        self.keep_slots = torch.arange(path_width, device=device)  # [D+1]
        self.root_only = self.slots[: plan.size] == 0  # [q] bool
        self.row_index = torch.arange(self.rows, device=device)  # [rows]
        self.ones = torch.ones(self.rows, dtype=torch.int64, device=device)  # [rows]
        self.root_path = torch.zeros(self.rows, 1, dtype=torch.int64, device=device)  # [rows, 1]
        # One buffer, so one host read per step; per row [length, next token, path tokens
        # (D+1)] as int64, then the float32 entropies (D+2) in the words after them.
        self.out, self.out_ints, self.out_floats = _readback_buffer(
            2 + path_width, path_width + 1, device, self.rows)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_generation = -1
        self.capture_error: str | None = None  # why its capture failed: it runs without graphs

    def readback(self) -> list[StepReadback]:
        """The host's one read of the step's outputs (the only sync of a step), per row."""
        ints, floats = _read(self.out, self.out_ints.shape[1], self.out_floats.shape[1])
        return [
            StepReadback(
                length=row_ints[0], next_token=row_ints[1],
                path_tokens=row_ints[2 : 2 + row_ints[0]],
                base_entropies=row_floats[: row_ints[0]] if self.base_entropy else [],
                draft_entropy=row_floats[-1] if self.prepare_depth else math.nan,
            )
            for row_ints, row_floats in zip(ints, floats, strict=True)
        ]

    # The phases: ``body`` runs them in a row; a timed run syncs between them.
    def draft(self) -> torch.Tensor:
        """Tokens [rows, q] of the tree's nodes, root first."""
        engine, plan = self.engine, self.plan
        if plan.depth == 0:
            return engine.pending[:, None]
        prepared = (engine.drafter.prepared_view(engine.prepared, self.prepare_depth)
                    if self.prepare_depth else None)
        return engine.drafter.draft(plan, engine.pending, engine.hidden, prepared)

    def verify(self, tokens: torch.Tensor, past_len: int | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Hidden states [rows, w, H] and logits [rows, w, V] of the tree's ``tokens``
        [rows, q] and the padding rows (w = q unpadded); when fused also the next step's
        prepared heads [rows, prepare_depth, V']. ``past_len``: the longest row's past length
        (the filled window reads the slots before it and the step's)."""
        engine = self.engine
        past = engine.past_len  # [rows]
        mask, kv_len = self._mask(past_len)
        padding = self.width - self.plan.size
        if padding:  # any valid token: the pending one (the root's)
            tokens = torch.cat([tokens, engine.pending[:, None].expand(self.rows, padding)],
                               dim=1)
        # One row writes one set of slots (index_copy); several, each row its own (scatter).
        slots = self.slots + past if self.rows == 1 else self.slots + past[:, None]
        hidden = engine.net.backbone(engine.cache, tokens, self.depths + past[:, None], slots,
                                     mask, kv_len)
        if self.fuse:
            logits, prepared = engine.drafter.project_with_base(hidden[:, 0], self.prepare_depth)
            return hidden, logits[:, None], prepared.logits
        return hidden, engine.net.logits(hidden.flatten(0, 1)).unflatten(0, hidden.shape[:2]), \
            None

    def _mask(self, past_len: int | None) -> tuple[torch.Tensor | None, int | None]:
        """The attention mask [rows, w, kv] (bool, or the plan's additive one for one row on
        the filled window) and the slots read (None: the whole cache)."""
        engine, width = self.engine, self.width
        columns = engine.columns
        kv_len = None
        if not engine.full_window:
            if past_len is None:
                raise EntmtpError("a filled-window step needs the host's past length")
            kv_len = past_len + width
            if self.rows == 1:
                if width == 1:
                    return None, kv_len
                return self.plan.attention_mask(past_len, engine.dtype, width)[0], kv_len
            columns = columns[:kv_len]
        relative = columns[None, :] - engine.past_len[:, None]  # [rows, kv]: slot - past
        in_tree = (relative >= 0) & (relative < width)
        tree_part = self.tree_mask.index_select(1, relative.clamp(0, width - 1).flatten())
        tree_part = tree_part.unflatten(1, relative.shape).transpose(0, 1)  # [rows, w, kv]
        return (relative < 0)[:, None, :] | (tree_part & in_tree[:, None, :]), kv_len

    def accept(self, tokens: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor,
               prepared: torch.Tensor | None) -> None:
        """Greedy acceptance, compaction, outputs and the state update of every row (tensor
        ops only)."""
        engine, plan = self.engine, self.plan
        logits = logits[:, : plan.size]  # [rows, q]: the padding rows are never accepted
        argmax = logits.argmax(dim=-1)  # [rows, q]
        if plan.num_nodes == 0:
            length = self.ones  # [rows]
            path = self.root_path  # [rows, 1]: the root
            next_token = argmax[:, 0]
            leaf_hidden = hidden[:, 0]
        else:
            node_ok = (tokens == argmax[:, plan.parents]) | self.root_only  # [rows, q]
            ok = node_ok[:, plan.retrieve] & plan.retrieve_valid  # [rows, leaves, D+1]
            lengths = ok.to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # [rows, leaves]
            best = lengths.argmax(dim=1)  # [rows]: each row's first longest, as greedy_accept
            length = lengths.gather(1, best[:, None])[:, 0]  # [rows]
            path = plan.retrieve.index_select(0, best)  # [rows, D+1], 0-padded
            leaf = path.gather(1, (length - 1)[:, None])[:, 0]  # [rows]
            next_token = argmax[self.row_index, leaf]
            leaf_hidden = hidden[self.row_index, leaf]
            compact_static_cache(engine.cache, engine.past_len, path, self.keep_slots)
        self.out_ints.copy_(torch.cat([length[:, None], next_token[:, None],
                                       tokens.gather(1, path)], dim=1))
        width = plan.depth + 1
        if self.base_entropy:
            self.out_floats[:, :width].copy_(
                entropy_from_logits(logits[self.row_index[:, None], path]))
        if prepared is not None:
            _store_prepared(engine, prepared, self.out_floats[:, width:])
        engine.pending.copy_(next_token)
        engine.hidden.copy_(leaf_hidden)
        engine.past_len.add_(length * engine.live)

    def prepare_next(self) -> None:
        """The heads' first results at the new state (unless fused into ``verify``)."""
        if self.prepare_depth and not self.fuse:
            _prepare_into(self.engine, self.prepare_depth,
                          self.out_floats[:, self.plan.depth + 1 :])

    def body(self, past_len: int | None) -> None:
        tokens = self.draft()
        hidden, logits, prepared = self.verify(tokens, past_len)
        self.accept(tokens, hidden, logits, prepared)
        self.prepare_next()

    def timed(self, past_len: int, clock: Callable[[], float]) -> tuple[float, float, float]:
        """``body`` with a clock read (a device sync) after each phase: draft (the next state's
        preparation included), verify and bookkeeping milliseconds. Never captured."""
        t0 = clock()
        tokens = self.draft()
        t1 = clock()
        hidden, logits, prepared = self.verify(tokens, past_len)
        t2 = clock()
        self.accept(tokens, hidden, logits, prepared)
        t3 = clock()
        self.prepare_next()
        t4 = clock()
        return (t1 - t0) + (t4 - t3), t2 - t1, t3 - t2


class PrepareStep:
    """The heads' first results at the state (for trees of depth <= ``max_depth``) into the
    engine's prepared buffer, and head 1's entropy into ``out_floats`` [1]."""

    def __init__(self, engine: StaticEngine, max_depth: int) -> None:
        self.engine = engine
        self.max_depth = int(max_depth)
        self.name = "prepare"
        self.cache_width = 0
        self.out_floats = torch.zeros(engine.rows, 1, dtype=torch.float32,
                                      device=engine.device)  # [rows, 1]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_generation = -1
        self.capture_error: str | None = None  # why its capture failed: it runs without graphs

    def body(self, past_len: int | None) -> None:
        _prepare_into(self.engine, self.max_depth, self.out_floats)

    def readback(self) -> list[float]:
        """Head 1's entropy at each row's state."""
        return self.out_floats[:, 0].tolist()


def check_padding(padded_nodes: Mapping[int, int] | None) -> dict[int, int]:
    """``padded_nodes`` as a dict of ints; raises ``EntmtpError`` unless every entry pads a
    drafted tree (n >= 1) to at least its own node count."""
    table = {int(n): int(m) for n, m in (padded_nodes or {}).items()}
    bad = [(n, m) for n, m in table.items() if n < 1 or m < n]
    if bad:
        n, m = bad[0]
        raise EntmtpError(f"padding {n} -> {m} nodes: a tree of n >= 1 nodes pads to m >= n "
                          "nodes; fix the latency model's padded_nodes")
    return {n: m for n, m in table.items() if m > n}


def padding_note(padded_nodes: Mapping[int, int]) -> str:
    """``""``, or "; trees verified at padded widths: 2->3, 11-14->15 nodes", for a one-line
    runtime note."""
    summary = padding_summary(dict(padded_nodes))
    return f"; trees verified at padded widths: {summary}" if summary else ""


def _readback_buffer(num_ints: int, num_floats: int, device: torch.device, rows: int = 1
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An int64 buffer [rows, num_ints + ceil(num_floats / 2)], its int64 view
    [rows, num_ints] and a float32 view [rows, num_floats] of the words after those
    (nan-filled): a step writes both, the host copies the one buffer."""
    buffer = torch.zeros(rows, num_ints + -(-num_floats // 2), dtype=torch.int64, device=device)
    floats = buffer[:, num_ints:].view(torch.float32)[:, :num_floats]
    floats.fill_(math.nan)
    return buffer, buffer[:, :num_ints], floats


def _read(buffer: torch.Tensor, num_ints: int, num_floats: int
          ) -> tuple[list[list[int]], list[list[float]]]:
    """One device-to-host copy of a ``_readback_buffer``: each row's ints and floats."""
    words = buffer.cpu().numpy()
    floats = np.ascontiguousarray(words[:, num_ints:]).view(np.float32)[:, :num_floats]
    return words[:, :num_ints].tolist(), floats.tolist()


def _host_ms() -> float:
    return time.perf_counter() * 1000.0


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__


def _prepare_into(engine: StaticEngine, max_depth: int, entropy_out: torch.Tensor) -> None:
    """``prepare`` at the engine's state into its prepared buffer; head 1's entropy into
    ``entropy_out`` [rows, 1]."""
    prepared = engine.drafter.prepare(engine.pending, engine.hidden, max_depth)
    _store_prepared(engine, prepared.logits, entropy_out)


def _store_prepared(engine: StaticEngine, logits: torch.Tensor, entropy_out: torch.Tensor) -> None:
    """``logits`` [rows, depth, V'] into the prepared buffer; head 1's entropies into
    ``entropy_out`` [rows, 1]."""
    engine.prepared[:, : logits.shape[1]].copy_(logits)
    entropy_out.copy_(entropy_from_logits(logits[:, :1]))


class StaticDecoding:
    """Greedy decoding on ``engine``'s static steps as the loop's engine (``_loop.decode_batch``)
    for one or several rows; the eager decoder's results and logs.

    ``fuse_empty``: the heads fuse with the base projection (``fuses_with_base``). Without
    ``breakdown`` a step is timed by host clock reads with no device sync beyond its readback,
    and its time from launch to readback (and the host's cut and observations after it) is
    logged as ``verify_ms``, choosing the tree as ``bookkeeping_ms``; with it, each phase is
    timed with a device sync in between (uncaptured), as the eager runtime logs it. A step
    commits its whole accepted path: the loop cuts drafts only on a row's last step.
    """

    def __init__(self, engine: StaticEngine, *, fuse_empty: bool = False,
                 breakdown: bool = False) -> None:
        self.engine = engine
        self.fuse_empty = fuse_empty
        self.breakdown = breakdown
        self.options = StepOptions(base_entropy=False, prepare_depth=0, fuse_empty=False)
        self._sync: Callable[[], None] | None = None
        self._past_len: list[int] = []  # the host's copy of each row's past length
        self._draft_entropy: list[float] = []  # head 1's entropy at each row's next state
        self._out: list[StepReadback] = []

    def begin(self, prompts: Sequence[torch.Tensor], scheduler: Scheduler,
              max_new_tokens: int) -> None:
        engine = self.engine
        self.options = StepOptions.of(scheduler, self.fuse_empty)
        longest = max(int(prompt.shape[0]) for prompt in prompts)
        engine.warm_up(scheduler, longest + max_new_tokens, fuses_empty=self.fuse_empty,
                       rows=len(prompts))
        self._sync = torch.cuda.synchronize if engine.device.type == "cuda" else None

    def now(self) -> float:
        return _host_ms()

    def _synced_now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self.now()

    def prefill(self, prompts: Sequence[torch.Tensor]) -> list[Prefilled]:
        engine, options = self.engine, self.options
        firsts = []
        for row, prompt in enumerate(prompts):
            last_logits = engine.prefill(prompt, row)
            if options.base_entropy:  # one read for both
                h0, first = torch.stack([entropy_from_logits(last_logits[None])[0].float(),
                                         last_logits.argmax().float()]).tolist()
            else:
                first, h0 = int(last_logits.argmax()), math.nan
            firsts.append(Prefilled(int(first), h0))
        self._past_len = [int(prompt.shape[0]) for prompt in prompts]
        self._draft_entropy = [math.nan] * len(prompts)
        if options.prepare_depth:
            preparing = engine.prepare_step(options.prepare_depth)
            engine.run(preparing, max(self._past_len))
            self._draft_entropy = preparing.readback()
        return firsts

    def prepare_draft(self) -> None:
        """Nothing: the previous step (or the prefill) prepared this state."""

    def draft_entropy(self) -> list[float]:
        return self._draft_entropy

    def step_for(self, tree: Tree) -> TreeStep:
        return self.engine.step_for(tree, self.options)

    def run(self, step: TreeStep) -> list[StepRun]:
        draft_ms = verify_ms = accept_ms = 0.0
        longest = max(self._past_len)
        if self.breakdown:
            draft_ms, verify_ms, accept_ms = step.timed(longest, self._synced_now)
        else:
            self.engine.run(step, longest)
        outs = self._out = step.readback()
        self._draft_entropy = [out.draft_entropy for out in outs]
        return [StepRun(out.path_tokens, out.next_token, draft_ms, verify_ms, accept_ms)
                for out in outs]

    def commit(self, kept: Sequence[int]) -> None:
        # A live row kept its whole path in the cache; a finished row's past stays.
        for row, count in enumerate(kept):
            if count:
                self._past_len[row] += self._out[row].length

    def base_entropies(self, kept: Sequence[int]) -> list[list[float]]:
        return [out.base_entropies[:count] for out, count in zip(self._out, kept, strict=True)]

    def finish(self, rows: Sequence[int]) -> None:
        self.engine.finish(rows)

    def phase_times(self, marks: StepMarks, runs: Sequence[StepRun]) -> PhaseTimes:
        if not self.breakdown:
            return PhaseTimes(0.0, marks.done - marks.chosen, marks.chosen - marks.start)
        run = runs[0]  # the step's phases, the same in every row's result
        accept_ms = run.accept_ms
        accept_ms += marks.done - marks.chosen - (run.draft_ms + run.verify_ms + accept_ms)
        return PhaseTimes(run.draft_ms, run.verify_ms, (marks.chosen - marks.start) + accept_ms)
