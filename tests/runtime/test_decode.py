"""Greedy tree decoding is lossless and accepts exactly what the offline replay predicts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.model._heads import new_heads
from entmtp.model._stats import entropy_from_logits
from entmtp.runtime._decode import SpeculativeDecoder, autoregressive_generate
from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler
from entmtp.runtime._verify import greedy_accept
from entmtp.treesearch._acceptance import accept_lengths
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._replay import replay
from entmtp.treesearch._schedule import DRAFT_ENTROPY, Schedule
from entmtp.treesearch._tree import Tree

NUM_HEADS = 4
TOPK = 6
PROMPTS = [[1, 17, 42, 99, 5], [1, 3], [1, 60, 61, 62, 63, 64, 65, 66, 120]]


@pytest.fixture(scope="module")
def setup(rt):
    model = rt.sharp_llama(3)
    references = {}
    for prompt in PROMPTS:
        ids = torch.tensor(prompt)
        references[tuple(prompt)] = rt.greedy_reference(model, ids, 48)
    return model, references


def _replayed_accepts(rt, model, prompt, continuation, ranks, generated, tree, head_type):
    profile = rt.oracle_profile(model, prompt, continuation, ranks, generated,
                                head_type=head_type, entropy_fn=entropy_from_logits)
    result = replay(profile, tree, LatencyModel.cpu_like())
    return result.step_position.tolist(), result.step_accept.tolist()


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_greedy_is_lossless_and_matches_replay_on_random_trees(rt, setup, head_type):
    model, references = setup
    rng = np.random.default_rng(7 if head_type == "medusa" else 8)
    for case in range(9):
        prompt = PROMPTS[case % len(PROMPTS)]
        ids = torch.tensor(prompt)
        reference = references[tuple(prompt)]
        ranks = rt.random_ranks(rng, len(reference), NUM_HEADS, TOPK, miss=0.15)
        heads = rt.OracleHeads(model, ids, reference, ranks, head_type=head_type, topk=TOPK,
                               seed=case)
        tree = rt.random_tree(rng, int(rng.integers(0, 40)), depth=NUM_HEADS, topk=TOPK)
        max_new = int(rng.integers(1, 40))
        result = SpeculativeDecoder(model, heads, topk=TOPK).generate(
            ids, StaticScheduler(tree), max_new_tokens=max_new
        )
        assert result.tokens == reference[:max_new], (case, tree)
        positions, accepts = _replayed_accepts(rt, model, ids, reference, ranks, max_new, tree,
                                               head_type)
        assert [s.position for s in result.step_log] == positions
        assert result.accept_lengths == accepts
        assert result.steps == len(result.step_log)


def test_perfect_draft_accepts_every_level_and_stops_at_max_new_tokens(rt, setup):
    model, references = setup
    prompt = torch.tensor(PROMPTS[0])
    reference = references[tuple(PROMPTS[0])]
    ranks = np.zeros((len(reference), NUM_HEADS), dtype=np.int64)
    heads = rt.OracleHeads(model, prompt, reference, ranks, head_type="medusa", topk=TOPK)
    chain = Tree.from_paths([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    for max_new in range(1, 13):
        result = decoder.generate(prompt, StaticScheduler(chain), max_new_tokens=max_new)
        assert result.tokens == reference[:max_new]
        full_steps = (max_new - 1) // (NUM_HEADS + 1)
        assert result.accept_lengths[:full_steps] == [NUM_HEADS + 1] * full_steps
        # the last step is cut so that its drafts never pass max_new_tokens
        _, accepts = _replayed_accepts(rt, model, prompt, reference, ranks, max_new, chain,
                                       "medusa")
        assert result.accept_lengths == accepts


def test_early_mismatch_stops_at_that_level(rt, setup):
    model, references = setup
    prompt = torch.tensor(PROMPTS[2])
    reference = references[tuple(PROMPTS[2])]
    ranks = np.zeros((len(reference), NUM_HEADS), dtype=np.int64)
    ranks[:, 2] = TOPK - 1  # head 3 ranks the true token where the tree has no node
    ranks[::3, 0] = -1  # every third position even head 1 misses
    heads = rt.OracleHeads(model, prompt, reference, ranks, head_type="hydra", topk=TOPK)
    chain = Tree.from_paths([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    result = SpeculativeDecoder(model, heads, topk=TOPK).generate(
        prompt, StaticScheduler(chain), max_new_tokens=40
    )
    assert result.tokens == reference[:40]
    for step in result.step_log[:-1]:
        assert step.accept_length == (1 if step.position % 3 == 0 else 3)
    expected = accept_lengths(chain, ranks)[[s.position for s in result.step_log[:-1]]]
    assert result.accept_lengths[:-1] == expected.tolist()


def test_empty_tree_decodes_like_autoregressive(rt, setup):
    model, references = setup
    prompt = torch.tensor(PROMPTS[1])
    reference = references[tuple(PROMPTS[1])]
    heads = new_heads(model, head_type="medusa", num_heads=NUM_HEADS, seed=0)
    empty = Tree.from_paths([])
    result = SpeculativeDecoder(model, heads, topk=TOPK).generate(
        prompt, StaticScheduler(empty), max_new_tokens=30
    )
    baseline = autoregressive_generate(model, prompt, max_new_tokens=30)
    assert result.tokens == baseline.tokens == reference[:30]
    assert result.accept_lengths == baseline.accept_lengths == [1] * 29
    assert all(s.num_nodes == 0 and s.depth == 0 for s in result.step_log)


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_eos_inside_an_accepted_path_stops_right_after_it(rt, setup, head_type):
    model, references = setup
    prompt = torch.tensor(PROMPTS[0])
    reference = references[tuple(PROMPTS[0])]
    ranks = np.zeros((len(reference), NUM_HEADS), dtype=np.int64)
    heads = rt.OracleHeads(model, prompt, reference, ranks, head_type=head_type, topk=TOPK)
    tree = Tree.from_paths([[0], [1], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 1]])
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    tested_inside = 0
    for index in range(1, 20):
        eos = reference[index]
        stop = reference.index(eos)  # generation ends at the first occurrence
        result = decoder.generate(prompt, StaticScheduler(tree), max_new_tokens=40,
                                  eos_token_ids=[eos])
        assert result.tokens == reference[: stop + 1]
        last = result.step_log[-1] if result.step_log else None
        # Every draft is right, so a step emits depth + 1 tokens unless the EOS cut it short:
        # then the EOS was a draft of the last step, not its next token.
        if last is not None and last.accept_length <= tree.depth:
            tested_inside += 1
    assert tested_inside > 0
    with_eos = model.generate(prompt[None], max_new_tokens=40, do_sample=False,
                              eos_token_id=reference[5], pad_token_id=0,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    again = decoder.generate(prompt, StaticScheduler(tree), max_new_tokens=40,
                             eos_token_ids=[reference[5]])
    assert again.tokens == with_eos[0, len(prompt):].tolist()


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_real_heads_are_lossless(rt, setup, head_type):
    """calibrate's heads (randomised so they draft something) through the same decoder."""
    model, references = setup
    heads = new_heads(model, head_type=head_type, num_heads=NUM_HEADS, seed=1)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    rng = np.random.default_rng(3)
    tree = rt.random_tree(rng, 30, depth=NUM_HEADS, topk=TOPK)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    for prompt in PROMPTS:
        result = decoder.generate(torch.tensor(prompt), StaticScheduler(tree), max_new_tokens=25)
        assert result.tokens == references[tuple(prompt)][:25]


