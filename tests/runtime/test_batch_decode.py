"""A batch decodes every row exactly as that row decodes alone (greedy, float32): one tree per
step for the whole batch, per-row positions, slots, acceptance and compaction, finished rows
masked out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.runtime._decode import (
    SpeculativeDecoder,
    autoregressive_generate,
    autoregressive_generate_batch,
)
from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler, choose_for_rows
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._run import reference_tree
from entmtp.treesearch._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule
from entmtp.treesearch._tree import Tree

NUM_HEADS = 4
TOPK = 10
NEW_TOKENS = 40
# Different lengths: each row attends to its own past, written at its own slots.
PROMPTS = [[1, 17, 42, 99, 5], [1, 3], [1, 60, 61, 62, 63, 64, 65, 66, 120], [2, 9, 9]]
CHAIN = Tree.from_paths([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
DEEP = Tree.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1],
                        [0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0], [0, 1, 0, 0]])
EMPTY = Tree.from_paths([])


@pytest.fixture(scope="module")
def setup(rt):
    model = rt.sharp_llama(3)
    references = [rt.greedy_reference(model, torch.tensor(p), NEW_TOKENS) for p in PROMPTS]
    return model, references


def _oracle(rt, model, references, head_type: str, seed: int):
    rng = np.random.default_rng(seed)
    oracles = [
        rt.OracleHeads(model, torch.tensor(prompt), reference,
                       rt.random_ranks(rng, len(reference), NUM_HEADS, TOPK, miss=0.2),
                       head_type=head_type, topk=TOPK, seed=seed + row)
        for row, (prompt, reference) in enumerate(zip(PROMPTS, references, strict=True))
    ]
    return rt.BatchOracleHeads(oracles)


def _schedules() -> dict[str, object]:
    trees = (EMPTY, CHAIN, DEEP)
    return {
        "chain": StaticScheduler(CHAIN),
        "deep": StaticScheduler(DEEP),
        "mc_sim_7b_63": StaticScheduler(reference_tree("mc_sim_7b_63")),
        "base": BundleScheduler(Schedule((DEEP, CHAIN, EMPTY), (0.5, 1.5),
                                         EntropyEstimator.ema(0.5), BASE_ENTROPY)),
        "draft": BundleScheduler(Schedule(trees[::-1], (1.0, 2.5), EntropyEstimator.last(),
                                          DRAFT_ENTROPY)),
    }


def _expected(reference: list[int], max_new_tokens: int, eos: frozenset[int]) -> list[int]:
    tokens = reference[:max_new_tokens]
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1]
    return tokens


@pytest.mark.parametrize("window", ["filled", "full"])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_every_row_of_a_batch_decodes_as_it_does_alone(rt, setup, head_type, window):
    """Lossless on every row for static trees and for base- and draft-entropy schedules; an EOS
    finishes one row early and ``max_new_tokens`` cuts the others. With a static tree each row's
    steps (positions, trees, accept lengths) are also those of decoding it alone."""
    model, references = setup
    heads = _oracle(rt, model, references, head_type, seed=5)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window=window)
    eos = frozenset({references[1][7]})  # row 1 stops at its 8th token (others may too)
    for name, scheduler in _schedules().items():
        batch = decoder.generate_batch([torch.tensor(p) for p in PROMPTS], scheduler,
                                       max_new_tokens=30, eos_token_ids=eos)
        assert len(batch.rows) == len(PROMPTS)
        assert len(batch.rows[1].tokens) <= 8
        for row, result in enumerate(batch.rows):
            assert result.tokens == _expected(references[row], 30, eos), (name, row)
            assert sum(result.accept_lengths) == len(result.tokens) - 1
            if isinstance(scheduler, StaticScheduler):
                alone = decoder.generate(torch.tensor(PROMPTS[row]), scheduler,
                                         max_new_tokens=30, eos_token_ids=eos)
                assert result.accept_lengths == alone.accept_lengths, (name, row)
                assert [s.position for s in result.step_log] == \
                    [s.position for s in alone.step_log]
        assert batch.steps == max(row.steps for row in batch.rows)
        assert batch.decode_tokens == sum(len(r.tokens) - 1 for r in batch.rows)


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_a_batch_with_padded_widths_is_lossless(rt, setup, head_type):
    model, references = setup
    heads = _oracle(rt, model, references, head_type, seed=9)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, padded_nodes={4: 7, 11: 15})
    batch = decoder.generate_batch([torch.tensor(p) for p in PROMPTS], _schedules()["base"],
                                   max_new_tokens=NEW_TOKENS)
    for row, result in enumerate(batch.rows):
        assert result.tokens == references[row], row


def test_a_batch_of_one_is_the_one_row_decode(rt, setup):
    model, references = setup
    heads = _oracle(rt, model, references, "medusa", seed=3)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    scheduler = _schedules()["base"]
    one = decoder.generate_batch([torch.tensor(PROMPTS[2])], scheduler, max_new_tokens=25)
    alone = decoder.generate(torch.tensor(PROMPTS[2]), scheduler, max_new_tokens=25)
    assert one.rows[0].tokens == alone.tokens
    assert [(s.position, s.tree_index, s.accept_length) for s in one.rows[0].step_log] == \
        [(s.position, s.tree_index, s.accept_length) for s in alone.step_log]
    assert one.rows[0].decode_ms == one.decode_ms


def test_the_engine_switches_batch_sizes_and_back(rt, setup):
    """One engine decodes a batch of 4, then one row, then 2: every result lossless."""
    model, references = setup
    heads = _oracle(rt, model, references, "hydra", seed=4)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    scheduler = StaticScheduler(DEEP)
    for rows in ([0, 1, 2, 3], [2], [3, 0]):
        batch = decoder.generate_batch([torch.tensor(PROMPTS[r]) for r in rows], scheduler,
                                       max_new_tokens=NEW_TOKENS)
        assert [r.tokens for r in batch.rows] == [references[r] for r in rows]
        assert decoder.static_engine.rows == len(rows)
    single = decoder.generate(torch.tensor(PROMPTS[1]), scheduler, max_new_tokens=NEW_TOKENS)
    assert single.tokens == references[1] and decoder.static_engine.rows == 1


def test_a_finished_row_stops_moving(rt, setup):
    """A row that finished keeps its past length while the others go on."""
    model, references = setup
    heads = _oracle(rt, model, references, "medusa", seed=6)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    eos = frozenset({references[1][2]})
    pasts = []
    decoder.generate_batch([torch.tensor(p) for p in PROMPTS], StaticScheduler(CHAIN),
                           max_new_tokens=NEW_TOKENS, eos_token_ids=eos,
                           on_step=lambda row, log, tokens: pasts.append(
                               decoder.static_engine.past_len.tolist()))
    engine = decoder.static_engine
    finished_at = [p[1] for p in pasts]
    assert engine.live.tolist()[1] == 0
    assert finished_at[-1] == finished_at[len(finished_at) // 2]  # frozen once it finished
    assert max(engine.past_len.tolist()) < engine.capacity


def test_autoregressive_batch_equals_decoding_each_prompt(rt, setup):
    model, references = setup
    batch = autoregressive_generate_batch(model, [torch.tensor(p) for p in PROMPTS],
                                          max_new_tokens=NEW_TOKENS)
    assert [r.tokens for r in batch.rows] == references
    assert all(r.accept_lengths == [1] * (NEW_TOKENS - 1) for r in batch.rows)
    assert autoregressive_generate(model, torch.tensor(PROMPTS[0]),
                                   max_new_tokens=NEW_TOKENS).tokens == references[0]


def test_batches_refuse_in_one_line_what_they_cannot_run(rt, setup):
    model, references = setup
    heads = _oracle(rt, model, references, "medusa", seed=2)
    with pytest.raises(EntmtpError, match="static runtime only"):
        SpeculativeDecoder(model, heads, topk=TOPK, engine="eager").generate_batch(
            [torch.tensor(PROMPTS[0])], StaticScheduler(CHAIN), max_new_tokens=5)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    with pytest.raises(EntmtpError, match="at least one prompt"):
        decoder.generate_batch([], StaticScheduler(CHAIN), max_new_tokens=5)


def test_a_batch_chooses_the_tree_at_the_mean_estimate():
    schedule = Schedule((DEEP, CHAIN, EMPTY), (0.5, 1.5), EntropyEstimator.last(), BASE_ENTROPY)
    rows = [BundleScheduler(schedule) for _ in range(3)]
    for scheduler, entropy in zip(rows, (0.1, 0.2, 2.4), strict=True):
        scheduler.reset()
        scheduler.observe([entropy])
    assert [s.choose().index for s in rows] == [0, 0, 2]
    choice = choose_for_rows(rows)  # mean 0.9: the middle tree, none of the rows' own
    assert choice.index == 1 and choice.estimate == pytest.approx(0.9)
    assert choose_for_rows(rows[2:]).index == 2  # one row: its own choice
    static = [StaticScheduler(CHAIN), StaticScheduler(CHAIN)]
    assert choose_for_rows(static).tree is CHAIN
