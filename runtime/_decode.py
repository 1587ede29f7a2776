"""Live tree-attention speculative decoding, and the autoregressive baseline on the same machinery.

Decoding state between steps: the cache holds the prompt and every emitted token except the
pending one (the root of the next tree), ``hidden`` is the final-norm hidden state of the last
cached position (whose logits chose the pending token). A step drafts a tree under the pending
token, verifies it in one forward, keeps the accepted path in the cache and emits its drafted
tokens plus the base model's next token after the leaf, which becomes the new pending token.

Generated token 0 comes from the prefill; generated token ``i`` is the pending token of the step
at position ``i``. A step at position ``i`` that keeps ``d`` drafted tokens emits tokens
``i + 1 .. i + 1 + d`` and the next step is at ``i + 1 + d``. Of ``G`` generated tokens the last
is emitted by a step (or the prefill), so no step runs at position ``G - 1``: drafts past
``max_new_tokens`` or after an EOS token are cut, and the base model's next token is emitted
only while there is room. These are exactly the steps the offline replay books (same positions,
trees and estimates; ``G - 1`` decode tokens), and ``decode_tokens_per_second`` is the replay's
rate: decode tokens over the steps' time, prefill excluded. A step's ``accept_length`` is the
tokens it emitted (``1 + d``, or ``d`` on a final step whose next token found no room), as in
the replay, so ``mean_accept_length`` is decode tokens per step.

With a scheduler on the draft-entropy signal (``needs_draft_entropy``) a step first prepares the
draft (the heads' first results, counted in its ``draft_ms``), gives head 1's entropy there to the
scheduler, then chooses the tree and drafts it from the prepared results; the base entropies of
the accepted path are then not computed, since the choice does not read them.

When the chosen tree is empty (a plain step) and the heads fuse with the base model (Medusa heads
sharing its lm_head, ``fuses_with_base``), the step runs the backbone on the pending token and
then one projection of ``[hidden; head 1..D features]`` through the shared lm_head: row 0 gives
the next token, rows 1..D are the next step's prepared heads (its state is this hidden state),
so the next step does not prepare again. The cache is the unfused step's (the same backbone
call); the next token is the argmax of the same row, up to the projection kernel's float
rounding. Such a step logs the heads' features and the projection in ``verify_ms``; the step
after it logs no preparation in ``draft_ms``. The replay books this with the latency model's
``fused_empty_ms``.

Greedy ``generate`` and ``autoregressive_generate`` run these same steps on the static-shape
runtime (runtime/_static_step.py) for Llama-family models: same positions, trees, estimates,
accept lengths and logs, with the whole step time in ``verify_ms`` unless ``breakdown`` is
asked for. There a draft-entropy step prepares the next state's heads at its end (fused into the
projection for an empty tree, as here), so the host reads everything once per step. The
methods ``prefill``, ``prepare``, ``step``, ``fused_empty_step`` and ``commit`` below, with
``eager_prefill`` and ``DecodingState.plain_step`` (the eager autoregressive step), are the
eager runtime's (a transformers forward over a ``DynamicCache``), used for the sampling modes,
for other models, with ``engine="eager"``, and by the latency profiler.

Every generation runs the one loop of runtime/_loop.py over an engine: ``EagerDecoding`` (the
decoder's eager steps), ``PlainEagerDecoding`` (eager autoregressive decoding) or the static
runtime's ``StaticDecoding``.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from entmtp.core import EAGER_ENGINE, ENGINES, STATIC_ENGINE, EntmtpError
from entmtp.model import check_tree_attention_support, entropy_from_logits, static_support
from entmtp.treesearch import Tree

from ._drafter import Prepared, TreeDrafter, fuses_with_base
from ._engine import reads_base_entropy, reads_draft_entropy
from ._kv_cache import check_cache, compact_cache, new_cache
from ._loop import decode, decode_batch
from ._records import (
    BatchDecodeResult,
    DecodeResult,
    PhaseTimes,
    Prefilled,
    StepLog,
    StepMarks,
    StepRun,
)
from ._sampling import logits_to_probs, rejection_accept, sample_from, typical_accept
from ._scheduler import Scheduler, StaticScheduler
from ._static_step import StaticDecoding, StaticEngine, check_padding, padding_note
from ._tree_attention import TreePlan, tree_plan
from ._verify import (
    backbone_forward,
    forward_tokens,
    greedy_accept,
    probe_tree_attention,
    tree_backbone,
    tree_forward,
)

MODES = ("greedy", "typical", "rejection")
SAMPLING_NOTE = "sampling modes (typical, rejection) run on the eager runtime"


class _Clock:
    """Wall-clock milliseconds that wait for queued device work first."""

    def __init__(self, device: torch.device) -> None:
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None

    def now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter() * 1000.0


def _as_prompt(input_ids: torch.Tensor | Sequence[int], device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.int64, device=device)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1 or ids.numel() == 0:
        raise EntmtpError(
            f"input_ids must be one non-empty prompt ([length] or [1, length]), got shape "
            f"{tuple(ids.shape)}"
        )
    return ids


def _model_dtype_device(model: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    weight = model.get_output_embeddings().weight
    return weight.dtype, weight.device


@dataclass
class DecodingState:
    """What a step needs: the cache (prompt + emitted tokens except the pending one)."""

    cache: DynamicCache
    past_len: int  # tokens in the cache
    pending: int  # the root of the next tree: emitted, not yet cached
    hidden: torch.Tensor  # [1, hidden_size] final-norm hidden state of the last cached position

    @torch.inference_mode()
    def plain_step(self, model: torch.nn.Module) -> int:
        """The eager runtime's plain greedy step, which ``autoregressive_generate`` runs and the
        latency profiler times as ``autoregressive_ms``: caches the pending token and returns
        the greedy token after it, the new pending token."""
        root = torch.tensor([[self.pending]], dtype=torch.int64, device=self.hidden.device)
        hidden, logits = forward_tokens(model, self.cache, root)
        self.past_len += 1
        self.hidden = hidden
        self.pending = int(logits[-1].argmax())
        return self.pending


def greedy_choice(logits: torch.Tensor) -> int:
    """The greedy pending token of ``logits`` [V] (a prefill's ``choose``)."""
    return int(logits.argmax())


def eager_prefill(model: torch.nn.Module, prompt: torch.Tensor,
                  choose: Callable[[torch.Tensor], int]) -> tuple[DecodingState, torch.Tensor]:
    """The eager state after ``prompt`` [P] and its last logits [V] (only the last position goes
    through the lm_head); ``choose(last_logits)`` picks the pending token."""
    cache = new_cache(model)
    hidden = backbone_forward(model, cache, prompt.unsqueeze(0))[-1:]
    check_cache(cache)
    logits = model.get_output_embeddings()(hidden)[-1]
    return DecodingState(cache, int(prompt.numel()), choose(logits), hidden), logits


@dataclass
class StepOutcome:
    """One draft + verify + accept, before the path is committed to the cache."""

    plan: TreePlan
    node_tokens: list[int]  # [q] token of every tree node, root first
    path: list[int]  # accepted node indices, root first
    next_token: int  # base model's token after the path's leaf
    hidden: torch.Tensor  # [q, hidden_size]
    logits: torch.Tensor  # [q, vocab]
    draft_ms: float
    verify_ms: float
    accept_ms: float


AcceptFn = Callable[[TreePlan, torch.Tensor, torch.Tensor], tuple[list[int], int]]


class SpeculativeDecoder:
    """Tree-attention speculative decoding of ``model`` with Medusa or Hydra ``heads``.

    ``topk`` is the number of candidates each head drafts (one int, or one per head); every tree
    a scheduler picks must have its ranks below it. ``probe=True`` also checks on a short input
    that the model's tree-masked logits equal plain causal decoding (a few small forwards).

    ``engine``: ``auto`` decodes greedily on the static-shape runtime (runtime/_static_step.py)
    when the model is Llama-family and on the eager one (a transformers forward over a
    ``DynamicCache``) otherwise; ``static`` requires the static runtime; ``eager`` forces the
    eager one (comparison benchmarks). Sampling modes always run eagerly. ``runtime_note`` says
    in one line which runtime ``generate`` uses. ``graphs``: capture each static step as a CUDA
    graph (CUDA only; ignored on the CPU). ``window``: the static runtime's attention window,
    ``filled`` (CPU default) or ``full`` (the whole cache, masked; CUDA default). ``breakdown``:
    log draft / verify / bookkeeping times of static steps separately (a device sync between
    phases, no graphs); without it a static step logs its whole time as ``verify_ms``.
    ``padded_nodes``: node count -> the node count its tree is verified at on the static
    runtime (a bundle's ``latency.padding``: a tree is never slower than a cheaper larger one;
    None: unpadded; the eager runtime never pads). ``step``, ``prepare``,
    ``fused_empty_step`` and ``commit`` are the eager runtime's steps.
    """

    def __init__(
        self, model: torch.nn.Module, heads: torch.nn.Module, *, topk: int | Sequence[int] = 10,
        probe: bool = False, engine: str = "auto", graphs: bool = True,
        window: str | None = None, breakdown: bool = False,
        padded_nodes: Mapping[int, int] | None = None,
    ) -> None:
        check_tree_attention_support(model)
        if probe:
            probe_tree_attention(model)
        self.model = model
        self.heads = heads
        self.topk = topk
        self.dtype, self.device = _model_dtype_device(model)
        vocab_size, hidden_size = model.get_output_embeddings().weight.shape
        if (heads.hidden_size, heads.vocab_size) != (hidden_size, vocab_size):
            raise EntmtpError(
                f"draft heads are for hidden size {heads.hidden_size} and vocab "
                f"{heads.vocab_size} but the model has {hidden_size} and {vocab_size}: load heads "
                "trained for this model"
            )
        self.drafter = TreeDrafter(heads)
        # Empty-tree steps of draft-entropy schedules also prepare the next step's heads.
        self.fuses_empty = fuses_with_base(model, heads)
        self.clock = _Clock(self.device)
        self.static_reason = _static_reason(model, engine)
        self.graphs = bool(graphs) and self.device.type == "cuda"
        self.window = window
        self.breakdown = bool(breakdown)
        self.padded_nodes = check_padding(padded_nodes)
        self._static: StaticEngine | None = None

    @property
    def runtime_note(self) -> str:
        """One line: which runtime greedy ``generate`` runs on, and why."""
        note = _runtime_note(self.static_reason, self.device, self.graphs and not self.breakdown)
        return note + padding_note(self.padded_nodes if self.static_reason is None else {})

    def warm_up(self, scheduler: Scheduler, *, max_context: int) -> None:
        """Make the static runtime ready for ``scheduler``'s trees and contexts up to
        ``max_context`` (prompt + new tokens): the cache is reserved and, with graphs, every
        step captured now rather than on first use. Nothing to do on the eager runtime."""
        for tree in scheduler.trees:
            self.plan(tree)
        if self.static_engine is not None:
            self.static_engine.warm_up(scheduler, max_context, fuses_empty=self.fuses_empty)

    @property
    def static_engine(self) -> StaticEngine | None:
        """The static-shape runtime of greedy decoding (None: greedy decoding runs eagerly)."""
        if self.static_reason is not None:
            return None
        if self._static is None:
            self._static = StaticEngine(self.model, self.drafter, topk=self.topk,
                                        graphs=self.graphs and not self.breakdown,
                                        window=self.window, padded_nodes=self.padded_nodes)
        return self._static

    def plan(self, tree: Tree) -> TreePlan:
        """The cached plan of ``tree``; raises ``EntmtpError`` if the heads cannot draft it."""
        tree.check_fits(num_heads=self.heads.num_heads)
        return tree_plan(tree, self.topk, self.device)

    # -- steps -----------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(
        self, input_ids: torch.Tensor | Sequence[int], choose: Callable[[torch.Tensor], int]
    ) -> tuple[DecodingState, torch.Tensor]:
        """Run the prompt; ``choose(last_logits)`` picks the first pending token.

        Returns the state and the prompt's last logits [vocab].
        """
        return eager_prefill(self.model, _as_prompt(input_ids, self.device), choose)

    @torch.inference_mode()
    def prepare(self, state: DecodingState, max_depth: int) -> Prepared:
        """The heads' first results at ``state`` for trees of depth <= ``max_depth``."""
        return self.drafter.prepare(self._root(state), state.hidden, max_depth)

    @torch.inference_mode()
    def step(
        self, state: DecodingState, plan: TreePlan, accept: AcceptFn,
        prepared: Prepared | None = None,
    ) -> StepOutcome:
        """Draft ``plan``'s tree under the pending token, verify it, pick the accepted path.

        ``prepared``: ``prepare(state, ...)`` of this same state, reused by the drafter (its
        time is not in the outcome's ``draft_ms``). The cache then holds all tree tokens;
        ``commit`` keeps the chosen path.
        """
        clock = self.clock
        t0 = clock.now()
        drafted = self.drafter.draft(plan, self._root(state), state.hidden, prepared)[0]
        t1 = clock.now()
        hidden, logits = tree_forward(self.model, state.cache, plan, drafted, state.past_len,
                                      dtype=self.dtype)
        t2 = clock.now()
        path, next_token = accept(plan, drafted, logits)
        node_tokens = drafted.tolist()
        t3 = clock.now()
        return StepOutcome(plan, node_tokens, path, next_token, hidden, logits,
                           t1 - t0, t2 - t1, t3 - t2)

    @torch.inference_mode()
    def fused_empty_step(
        self, state: DecodingState, plan: TreePlan, accept: AcceptFn, max_depth: int
    ) -> tuple[StepOutcome, Prepared]:
        """``step`` with the empty tree ``plan``, fused with the next step's ``prepare``.

        The backbone runs on the pending token as in ``step`` (the same cache update); one
        projection then gives its logits and the heads' at its hidden state, returned as the
        ``Prepared`` of the state that ``commit`` leaves (for trees of depth <= ``max_depth``).
        Only for ``fuses_empty`` heads; ``verify_ms`` includes the heads and the projection.
        """
        if not self.fuses_empty:
            raise EntmtpError(
                "these draft heads do not share the model's lm_head: only Medusa heads with a "
                "shared lm_head fuse into a plain step (use step)"
            )
        if plan.num_nodes != 0:
            raise EntmtpError(f"a fused step verifies the empty tree, got {plan.num_nodes} nodes")
        clock = self.clock
        t0 = clock.now()
        root = self._root(state)
        hidden = tree_backbone(self.model, state.cache, plan, root, state.past_len,
                               dtype=self.dtype)
        logits, prepared = self.drafter.project_with_base(hidden, max_depth)
        t1 = clock.now()
        path, next_token = accept(plan, root, logits)
        t2 = clock.now()
        outcome = StepOutcome(plan, [state.pending], path, next_token, hidden, logits,
                              0.0, t1 - t0, t2 - t1)
        return outcome, prepared

    def _root(self, state: DecodingState) -> torch.Tensor:
        return torch.tensor([state.pending], dtype=torch.int64, device=self.device)

    @staticmethod
    @torch.inference_mode()
    def commit(state: DecodingState, outcome: StepOutcome, path: list[int]) -> None:
        """Keep ``path`` (a prefix of the accepted path) in the cache; its leaf's token follows."""
        compact_cache(state.cache, state.past_len, path)
        state.past_len += len(path)
        state.hidden = outcome.hidden[path[-1] : path[-1] + 1]
        state.pending = outcome.next_token

    def accept_fn(
        self, mode: str, *, temperature: float, generator: torch.Generator,
        posterior_threshold: float, posterior_alpha: float,
    ) -> AcceptFn:
        if mode == "greedy":
            return greedy_accept
        if mode == "typical":
            return partial(typical_accept, temperature=temperature,
                           posterior_threshold=posterior_threshold,
                           posterior_alpha=posterior_alpha, generator=generator)
        return partial(rejection_accept, temperature=temperature, generator=generator)

    # -- generation ------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor | Sequence[int],
        scheduler: Scheduler,
        *,
        max_new_tokens: int,
        eos_token_ids: Iterable[int] = (),
        mode: str = "greedy",
        temperature: float = 0.0,
        seed: int = 0,
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        on_step: Callable[[StepLog | None, list[int]], None] | None = None,
    ) -> DecodeResult:
        """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (stopping after an EOS).

        ``mode``: ``greedy`` (lossless: the output equals greedy decoding), ``typical`` (Medusa's
        typical acceptance with ``posterior_threshold`` / ``posterior_alpha``) or ``rejection``
        (lossless sampling at ``temperature``). Sampling modes need ``temperature > 0`` and draw
        from a generator seeded with ``seed``. ``on_step(step_log, new_tokens)``, if given, is
        called with ``(None, [first token])`` after the prefill and then after every step with
        the tokens that step emitted (for streaming).
        """
        if mode not in MODES:
            raise EntmtpError(f"decoding mode {mode!r} is unknown: use one of {', '.join(MODES)}")
        if mode != "greedy" and not temperature > 0:
            raise EntmtpError(f"mode {mode!r} samples: give a temperature > 0 (or use greedy)")
        if max_new_tokens < 0:
            raise EntmtpError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        for tree in scheduler.trees:
            self.plan(tree)
        eos = frozenset(int(t) for t in eos_token_ids)
        if max_new_tokens == 0:
            _as_prompt(input_ids, self.device)
            return DecodeResult([], 0, [], 0.0, 0.0)
        static = self.static_engine if mode == "greedy" else None
        engine: StaticDecoding | EagerDecoding
        if static is not None:
            engine = StaticDecoding(static, fuse_empty=self.fuses_empty, breakdown=self.breakdown)
            input_ids = _as_prompt(input_ids, self.device)
        else:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(int(seed))
            accept = self.accept_fn(mode, temperature=temperature, generator=generator,
                                    posterior_threshold=posterior_threshold,
                                    posterior_alpha=posterior_alpha)

            def choose(logits: torch.Tensor) -> int:
                if mode == "greedy":
                    return greedy_choice(logits)
                return sample_from(logits_to_probs(logits, temperature), generator)

            engine = EagerDecoding(self, accept, choose)
        return decode(engine, input_ids, scheduler, max_new_tokens=max_new_tokens,
                      eos_token_ids=eos, on_step=on_step)

    def generate_batch(
        self,
        prompts: Sequence[torch.Tensor | Sequence[int]],
        scheduler: Scheduler,
        *,
        max_new_tokens: int,
        eos_token_ids: Iterable[int] = (),
        on_step: Callable[[int, StepLog | None, list[int]], None] | None = None,
    ) -> BatchDecodeResult:
        """Greedy ``generate`` of every prompt together, one row each, on the static runtime:
        each step verifies one tree for every row still decoding (the scheduler's choice at the
        mean of the rows' estimates); each row's tokens are its greedy decoding alone.
        ``on_step(row, step_log, new_tokens)`` as ``generate``'s, per row."""
        static = self._batch_engine(len(prompts))
        if max_new_tokens < 1:
            raise EntmtpError(f"a batch generates max_new_tokens >= 1, got {max_new_tokens}")
        for tree in scheduler.trees:
            self.plan(tree)
        engine = StaticDecoding(static, fuse_empty=self.fuses_empty, breakdown=self.breakdown)
        return decode_batch(engine, [_as_prompt(p, self.device) for p in prompts], scheduler,
                            max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                            on_step=on_step)

    def _batch_engine(self, rows: int) -> StaticEngine:
        if rows < 1:
            raise EntmtpError("a batch needs at least one prompt")
        static = self.static_engine
        if static is None:
            raise EntmtpError(f"batched decoding runs on the static runtime only: "
                              f"{self.runtime_note}")
        return static