@pytest.mark.parametrize("engine", ["auto", "eager"])
def test_autoregressive_matches_generate_and_logs_steps(rt, setup, engine):
    model, references = setup
    for prompt in PROMPTS:
        result = autoregressive_generate(model, torch.tensor([prompt]), max_new_tokens=20,
                                         engine=engine)
        assert result.tokens == references[tuple(prompt)][:20]
        assert result.steps == 19 and result.mean_accept_length == 1.0
        assert [s.position for s in result.step_log] == list(range(19))
        assert result.tokens_per_second > 0


def test_autoregressive_on_a_model_the_static_runtime_cannot_run(rt):
    """GPT-2 (learned positions) falls back to the eager runtime: the greedy loop at batch 1."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4,
                                       n_positions=128, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(60.0)  # varied continuations, not one repeated token
    prompt = torch.tensor([5, 17, 42, 9])
    reference = rt.greedy_reference(model, prompt, 16)
    assert len(set(reference)) > 1
    result = autoregressive_generate(model, prompt, max_new_tokens=16)
    assert result.tokens == reference and result.steps == 15
    stop = reference[5]
    cut = autoregressive_generate(model, prompt, max_new_tokens=16, eos_token_ids=[stop])
    assert cut.tokens == reference[: reference.index(stop) + 1]


def test_bad_arguments_raise_entmtp_errors(rt, setup):
    model, _ = setup
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    decoder = SpeculativeDecoder(model, heads, topk=4)
    prompt = torch.tensor(PROMPTS[0])
    with pytest.raises(EntmtpError, match="depth 3"):
        decoder.generate(prompt, StaticScheduler(Tree.from_paths([[0], [0, 0], [0, 0, 0]])),
                         max_new_tokens=5)
    with pytest.raises(EntmtpError, match="top-4"):
        decoder.generate(prompt, StaticScheduler(Tree.from_paths([[4]])), max_new_tokens=5)
    chain = StaticScheduler(Tree.from_paths([[0]]))
    with pytest.raises(EntmtpError, match="unknown"):
        decoder.generate(prompt, chain, max_new_tokens=5, mode="beam")
    with pytest.raises(EntmtpError, match="temperature"):
        decoder.generate(prompt, chain, max_new_tokens=5, mode="rejection")
    with pytest.raises(EntmtpError, match="input_ids"):
        decoder.generate(torch.zeros(2, 3, dtype=torch.long), chain, max_new_tokens=5)
    assert decoder.generate(prompt, chain, max_new_tokens=0).tokens == []
    other = rt.make_tiny_llama(0, vocab_size=64)
    with pytest.raises(EntmtpError, match="vocab"):
        SpeculativeDecoder(other, heads)


def test_on_step_streams_every_emitted_token_once(rt, setup):
    model, references = setup
    prompt = torch.tensor(PROMPTS[0])
    reference = references[tuple(PROMPTS[0])]
    ranks = np.zeros((len(reference), NUM_HEADS), dtype=np.int64)
    heads = rt.OracleHeads(model, prompt, reference, ranks, head_type="medusa", topk=TOPK)
    calls = []
    result = SpeculativeDecoder(model, heads, topk=TOPK).generate(
        prompt, StaticScheduler(Tree.from_paths([[0], [0, 0]])), max_new_tokens=17,
        on_step=lambda step, new: calls.append((step, list(new))),
    )
    assert calls[0][0] is None and [s for s, _ in calls[1:]] == result.step_log
    assert [t for _, new in calls for t in new] == result.tokens == reference[:17]


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_draft_signal_runs_each_head_once_per_step_and_is_lossless(rt, setup, head_type, engine):
    """The heads run once per step although head 1 is needed before the tree is chosen: the
    eager runtime prepares at the start of each step, the static one at the end of each step for
    the next (and once after the prefill, so once more per generation)."""
    model, references = setup
    rng = np.random.default_rng(12)
    prompt = torch.tensor(PROMPTS[0])
    reference = references[tuple(PROMPTS[0])]
    ranks = rt.random_ranks(rng, len(reference), NUM_HEADS, TOPK, miss=0.15)
    # an oracle's head 1 ranks a permutation of -arange(V): the same entropy at every state
    vocab = model.get_output_embeddings().weight.shape[0]
    h1 = float(entropy_from_logits(-torch.arange(vocab, dtype=torch.float32)))
    shallow = Tree.from_paths([[0], [1], [0, 0]])
    deep = rt.random_tree(rng, 25, depth=NUM_HEADS, topk=TOPK)
    assert deep.depth == NUM_HEADS
    for threshold, served in ((h1 + 0.5, shallow), (h1 - 0.5, deep)):
        heads = rt.OracleHeads(model, prompt, reference, ranks, head_type=head_type, topk=TOPK)
        schedule = Schedule((shallow, deep), (threshold,), EntropyEstimator.last(),
                            DRAFT_ENTROPY)
        result = SpeculativeDecoder(model, heads, topk=TOPK, engine=engine).generate(
            prompt, BundleScheduler(schedule), max_new_tokens=30
        )
        assert result.tokens == reference[:30]
        preparations = result.steps + (engine == "static")
        for step in result.step_log:
            assert step.entropy_estimate == pytest.approx(h1, abs=1e-5)
            assert step.depth == served.depth
        positions, accepts = _replayed_accepts(rt, model, prompt, reference, ranks, 30, served,
                                               head_type)
        assert [s.position for s in result.step_log] == positions
        assert result.accept_lengths == accepts
        depth_one_calls = [rows for depth, rows in heads.calls if depth == 1]
        assert depth_one_calls == [1] * preparations
        if head_type == "medusa":  # every step prepares heads 1..deepest tree, once each
            expected = [(d, 1) for d in range(1, NUM_HEADS + 1)] * preparations
            assert heads.calls == expected


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def test_fused_empty_step_leaves_what_the_plain_step_leaves(rt, setup):
    """Same cache (exactly), hidden state and next token as ``step`` on the empty tree; its
    prepared heads are ``prepare`` of the state it leaves."""
    model, _ = setup
    heads = new_heads(model, head_type="medusa", num_heads=NUM_HEADS, seed=1)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    assert decoder.fuses_empty
    plan = decoder.plan(Tree.from_paths([]))
    greedy = greedy_accept
    fused_state, _ = decoder.prefill(PROMPTS[0], lambda logits: int(logits.argmax()))
    plain_state, _ = decoder.prefill(PROMPTS[0], lambda logits: int(logits.argmax()))
    for _ in range(6):  # a run of empty steps, each from the state the last one left
        fused, prepared = decoder.fused_empty_step(fused_state, plan, greedy, 3)
        plain = decoder.step(plain_state, plan, greedy)
        assert (fused.path, fused.next_token) == (plain.path, plain.next_token) == (
            [0], int(plain.logits[0].argmax()))
        torch.testing.assert_close(fused.logits, plain.logits, rtol=1e-5, atol=1e-5)
        decoder.commit(fused_state, fused, fused.path)
        decoder.commit(plain_state, plain, plain.path)
        assert (fused_state.past_len, fused_state.pending) == (
            plain_state.past_len, plain_state.pending)
        assert torch.equal(fused_state.hidden, plain_state.hidden)
        for a, b in zip(_cache_tensors(fused_state.cache), _cache_tensors(plain_state.cache),
                        strict=True):
            assert torch.equal(a, b)
        reference = decoder.prepare(fused_state, 3)
        assert prepared.depth == reference.depth == 3
        torch.testing.assert_close(prepared.logits, reference.logits, rtol=1e-5, atol=1e-5)


def test_fused_empty_step_refuses_heads_or_trees_it_cannot_fuse(rt, setup):
    model, _ = setup
    greedy = greedy_accept
    for head_type, shared in (("hydra", True), ("medusa", False)):
        heads = new_heads(model, head_type=head_type, num_heads=NUM_HEADS, seed=1,
                          shared_lm_head=shared)
        decoder = SpeculativeDecoder(model, heads, topk=TOPK)
        assert not decoder.fuses_empty
        state, _ = decoder.prefill(PROMPTS[0], lambda logits: int(logits.argmax()))
        with pytest.raises(EntmtpError, match="lm_head"):
            decoder.fused_empty_step(state, decoder.plan(Tree.from_paths([])), greedy, 3)
    heads = new_heads(model, head_type="medusa", num_heads=NUM_HEADS, seed=1)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    state, _ = decoder.prefill(PROMPTS[0], lambda logits: int(logits.argmax()))
    with pytest.raises(EntmtpError, match="empty tree"):
        decoder.fused_empty_step(state, decoder.plan(Tree.from_paths([[0]])), greedy, 3)


@pytest.mark.parametrize("signal", ["base_entropy", DRAFT_ENTROPY])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_a_one_tree_bundle_runs_exactly_the_static_path(setup, signal, head_type):
    """The same step objects, in the same order, as the tree under a static scheduler, and no
    entropy read: a bundle that ships its best static tree costs nothing more per step."""
    model, _ = setup
    heads = new_heads(model, head_type=head_type, num_heads=NUM_HEADS)
    tree = Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]])
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    engine = decoder.static_engine
    ran: list[object] = []
    run = engine.run
    engine.run = lambda step, past_len: ran.append(step) or run(step, past_len)
    outputs = []
    for scheduler in (StaticScheduler(tree),
                      BundleScheduler(Schedule((tree,), (), EntropyEstimator.last(), signal))):
        ran.clear()
        result = decoder.generate(torch.tensor(PROMPTS[0]), scheduler, max_new_tokens=24)
        outputs.append((result.tokens, list(ran)))
        assert all(step.base_entropy is False and step.prepare_depth == 0 for step in ran)
    assert outputs[0] == outputs[1]
