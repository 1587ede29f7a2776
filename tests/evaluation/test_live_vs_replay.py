"""The central test: live decoding runs, step by step, the steps the replay of a profile books.

The profile comes from calibrate's profiler on the same model, heads and prompts; the replay is
treesearch's; the live decoder runs the same static tree or entropy schedule. Steps are compared
one for one: positions, accept lengths (tokens each step adds to the output), trees, estimates.
Both runtimes (eager and static-shape) are held to it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entmtp.calibrate._profiler import profile_prompts
from entmtp.calibrate._tasks import TaskPrompt
from entmtp.evaluation._validation import compare_steps, step_tokens
from entmtp.model._base_model import BaseModel
from entmtp.model._heads import new_heads
from entmtp.runtime._decode import SpeculativeDecoder, autoregressive_generate
from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._replay import replay
from entmtp.treesearch._schedule import DRAFT_ENTROPY, Schedule
from entmtp.treesearch._tree import Tree

TOPK = 5
MAX_NEW = 28
TEXTS = ["a cat", "the quick brown fox", "x", "numbers 1 2 3 4 5 6"]


class _CharTokenizer:
    """Enough of a tokenizer for the profiler: BOS + one id per character."""

    pad_token_id = 0
    eos_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [3 + (ord(c) % 120) for c in text]}


def _base(rt) -> BaseModel:
    return BaseModel(rt.sharp_llama(5), _CharTokenizer(), name="tiny", source="test",
                     is_instruct=False)


def _prompts():
    return [TaskPrompt(i, f"p{i}", text) for i, text in enumerate(TEXTS)]


def _thresholds(estimates: np.ndarray) -> tuple[float, float]:
    """Two thresholds in the widest gaps of the middle quantiles (far from any estimate)."""
    values = np.unique(estimates)
    chosen = []
    for low, high in ((0.2, 0.45), (0.55, 0.8)):
        lo, hi = int(low * (len(values) - 1)), max(int(high * (len(values) - 1)), 1)
        gaps = np.diff(values[lo : hi + 1])
        k = lo + int(np.argmax(gaps))
        chosen.append(float((values[k] + values[k + 1]) / 2))
    return tuple(sorted(chosen))


def _compare(profile, decoder, scheduler, schedule_or_tree, base, prompts):
    """Decode every profiled prompt live and hold the steps to the replay's with the library's
    comparison (``compare_steps``, what ``validate`` and ``bench`` report)."""
    replayed = replay(profile, schedule_or_tree, LatencyModel.cpu_like())
    lives = []
    for trace in profile.traces:
        ids = base.encode_task_prompt(prompts[trace.prompt_index])
        live = decoder.generate(ids, scheduler, max_new_tokens=MAX_NEW,
                                eos_token_ids=base.eos_token_ids)
        assert len(live.tokens) == trace.num_positions
        assert step_tokens(live) == live.accept_lengths
        lives.append(live)
    comparison = compare_steps(lives, replayed, [t.prompt_id for t in profile.traces])
    # every step at the replay's position, with its accept length and tree
    assert comparison.mismatches == [] and comparison.steps_compared == replayed.steps
    if isinstance(scheduler, BundleScheduler):  # a static scheduler estimates nothing
        assert all(np.isfinite(s.entropy_estimate) for live in lives for s in live.step_log)
        assert comparison.max_estimate_difference <= 1e-4
    for trace_index, live in enumerate(lives):
        totals = replayed.traces[trace_index]
        assert (live.steps, len(live.tokens) - 1) == (totals.steps, totals.tokens)
        assert totals.mean_accept_length == (len(live.tokens) - 1) / max(live.steps, 1)
    return replayed.steps, replayed.step_accept.tolist()


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_oracle_heads_live_schedule_equals_profile_replay(rt, engine):
    base = _base(rt)
    prompts = _prompts()
    rng = np.random.default_rng(4)
    # oracle heads need the continuations: greedy decoding as the profiler does it
    heads_per_prompt = {}
    for prompt in prompts:
        ids = torch.tensor(base.encode_task_prompt(prompt))
        continuation = rt.greedy_reference(base.model, ids, MAX_NEW + 8)
        ranks = rt.random_ranks(rng, len(continuation), 3, TOPK, miss=0.2)
        heads_per_prompt[prompt.index] = rt.OracleHeads(
            base.model, ids, continuation, ranks, head_type="medusa", topk=TOPK, seed=prompt.index
        )
    heads = _PromptRouter(heads_per_prompt)
    profile = profile_prompts(base, heads, prompts, max_new_tokens=MAX_NEW, topk=TOPK,
                              batch_size=2)
    estimator = EntropyEstimator.ema(0.5)
    starts = np.cumsum([0] + [t.num_positions for t in profile.traces[:-1]])
    thresholds = _thresholds(estimator.estimates(profile.entropy(), trace_starts=starts))
    trees = (Tree.from_paths([[0], [0, 0], [0, 0, 0], [1], [0, 1]]),
             Tree.from_paths([[0], [1], [2], [0, 0], [1, 0], [0, 0, 0], [0, 1]]),
             Tree.from_paths([[0], [1], [2], [3], [4]]))
    schedule = Schedule(trees, thresholds, estimator)
    decoder = SpeculativeDecoder(base.model, heads, topk=TOPK, engine=engine)
    steps, accepts = _compare(profile, decoder, BundleScheduler(schedule), schedule, base,
                              prompts)
    assert steps > 20 and max(accepts) >= 3  # the comparison saw real multi-token steps


def _noisy_heads(base, head_type: str, *, seed: int, noise_seed: int,
                 draft_vocab: int | None = None):
    """Fresh heads with seeded noise (std 0.05) added to every parameter; with ``draft_vocab``,
    drafting over that many random tokens (so that true tokens outside it are drafted never)."""
    heads = new_heads(base.model, head_type=head_type, num_heads=3, seed=seed)
    generator = torch.Generator().manual_seed(noise_seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    if draft_vocab is not None:
        heads.set_draft_vocab(torch.randperm(heads.vocab_size, generator=generator)[:draft_vocab])
    return heads


@pytest.mark.parametrize("draft_vocab", [None, 72])
@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_calibrate_heads_live_static_tree_equals_profile_replay(rt, head_type, engine,
                                                                draft_vocab):
    base = _base(rt)
    prompts = _prompts()
    heads = _noisy_heads(base, head_type, seed=2, noise_seed=9, draft_vocab=draft_vocab)
    profile = profile_prompts(base, heads, prompts, max_new_tokens=MAX_NEW, topk=TOPK,
                              batch_size=2)
    tree = Tree.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    decoder = SpeculativeDecoder(base.model, heads, topk=TOPK, engine=engine)
    steps, _ = _compare(profile, decoder, StaticScheduler(tree), tree, base, prompts)
    assert steps > 20


class _PromptRouter(torch.nn.Module):
    """One oracle per prompt behind the heads interface: routes each row by its hidden state."""

    head_type = "medusa"

    def __init__(self, oracles):
        super().__init__()
        self.oracles = list(oracles.values())
        first = self.oracles[0]
        self.num_heads, self.hidden_size, self.vocab_size = (
            first.num_heads, first.hidden_size, first.vocab_size)

    def sha256(self) -> str:
        return "0" * 64

    def head_logits(self, depth, hidden, prefix_tokens):
        rows = []
        for n in range(hidden.shape[0]):
            distances = [
                float(torch.cdist(hidden[n : n + 1].float(), o.reference_hidden.float(),
                                  compute_mode="donot_use_mm_for_euclid_dist").min())
                for o in self.oracles
            ]
            oracle = self.oracles[int(np.argmin(distances))]
            prefix = None if prefix_tokens is None else prefix_tokens[n : n + 1]
            rows.append(oracle.head_logits(depth, hidden[n : n + 1], prefix))
        return torch.cat(rows)


@pytest.mark.parametrize("draft_vocab", [None, 72])
@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_draft_signal_live_schedule_equals_profile_replay(rt, head_type, engine, draft_vocab):
    """Head 1's entropy at each step picks the tree, live as in the replay; output is greedy's.
    With a draft vocabulary the entropy is over its tokens, in the profile as live."""
    base = _base(rt)
    prompts = _prompts()
    heads = _noisy_heads(base, head_type, seed=4, noise_seed=11, draft_vocab=draft_vocab)
    profile = profile_prompts(base, heads, prompts, max_new_tokens=MAX_NEW, topk=TOPK,
                              batch_size=2)
    assert profile.has_draft_entropy
    trees = (Tree.from_paths([[0], [0, 0], [0, 0, 0], [1], [0, 1]]),
             Tree.from_paths([[0], [1], [2], [0, 0], [1, 0], [0, 0, 0], [0, 1]]),
             Tree.from_paths([[0], [1], [2], [3], [4]]))
    schedule = Schedule(trees, _thresholds(profile.draft_entropy()), EntropyEstimator.last(),
                        DRAFT_ENTROPY)
    scheduler = BundleScheduler(schedule)
    assert scheduler.needs_draft_entropy
    decoder = SpeculativeDecoder(base.model, heads, topk=TOPK, engine=engine)
    steps, _ = _compare(profile, decoder, scheduler, schedule, base, prompts)
    assert steps > 20

    used = set()
    for trace in profile.traces:
        ids = base.encode_task_prompt(prompts[trace.prompt_index])
        live = decoder.generate(ids, scheduler, max_new_tokens=MAX_NEW,
                                eos_token_ids=base.eos_token_ids)
        plain = autoregressive_generate(base.model, ids, max_new_tokens=MAX_NEW,
                                        eos_token_ids=base.eos_token_ids)
        assert live.tokens == plain.tokens  # lossless
        positions = [s.position for s in live.step_log]
        np.testing.assert_allclose([s.entropy_estimate for s in live.step_log],
                                   trace.draft_entropy[positions], atol=1e-4)
        used.update(s.tree_index for s in live.step_log)
    assert used == {0, 1, 2}  # the thresholds split the steps between every tree


def _project_rows_calls(step_log, trees) -> int:
    """Vocabulary projections the drafter runs under a draft-entropy schedule with fused heads:
    a step prepares unless the previous step was a fused empty step, and an empty step projects
    once more (base row + the next step's heads); a drafted step reuses what was prepared."""
    calls, previous_empty = 0, False
    for step in step_log:
        empty = trees[step.tree_index].num_nodes == 0
        calls += (0 if previous_empty else 1) + (1 if empty else 0)
        previous_empty = empty
    return calls


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_draft_signal_with_the_empty_tree_fuses_plain_steps(rt, head_type, engine, monkeypatch):
    """Empty-tree steps (in runs, and after drafted steps) are fused for shared-lm_head Medusa
    heads: lossless, the replay's steps, and one projection per fused step, none for the next.
    The static runtime prepares each next state at the end of a step (once after the prefill):
    one projection per step, the base row and the heads' in one for an empty tree."""
    import entmtp.runtime._drafter as drafter_module

    base = _base(rt)
    prompts = _prompts()
    heads = _noisy_heads(base, head_type, seed=4, noise_seed=11)
    profile = profile_prompts(base, heads, prompts, max_new_tokens=MAX_NEW, topk=TOPK,
                              batch_size=2)
    empty = Tree.from_paths([])
    trees = (Tree.from_paths([[0], [0, 0], [0, 0, 0], [1], [0, 1]]),
             Tree.from_paths([[0], [1], [2]]), empty)
    schedule = Schedule(trees, _thresholds(profile.draft_entropy()), EntropyEstimator.last(),
                        DRAFT_ENTROPY)
    scheduler = BundleScheduler(schedule)
    decoder = SpeculativeDecoder(base.model, heads, topk=TOPK, engine=engine)
    assert decoder.fuses_empty == (head_type == "medusa")
    calls = []
    real = drafter_module.project_rows

    def counting(features, weight, bias, **kwargs):
        calls.append(features.shape[0])
        return real(features, weight, bias, **kwargs)

    monkeypatch.setattr(drafter_module, "project_rows", counting)
    steps, _ = _compare(profile, decoder, scheduler, schedule, base, prompts)
    assert steps > 20

    runs = after_drafted = drafted_after = 0
    for trace in profile.traces:
        ids = base.encode_task_prompt(prompts[trace.prompt_index])
        calls.clear()
        live = decoder.generate(ids, scheduler, max_new_tokens=MAX_NEW,
                                eos_token_ids=base.eos_token_ids)
        plain = autoregressive_generate(base.model, ids, max_new_tokens=MAX_NEW,
                                        eos_token_ids=base.eos_token_ids)
        assert live.tokens == plain.tokens  # lossless
        is_empty = [trees[s.tree_index].num_nodes == 0 for s in live.step_log]
        for before, now in zip(is_empty, is_empty[1:], strict=False):
            runs += before and now
            after_drafted += now and not before
            drafted_after += before and not now
        if head_type == "medusa":
            if engine == "eager":
                assert len(calls) == _project_rows_calls(live.step_log, trees)
            else:
                assert len(calls) == live.steps + 1
            fused_rows = [1 + 3] * sum(is_empty)  # base row + heads 1..3 per fused step
            assert sorted(calls) == sorted([3] * (len(calls) - sum(is_empty)) + fused_rows)
        else:  # Hydra never fuses: its heads run through calibrate's own projections
            assert calls == []
    assert runs > 0 and after_drafted > 0 and drafted_after > 0  # every case was exercised


class _CostClock:
    """A clock that moves only when a static step runs, by the cost ``cost(step)`` says: the
    profiler and live decoding then read the same step times, without timing anything."""

    def __init__(self, cost):
        self.cost = cost
        self.ms = 0.0

    def now(self) -> float:
        return self.ms


def _step_cost(head_type: str):
    """ms of a static step, built from its work: the forward (10 + 1 per node), 0.5 per level of
    bookkeeping, and the heads. Medusa: 0.3 + 0.2 per row projected (fused into the base
    projection: 0.2 per row); Hydra: head 1 (0.3, the preparation) plus 0.4 per deeper level.
    Drafting from prepared heads skips their first results. Entropies cost nothing here (the
    profiler's documented approximation prices the drafted steps of draft-entropy schedules, and
    static trees, at base-entropy steps: exact only when those are free and, for Medusa, when
    every drafted tree has the schedule's depth)."""
    from entmtp.runtime._static_step import PrepareStep

    def heads(depth: int) -> float:  # the heads' first results for trees of depth <= depth
        return 0.3 + 0.2 * depth if head_type == "medusa" else 0.3

    def deeper(depth: int) -> float:  # Hydra's levels after the first
        return 0.4 * max(depth - 1, 0) if head_type == "hydra" else 0.0

    def cost(step) -> float:
        if isinstance(step, PrepareStep):
            return heads(step.max_depth)
        plan = step.plan
        ms = 10.0 + plan.num_nodes + 0.5 * plan.depth + deeper(plan.depth)
        if plan.depth and not step.prepare_depth:
            ms += heads(plan.depth)  # drafts from scratch
        if step.fuse:
            ms += 0.2 * step.prepare_depth  # the heads' rows in the base projection
        elif step.prepare_depth:
            ms += heads(step.prepare_depth)  # prepares the next state at its end
        return ms

    return cost


def _priced_schedule(profile, signal: str):
    """Two drafted trees and the empty one under ``signal`` (a draft-entropy or base-entropy
    schedule; ``static``: the second tree alone), and the trees the profiler measures."""
    trees = (Tree.from_paths([[0], [0, 0], [0, 0, 0], [1], [0, 1]]),
             Tree.from_paths([[0], [1], [2], [0, 0], [0, 0, 0]]), Tree.from_paths([]))
    if signal == DRAFT_ENTROPY:
        schedule = Schedule(trees, _thresholds(profile.draft_entropy()),
                            EntropyEstimator.last(), DRAFT_ENTROPY)
    elif signal == "base":
        schedule = Schedule(trees, _thresholds(profile.entropy()), EntropyEstimator.last())
    else:
        schedule = trees[1]
    return schedule, trees[:2]


def _assert_live_steps_are_priced(profile, schedule, latency, decoder, base, prompts, *,
                                  engine: str) -> set[int]:
    """Every live step's time is the replay's modelled time of that step under ``latency``,
    and autoregressive decoding on ``engine`` takes the model's autoregressive_ms per token;
    returns the tree indices the live steps used."""
    replayed = replay(profile, schedule, latency)
    scheduler = (StaticScheduler(schedule) if isinstance(schedule, Tree)
                 else BundleScheduler(schedule))
    used = set()
    for trace_index, trace in enumerate(profile.traces):
        ids = base.encode_task_prompt(prompts[trace.prompt_index])
        live = decoder.generate(ids, scheduler, max_new_tokens=MAX_NEW,
                                eos_token_ids=base.eos_token_ids)
        mine = replayed.step_trace == trace_index
        assert [s.tree_index for s in live.step_log] == replayed.step_tree[mine].tolist()
        np.testing.assert_allclose([s.step_ms for s in live.step_log], replayed.step_ms[mine],
                                   rtol=1e-9)
        assert live.decode_ms == pytest.approx(replayed.traces[trace_index].time_ms, rel=1e-9)
        used.update(s.tree_index for s in live.step_log)
        plain = autoregressive_generate(base.model, ids, max_new_tokens=MAX_NEW,
                                        eos_token_ids=base.eos_token_ids, engine=engine)
        assert plain.decode_ms == pytest.approx(replayed.traces[trace_index].autoregressive_ms,
                                                rel=1e-9)
    return used


def _priced_run(rt, head_type: str, signal: str, clock, *, engine: str):
    """The base model, prompts, noisy heads, their profile, a schedule on ``signal`` and the
    latency model that ``engine``'s profiler measures with ``clock``."""
    from entmtp.evaluation._latency_profile import profile_latency

    base = _base(rt)
    prompts = _prompts()
    heads = _noisy_heads(base, head_type, seed=4, noise_seed=11)
    profile = profile_prompts(base, heads, prompts, max_new_tokens=MAX_NEW, topk=TOPK,
                              batch_size=2)
    schedule, measured = _priced_schedule(profile, signal)
    latency = profile_latency(base.model, heads, node_counts=(0,), depths=(3,),
                              context_lengths=(8, 16), repeats=4, warmup=0, topk=TOPK,
                              trees=measured, remeasure=0, clock=clock, engine=engine)
    return base, prompts, heads, profile, schedule, latency


@pytest.mark.parametrize(("head_type", "signal"), [("medusa", DRAFT_ENTROPY),
                                                   ("hydra", DRAFT_ENTROPY),
                                                   ("medusa", "base"), ("hydra", "static")])
def test_the_profiled_latency_prices_every_static_engine_step_as_the_replay_books_it(
        rt, monkeypatch, head_type, signal):
    """The profiler times the static engine's steps and the replay charges them: with a clock
    that moves by each step's cost (the same for the profiler and live decoding), every live
    step's time equals the replay's modelled time of that step under the profiled latency
    model, for draft-entropy schedules with the empty tree (Medusa: fused; Hydra: prepared at the
    step's end), a base-entropy schedule and a static tree; autoregressive decoding equals the
    model's autoregressive_ms per token."""
    import types

    import entmtp.runtime._static_step as static_step

    clock = _CostClock(_step_cost(head_type))
    for cls in (static_step.TreeStep, static_step.PrepareStep):
        original = cls.body

        def body(step, past_len, original=original):
            clock.ms += clock.cost(step)
            original(step, past_len)

        monkeypatch.setattr(cls, "body", body)
    monkeypatch.setattr(static_step, "time",
                        types.SimpleNamespace(perf_counter=lambda: clock.ms / 1000.0))

    base, prompts, heads, profile, schedule, latency = _priced_run(rt, head_type, signal, clock,
                                                                   engine="auto")
    assert latency.hardware["engine"] == "static"
    assert (latency.fused_empty_ms is not None) == (head_type == "medusa")
    decoder = SpeculativeDecoder(base.model, heads, topk=TOPK)
    used = _assert_live_steps_are_priced(profile, schedule, latency, decoder, base, prompts,
                                         engine="auto")
    if signal != "static":
        assert used == {0, 1, 2}  # empty-tree steps after drafted and empty ones were priced


def _eager_step_cost(head_type: str) -> dict:
    """ms of each eager step call, by kind, built from its work as ``_step_cost`` builds a
    static step's: ``plain`` (``DecodingState.plain_step``) 9, cheaper than the empty tree's
    step (10, and 0.5 to commit), so that one cannot stand in for the other; ``step`` 10 + 1
    per node + 0.5 per level, Hydra's levels after the first 0.4 each, and the heads' first
    results when nothing was prepared; ``prepare`` those results (Medusa 0.3 + 0.2 per row,
    Hydra head 1, 0.3); ``fused`` (the empty step that also prepares) 10 + 0.2 per head row;
    ``commit`` 0.5. Entropies cost nothing (as in ``_step_cost``)."""

    def heads(depth: int) -> float:
        return 0.3 + 0.2 * depth if head_type == "medusa" else 0.3

    def step(plan, prepared) -> float:
        ms = 10.0 + plan.num_nodes + 0.5 * plan.depth
        if head_type == "hydra":
            ms += 0.4 * max(plan.depth - 1, 0)
        if plan.depth and prepared is None:
            ms += heads(plan.depth)
        return ms

    return {"plain": 9.0, "step": step, "prepare": heads,
            "fused": lambda depth: 10.0 + 0.2 * depth, "commit": 0.5}


def _charge_eager_steps(monkeypatch, clock: _CostClock) -> None:
    """Move ``clock`` by ``clock.cost`` in every call of the eager runtime's step functions
    (the ones generation, the autoregressive baseline and the profiler share), and make the
    decoder's own clock read it. A tree step times itself, so its cost is charged in its
    ``accept``, which it runs inside that timing."""
    import types

    import entmtp.runtime._decode as decode

    cost = clock.cost

    def charging(accept, ms: float):
        def charged(*args):
            clock.ms += ms
            return accept(*args)

        return charged

    step, fused = SpeculativeDecoder.step, SpeculativeDecoder.fused_empty_step
    prepare, commit = SpeculativeDecoder.prepare, SpeculativeDecoder.commit
    plain_step = decode.DecodingState.plain_step

    def priced_step(self, state, plan, accept, prepared=None):
        return step(self, state, plan, charging(accept, cost["step"](plan, prepared)), prepared)

    def priced_fused(self, state, plan, accept, max_depth):
        return fused(self, state, plan, charging(accept, cost["fused"](max_depth)), max_depth)

    def priced_prepare(self, state, max_depth):
        clock.ms += cost["prepare"](max_depth)
        return prepare(self, state, max_depth)

    def priced_commit(state, outcome, path):
        clock.ms += cost["commit"]
        commit(state, outcome, path)

    def priced_plain_step(state, model):
        clock.ms += cost["plain"]
        return plain_step(state, model)

    monkeypatch.setattr(SpeculativeDecoder, "step", priced_step)
    monkeypatch.setattr(SpeculativeDecoder, "fused_empty_step", priced_fused)
    monkeypatch.setattr(SpeculativeDecoder, "prepare", priced_prepare)
    monkeypatch.setattr(SpeculativeDecoder, "commit", staticmethod(priced_commit))
    monkeypatch.setattr(decode.DecodingState, "plain_step", priced_plain_step)
    monkeypatch.setattr(decode, "time",
                        types.SimpleNamespace(perf_counter=lambda: clock.ms / 1000.0))


@pytest.mark.parametrize(("head_type", "signal"), [("medusa", DRAFT_ENTROPY),
                                                   ("hydra", DRAFT_ENTROPY),
                                                   ("hydra", "base"), ("medusa", "static")])
def test_the_profiled_eager_latency_prices_every_eager_step_as_the_replay_books_it(
        rt, monkeypatch, head_type, signal):
    """The eager counterpart: the profiler (engine="eager") times the eager runtime's own step
    functions and the replay charges them as ``EAGER_BOOKING`` says; with a clock that moves by
    each step call's cost, every live eager step's time equals the replay's modelled time of
    that step, for draft-entropy schedules with the empty tree (Medusa: fused, prepared before
    the choice otherwise; Hydra: prepared before the choice), a base-entropy schedule and a
    static tree; eager autoregressive decoding takes the model's autoregressive_ms per token."""

    clock = _CostClock(_eager_step_cost(head_type))
    _charge_eager_steps(monkeypatch, clock)
    base, prompts, heads, profile, schedule, latency = _priced_run(rt, head_type, signal, clock,
                                                                   engine="eager")
    assert latency.hardware["engine"] == "eager"
    assert latency.autoregressive_ms == pytest.approx(9.0)  # the plain step, not the empty tree's
    assert (latency.fused_empty_ms is not None) == (head_type == "medusa")
    decoder = SpeculativeDecoder(base.model, heads, topk=TOPK, engine="eager")
    used = _assert_live_steps_are_priced(profile, schedule, latency, decoder, base, prompts,
                                         engine="eager")
    if signal != "static":
        assert used == {0, 1, 2}  # empty-tree steps after drafted and empty ones were priced