class EagerDecoding:
    """``decoder``'s eager steps as the loop's engine (``_loop.decode``), accepting with
    ``accept`` and choosing the prefill's token with ``choose``.

    With a draft-entropy schedule a step first prepares the draft (counted in its
    ``draft_ms``), unless the previous step was a fused empty step that prepared it already;
    an empty tree then runs fused (``fuses_empty`` heads). A step logs the decoder's own
    draft / verify / accept times, with the choice, commit and entropies as bookkeeping.
    """

    def __init__(self, decoder: SpeculativeDecoder, accept: AcceptFn,
                 choose: Callable[[torch.Tensor], int]) -> None:
        self.decoder = decoder
        self.accept = accept
        self.choose = choose
        self.state: DecodingState | None = None
        self._observes = False
        self._fuse = False
        self._max_depth = 0
        self._prepared: Prepared | None = None  # this step's preparation
        self._ready: Prepared | None = None  # prepared by the previous (fused empty) step
        self._outcome: StepOutcome | None = None

    def begin(self, prompts: Sequence[torch.Tensor | Sequence[int]], scheduler: Scheduler,
              max_new_tokens: int) -> None:
        _one_row(prompts, "the eager runtime")
        self._observes = reads_base_entropy(scheduler)
        self._fuse = reads_draft_entropy(scheduler) and self.decoder.fuses_empty
        self._max_depth = max((tree.depth for tree in scheduler.trees), default=0)
        self._prepared = self._ready = self._outcome = None

    def now(self) -> float:
        return self.decoder.clock.now()

    def prefill(self, prompts: Sequence[torch.Tensor | Sequence[int]]) -> list[Prefilled]:
        self.state, last_logits = self.decoder.prefill(prompts[0], self.choose)
        entropy = (entropy_from_logits(last_logits[None]).tolist()[0] if self._observes
                   else math.nan)
        return [Prefilled(self.state.pending, entropy)]

    def prepare_draft(self) -> None:
        prepared, self._ready = self._ready, None
        if prepared is None:
            prepared = self.decoder.prepare(self.state, self._max_depth)
        self._prepared = prepared

    def draft_entropy(self) -> list[float]:
        return entropy_from_logits(self._prepared.first_logits).tolist()

    def step_for(self, tree: Tree) -> TreePlan:
        return tree_plan(tree, self.decoder.topk, self.decoder.device)

    def run(self, step: TreePlan) -> list[StepRun]:
        decoder, prepared = self.decoder, self._prepared
        self._prepared = None
        if self._fuse and step.num_nodes == 0:
            outcome, self._ready = decoder.fused_empty_step(self.state, step, self.accept,
                                                            self._max_depth)
        else:
            outcome = decoder.step(self.state, step, self.accept, prepared)
        self._outcome = outcome
        return [StepRun([outcome.node_tokens[node] for node in outcome.path],
                        outcome.next_token, outcome.draft_ms, outcome.verify_ms,
                        outcome.accept_ms)]

    def commit(self, kept: Sequence[int]) -> None:
        outcome = self._outcome
        self.decoder.commit(self.state, outcome, outcome.path[: kept[0]])

    def base_entropies(self, kept: Sequence[int]) -> list[list[float]]:
        outcome = self._outcome
        return [entropy_from_logits(outcome.logits[outcome.path[: kept[0]]]).tolist()]

    def finish(self, rows: Sequence[int]) -> None:
        """Nothing: the loop ends with its one row."""

    def phase_times(self, marks: StepMarks, runs: Sequence[StepRun]) -> PhaseTimes:
        run = runs[0]
        return PhaseTimes(
            draft_ms=(marks.prepared - marks.start) + run.draft_ms,
            verify_ms=run.verify_ms,
            bookkeeping_ms=(marks.chosen - marks.prepared) + run.accept_ms
            + (marks.done - marks.stepped),
        )


class PlainEagerDecoding:
    """The eager runtime's plain greedy steps (``DecodingState.plain_step``) on ``model`` as
    the loop's engine, for a schedule of the empty tree alone: each step logs its whole time
    (forward, lm_head, argmax) as ``verify_ms``."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.clock = _Clock(device)
        self.state: DecodingState | None = None

    def begin(self, prompts: Sequence[torch.Tensor], scheduler: Scheduler,
              max_new_tokens: int) -> None:
        _one_row(prompts, "the eager runtime")
        if any(tree.num_nodes for tree in scheduler.trees):
            raise EntmtpError("plain steps verify the empty tree only")

    def now(self) -> float:
        return self.clock.now()

    def prefill(self, prompts: Sequence[torch.Tensor]) -> list[Prefilled]:
        self.state, _ = eager_prefill(self.model, prompts[0], greedy_choice)
        return [Prefilled(self.state.pending, math.nan)]

    def prepare_draft(self) -> None:
        raise EntmtpError("plain steps draft nothing: there is no draft entropy")

    def draft_entropy(self) -> list[float]:
        raise EntmtpError("plain steps draft nothing: there is no draft entropy")

    def step_for(self, tree: Tree) -> Tree:
        return tree

    def run(self, step: Tree) -> list[StepRun]:
        root = self.state.pending
        return [StepRun([root], self.state.plain_step(self.model))]

    def commit(self, kept: Sequence[int]) -> None:
        """Nothing: the plain step cached its one token."""

    def base_entropies(self, kept: Sequence[int]) -> list[list[float]]:
        raise EntmtpError("plain steps compute no entropies")

    def finish(self, rows: Sequence[int]) -> None:
        """Nothing: the loop ends with its one row."""

    def phase_times(self, marks: StepMarks, runs: Sequence[StepRun]) -> PhaseTimes:
        return PhaseTimes(0.0, marks.stepped - marks.chosen, 0.0)


def _one_row(prompts: Sequence[Any], runtime: str) -> None:
    if len(prompts) != 1:
        raise EntmtpError(f"{runtime} decodes one prompt at a time, got a batch of "
                          f"{len(prompts)}: use the static runtime (engine='static') for a batch")


def _static_reason(model: torch.nn.Module, engine: str) -> str | None:
    """None when greedy decoding of ``model`` runs on the static runtime, else why not."""
    if engine not in ENGINES:
        raise EntmtpError(f"engine {engine!r} is unknown: use one of {', '.join(ENGINES)}")
    if engine == EAGER_ENGINE:
        return "engine='eager' was asked for"
    reason = static_support(model)
    if reason is not None and engine == STATIC_ENGINE:
        raise EntmtpError(f"engine='static' cannot run {type(model).__name__}: {reason}; use "
                          "engine='auto' or 'eager'")
    return reason


def _runtime_note(reason: str | None, device: torch.device, graphs: bool) -> str:
    if reason is not None:
        return f"greedy decoding runs on the eager runtime ({reason})"
    how = "CUDA graphs" if graphs else f"no graphs on {device.type}"
    return f"greedy decoding runs on the static-shape runtime ({how}); {SAMPLING_NOTE}"


_AR_EMPTY = Tree.from_paths([])
_AR_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def autoregressive_engine(
    model: torch.nn.Module, *, graphs: bool = True, window: str | None = None
) -> StaticEngine:
    """The static runtime of ``model``'s autoregressive decoding, kept with the model (so its
    cache and captured graph serve every call)."""
    per_model = _AR_ENGINES.setdefault(model, {})
    key = (bool(graphs), window)
    if key not in per_model:
        per_model[key] = StaticEngine(model, None, graphs=graphs, window=window)
    return per_model[key]


def autoregressive_static_engine(
    model: torch.nn.Module, *, engine: str = "auto", graphs: bool = True,
    window: str | None = None,
) -> StaticEngine | None:
    """The static engine ``autoregressive_generate`` runs ``model`` on with these options (graphs
    on CUDA only); None when it runs eagerly."""
    if _static_reason(model, engine) is not None:
        return None
    on_cuda = _model_dtype_device(model)[1].type == "cuda"
    return autoregressive_engine(model, graphs=graphs and on_cuda, window=window)


@torch.inference_mode()
def autoregressive_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor | Sequence[int],
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    engine: str = "auto",
    graphs: bool = True,
    window: str | None = None,
) -> DecodeResult:
    """Plain greedy decoding, one token per forward, on the same machinery as the decoder.

    ``engine``, ``graphs`` and ``window`` as for ``SpeculativeDecoder``: the static runtime runs
    the empty tree's step (the speculative decoder's plain step). Elsewhere (other
    architectures, ``engine="eager"``) it is the eager runtime's plain step
    (``DecodingState.plain_step``, what the latency profiler times there). Each step is
    logged with accept length 1 and its whole time (forward, lm_head, argmax) as ``verify_ms``.
    """
    check_tree_attention_support(model)
    if max_new_tokens < 0:
        raise EntmtpError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    _, device = _model_dtype_device(model)
    eos = frozenset(int(t) for t in eos_token_ids)
    prompt = _as_prompt(input_ids, device)
    static = autoregressive_static_engine(model, engine=engine, graphs=graphs, window=window)
    if max_new_tokens == 0:
        return DecodeResult([], 0, [], 0.0, 0.0)
    decoding = (StaticDecoding(static) if static is not None
                else PlainEagerDecoding(model, device))
    return decode(decoding, prompt, StaticScheduler(_AR_EMPTY), max_new_tokens=max_new_tokens,
                  eos_token_ids=eos)


@torch.inference_mode()
def autoregressive_generate_batch(
    model: torch.nn.Module,
    prompts: Sequence[torch.Tensor | Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    graphs: bool = True,
    window: str | None = None,
) -> BatchDecodeResult:
    """Plain greedy decoding of every prompt together, one row each, on the static runtime:
    each step runs the empty tree's step for the whole batch (one token per live row)."""
    check_tree_attention_support(model)
    if max_new_tokens < 1:
        raise EntmtpError(f"a batch generates max_new_tokens >= 1, got {max_new_tokens}")
    if not prompts:
        raise EntmtpError("a batch needs at least one prompt")
    _, device = _model_dtype_device(model)
    static = autoregressive_static_engine(model, graphs=graphs, window=window)
    if static is None:
        raise EntmtpError(f"batched decoding runs on the static runtime only: "
                          f"{_static_reason(model, 'auto')}")
    return decode_batch(StaticDecoding(static), [_as_prompt(p, device) for p in prompts],
                        StaticScheduler(_AR_EMPTY), max_new_tokens=max_new_tokens,
                        eos_token_ids=eos_token_ids)
