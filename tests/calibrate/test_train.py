"""Head training: batched greedy trajectories against plain greedy decoding, targets and
accuracy against brute force, learning a learnable map, the cache format, and train_heads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from entmtp.calibrate._accuracy import HeadRanks, head_accuracy, head_ranks
from entmtp.calibrate._head_examples import _examples, _prefixes
from entmtp.calibrate._train import FitPlan, _batch_vocab, fit_heads, teacher_topk, warmup_cosine
from entmtp.calibrate._train_run import split_heldout, train_heads
from entmtp.calibrate._trajectories import (
    Trajectory,
    generate_trajectories,
    load_trajectories,
    save_trajectories,
    text_trajectories,
)
from entmtp.core import EntmtpError
from entmtp.model._heads import new_heads
from entmtp.treesearch import Tree
from support import SteppingClock, make_tiny_llama, make_varied_tiny_llama

VOCAB = 128


@pytest.fixture(scope="module")
def base():
    return make_varied_tiny_llama(seed=3)


def random_prompts(count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (count,), generator=generator)
    return [torch.randint(3, VOCAB, (int(n),), generator=generator).tolist() for n in lengths]


@torch.inference_mode()
def plain_greedy(model, prompt: list[int], max_new_tokens: int, eos: set[int]):
    """Reference: full forward without cache at each step."""
    ids = list(prompt)
    hiddens, tokens = [], []
    for _ in range(max_new_tokens):
        hidden = model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        token = int(model.lm_head(hidden).argmax())
        hiddens.append(hidden)
        tokens.append(token)
        ids.append(token)
        if token in eos:
            break
    return torch.stack(hiddens), torch.tensor(tokens)


def random_trajectories(count: int, seed: int, hidden_size: int = 32) -> list[Trajectory]:
    generator = torch.Generator().manual_seed(seed)
    result = []
    for index in range(count):
        length = int(torch.randint(1, 12, (1,), generator=generator))
        result.append(Trajectory(
            hidden=torch.randn(length, hidden_size, generator=generator),
            tokens=torch.randint(0, VOCAB, (length,), generator=generator),
            source=f"s{index % 2}",
        ))
    return result


def test_batched_generation_matches_plain_greedy(base):
    prompts = random_prompts(5, seed=1)
    batched = generate_trajectories(base, prompts, max_new_tokens=8, batch_size=3)
    assert len(batched) == len(prompts)
    for prompt, trajectory in zip(prompts, batched, strict=True):
        hidden, tokens = plain_greedy(base, prompt, 8, set())
        assert torch.equal(trajectory.tokens, tokens)
        torch.testing.assert_close(trajectory.hidden, hidden, atol=1e-4, rtol=1e-4)


def test_generation_stops_after_eos(base):
    prompts = random_prompts(4, seed=2)
    free = generate_trajectories(base, prompts, max_new_tokens=8, batch_size=4)
    eos = int(free[0].tokens[2])  # make the third token of the first run an EOS token
    base.config.eos_token_id = eos
    try:
        stopped = generate_trajectories(base, prompts, max_new_tokens=8, batch_size=4)
    finally:
        base.config.eos_token_id = 2
    for full, cut in zip(free, stopped, strict=True):
        hits = (full.tokens == eos).nonzero()
        end = int(hits[0]) + 1 if len(hits) else len(full)
        assert torch.equal(cut.tokens, full.tokens[:end])
    assert len(stopped[0]) <= 3


def test_text_trajectories_match_one_forward(base):
    ids = torch.randint(3, VOCAB, (23,), generator=torch.Generator().manual_seed(4)).tolist()
    whole = text_trajectories(base, [ids], max_length=64)
    assert len(whole) == 1 and torch.equal(whole[0].tokens, torch.tensor(ids[1:]))
    with torch.inference_mode():
        hidden = base.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0, :-1]
    torch.testing.assert_close(whole[0].hidden, hidden, atol=1e-5, rtol=1e-5)
    windows = text_trajectories(base, [ids], max_length=8, batch_size=2)
    # consecutive windows share one token, so every next-token pair appears exactly once
    assert torch.equal(torch.cat([w.tokens for w in windows]), torch.tensor(ids[1:]))


def test_examples_targets_and_prefixes_match_brute_force():
    trajectories = random_trajectories(9, seed=5)
    examples = _examples(trajectories, num_heads=3)
    expected_rows, expected_targets, row = [], [], 0
    for trajectory in trajectories:
        for s in range(len(trajectory)):
            targets = [int(trajectory.tokens[s + d]) if s + d < len(trajectory) else -1
                       for d in (1, 2, 3)]
            if targets[0] >= 0:
                expected_rows.append(row)
                expected_targets.append(targets)
            row += 1
    assert examples.rows.tolist() == expected_rows
    assert examples.targets.tolist() == expected_targets
    for depth in (1, 2, 3):
        valid = examples.targets[:, depth - 1] >= 0
        rows = examples.rows[valid]
        prefixes = _prefixes(examples, rows, depth)
        # the prefix and its target are consecutive tokens of one trajectory
        assert torch.equal(prefixes[:, 0], examples.tokens[rows])
        assert torch.equal(examples.tokens[rows + depth], examples.targets[valid, depth - 1])


def perturbed_heads(head_type: str, seed: int):
    """Three heads on a tiny model, their weights moved off the identity-like start so that
    ranks spread over the vocabulary."""
    heads = new_heads(make_tiny_llama(seed=seed), head_type=head_type, num_heads=3)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(torch.randn(parameter.shape) * 0.3)
    return heads


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_head_accuracy_matches_brute_force(head_type):
    heads = perturbed_heads(head_type, seed=6)
    trajectories = random_trajectories(7, seed=7)
    got = head_accuracy(heads, trajectories, batch_size=5)
    for depth in (1, 2, 3):
        hits1 = hits5 = total = 0
        for trajectory in trajectories:
            for s in range(len(trajectory) - depth):
                prefix = trajectory.tokens[s:s + depth][None]
                logits = heads.head_logits(depth, trajectory.hidden[s:s + 1], prefix)[0]
                target = int(trajectory.tokens[s + depth])
                rank = int((logits > logits[target]).sum())
                hits1 += rank == 0
                hits5 += rank < 5
                total += 1
        accuracy = got[depth - 1]
        assert accuracy.positions == total
        assert accuracy.top1 == pytest.approx(hits1 / total)
        assert accuracy.top5 == pytest.approx(hits5 / total)


def brute_force_ranks(heads, trajectories, topk):
    """(ranks, scored) per position with a future token, in _examples' order, head by head."""
    ranks, scored = [], []
    for trajectory in trajectories:
        for s in range(len(trajectory) - 1):
            row_ranks, row_scored = [], []
            for depth in range(1, heads.num_heads + 1):
                if s + depth >= len(trajectory):
                    row_ranks.append(-1)
                    row_scored.append(False)
                    continue
                prefix = trajectory.tokens[s:s + depth][None]
                logits = heads.head_logits(depth, trajectory.hidden[s:s + 1], prefix)[0]
                rank = int((logits > logits[int(trajectory.tokens[s + depth])]).sum())
                row_ranks.append(rank if rank < topk else -1)
                row_scored.append(True)
            ranks.append(row_ranks)
            scored.append(row_scored)
    return np.array(ranks), np.array(scored)


def brute_force_accept_length(tree, ranks):
    total = 0
    for row in ranks:
        depth = 0
        while depth < len(row) and row[depth] >= 0 and tuple(row[:depth + 1]) in tree:
            depth += 1
        total += 1 + depth
    return total / len(ranks)


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_head_ranks_and_accept_length_match_brute_force(head_type):
    heads = perturbed_heads(head_type, seed=16)
    trajectories = random_trajectories(6, seed=17)
    got = head_ranks(heads, trajectories, topk=7, batch_size=4)
    ranks, scored = brute_force_ranks(heads, trajectories, topk=7)
    assert got.topk == 7 and got.ranks.dtype == np.int16
    np.testing.assert_array_equal(got.ranks, ranks)
    np.testing.assert_array_equal(got.scored, scored)
    assert (got.ranks >= 0).any() and (got.ranks == -1).any()  # hits and misses both occur
    tree = Tree.from_paths([(0,), (1,), (6,), (0, 0), (0, 3), (1, 0), (0, 0, 0), (0, 3, 2)])
    assert got.accept_length(tree) == pytest.approx(brute_force_accept_length(tree, ranks))
    with pytest.raises(EntmtpError, match="top-8"):
        got.accept_length(Tree.from_paths([(7,)]))
    halves = HeadRanks.concat([head_ranks(heads, trajectories[:2], topk=7),
                               head_ranks(heads, trajectories[2:], topk=7)])
    np.testing.assert_array_equal(halves.ranks, ranks)
    np.testing.assert_array_equal(halves.scored, scored)
    deeper = HeadRanks.concat([got, head_ranks(heads, trajectories, topk=9)])
    assert deeper.topk == 7  # the shallower ranking bounds what the union can replay


def cyclic_trajectories(model, count: int, length: int, period: int, seed: int):
    """Token sequences that cycle with a fixed period; the hidden state is a fixed random vector
    per current token, so every future token is a function of the hidden state."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randn(VOCAB, model.config.hidden_size, generator=generator)
    cycle = torch.randperm(VOCAB, generator=generator)[:period]
    result = []
    for _ in range(count):
        start = int(torch.randint(0, period, (1,), generator=generator))
        tokens = cycle[(start + torch.arange(length)) % period]
        result.append(Trajectory(hidden=codes[tokens], tokens=tokens))
    return result


@pytest.mark.parametrize(
    ("head_type", "softmax_vocab"),
    [("medusa", "batch"), ("hydra", "batch"), ("hydra", "seen"), ("medusa", "full")],
)
def test_fit_learns_a_learnable_map_and_leaves_base_untouched(head_type, softmax_vocab):
    model = make_tiny_llama(seed=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    heads = new_heads(model, head_type=head_type, num_heads=3, shared_lm_head=False)
    data = cyclic_trajectories(model, count=12, length=20, period=5, seed=9)
    untrained = head_accuracy(heads, data)
    losses = fit_heads(heads, data, epochs=25, lr=1e-2, batch_size=64, seed=0,
                       softmax_vocab=softmax_vocab, frequent_tokens=2)
    trained = head_accuracy(heads, data)
    assert len(losses) == 25 and losses[-1] < losses[0]
    for new, old in zip(trained, untrained, strict=True):
        assert new.top1 > old.top1 and new.top1 > 0.9 and new.top5 >= new.top1
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not heads.training


def test_teacher_topk_is_the_base_models_own_distribution(base):
    trajectories = generate_trajectories(base, random_prompts(3, seed=21), max_new_tokens=6)
    hidden = torch.cat([t.hidden for t in trajectories])
    tokens = torch.cat([t.tokens for t in trajectories])
    heads = new_heads(base, head_type="medusa", num_heads=2)
    reports: list[tuple[str, int, int]] = []
    teacher = teacher_topk(heads, hidden, 4, batch_size=5,
                           progress=lambda *report: reports.append(report))
    assert teacher.ids.shape == teacher.probs.shape == (len(tokens), 4)
    rows = len(tokens)
    assert reports == [("teacher", done, rows) for done in [0, *range(5, rows, 5), rows]]
    # the greedy token a state chose is its distribution's most likely one
    assert torch.equal(teacher.ids[:, 0].long(), tokens)
    with torch.no_grad():
        top = torch.softmax(base.lm_head(hidden), dim=-1).topk(4, dim=-1)
    assert torch.equal(teacher.ids.long(), top.indices)
    torch.testing.assert_close(teacher.probs, top.values / top.values.sum(-1, keepdim=True))
    own = new_heads(base, head_type="medusa", num_heads=2, shared_lm_head=False)
    with pytest.raises(EntmtpError, match="their own projections"):
        teacher_topk(own, hidden, 4)


def soft_cross_entropy(heads, examples, teacher_ids, teacher_probs) -> float:
    """Brute force: sum over heads of the mean over positions of -sum_k q_k log p(id_k), the
    teacher read at the target position s + d."""
    total = 0.0
    with torch.no_grad():
        for depth in range(1, heads.num_heads + 1):
            terms = []
            for i, s in enumerate(examples.rows.tolist()):
                if examples.targets[i, depth - 1] < 0:
                    continue
                log_p = torch.log_softmax(
                    heads.head_logits(depth, examples.hidden[s:s + 1], None)[0], dim=-1)
                ids, probs = teacher_ids[s + depth].long(), teacher_probs[s + depth]
                terms.append(float(-(probs * log_p[ids]).sum()))
            total += sum(terms) / len(terms)
    return total


def test_distillation_loss_is_the_teachers_cross_entropy_at_the_target_position():
    model = make_tiny_llama(seed=22)
    heads = new_heads(model, head_type="medusa", num_heads=3, seed=1)
    every_token = Trajectory(hidden=torch.randn(VOCAB, 32), tokens=torch.arange(VOCAB))
    data = [*random_trajectories(5, seed=23), every_token]
    examples = _examples(data, heads.num_heads)
    full = teacher_topk(heads, examples.hidden, VOCAB)
    expected = soft_cross_entropy(heads, examples, full.ids, full.probs)
    # one batch holding every position and a vanishing step: the epoch's loss is the loss
    # of the untouched heads
    losses = fit_heads(heads, data, epochs=1, lr=1e-12, batch_size=len(examples.rows),
                       softmax_vocab="full", distill_topk=VOCAB)
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    # a top-k teacher in a batch vocabulary of every token (all are frequent: each occurs in
    # the data) is the top-k cross-entropy
    top = teacher_topk(heads, examples.hidden, 6)
    losses = fit_heads(heads, data, epochs=1, lr=1e-12, batch_size=len(examples.rows),
                       softmax_vocab="batch", frequent_tokens=VOCAB, random_negatives=1,
                       distill_topk=6)
    assert losses[0] == pytest.approx(soft_cross_entropy(heads, examples, top.ids, top.probs),
                                      rel=1e-5)


@pytest.mark.parametrize(("softmax_vocab", "k"), [("full", VOCAB), ("batch", 8)])
def test_distillation_learns_the_teachers_distribution(softmax_vocab, k):
    model = make_tiny_llama(seed=22)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=1)
    data = cyclic_trajectories(model, count=12, length=20, period=5, seed=23)
    with torch.no_grad():  # states whose distributions are peaked, not near uniform
        scale = 3.0 / float(model.lm_head(data[0].hidden).std())
    data = [Trajectory(hidden=t.hidden * scale, tokens=t.tokens) for t in data]
    examples = _examples(data, heads.num_heads)
    teacher = teacher_topk(heads, examples.hidden, k)  # the distribution it is trained on

    def distance() -> float:
        return soft_cross_entropy(heads, examples, teacher.ids, teacher.probs)

    before = distance()
    losses = fit_heads(heads, data, epochs=30, lr=1e-2, batch_size=64, seed=0,
                       softmax_vocab=softmax_vocab, frequent_tokens=2, random_negatives=4,
                       distill_topk=k)
    assert losses[-1] < losses[0]
    floor = 0.0  # the teacher's own entropy: the least the cross-entropy can be
    for depth in (1, 2):
        probs = teacher.probs[examples.rows[examples.targets[:, depth - 1] >= 0] + depth]
        floor += float(-(probs * probs.clamp(min=1e-30).log()).sum(-1).mean())
    after = distance()
    assert after - floor < 0.2 * (before - floor), (before, after, floor)


def test_distillation_needs_a_vocabulary_that_holds_its_targets():
    model = make_tiny_llama(seed=24)
    heads = new_heads(model, head_type="medusa", num_heads=2)
    data = cyclic_trajectories(model, count=2, length=6, period=3, seed=25)
    with pytest.raises(EntmtpError, match="'seen'"):
        fit_heads(heads, data, softmax_vocab="seen", distill_topk=4)
    with pytest.raises(EntmtpError, match="distill_topk"):
        fit_heads(heads, data, distill_topk=-1)


def test_batch_vocab_reindexes_targets():
    frequent = torch.tensor([50, 7, 9])
    targets = torch.tensor([[7, 120, -1], [3, 9, 120]])
    vocab, reindexed = _batch_vocab(frequent, targets)
    assert set(vocab.tolist()) == {3, 7, 9, 50, 120}
    valid = targets >= 0
    assert torch.equal(vocab[reindexed[valid]], targets[valid])
    assert bool((reindexed[~valid] == -1).all())


def test_fit_is_deterministic_for_a_seed():
    model = make_tiny_llama(seed=10)
    data = cyclic_trajectories(model, count=4, length=10, period=3, seed=11)
    hashes = []
    for _ in range(2):
        heads = new_heads(model, head_type="hydra", num_heads=2, seed=0)
        fit_heads(heads, data, epochs=2, lr=1e-2, batch_size=8, seed=5)
        hashes.append(heads.sha256())
    assert hashes[0] == hashes[1]


def test_trajectories_round_trip(tmp_path):
    trajectories = random_trajectories(6, seed=12)
    save_trajectories(tmp_path / "t.safetensors", trajectories)
    loaded = load_trajectories(tmp_path / "t.safetensors")
    assert len(loaded) == len(trajectories)
    for a, b in zip(trajectories, loaded, strict=True):
        assert torch.equal(a.hidden, b.hidden) and torch.equal(a.tokens, b.tokens)
        assert a.source == b.source
    with pytest.raises(EntmtpError):
        load_trajectories(tmp_path / "missing.safetensors")


def test_split_heldout_is_a_seeded_partition():
    trajectories = random_trajectories(20, seed=13)
    train, held = split_heldout(trajectories, fraction=0.25, seed=3)
    ids = {id(t) for t in train} | {id(t) for t in held}
    assert len(held) == 5 and len(train) == 15 and len(ids) == 20
    again, _ = split_heldout(trajectories, fraction=0.25, seed=3)
    assert [id(t) for t in again] == [id(t) for t in train]


def test_train_heads_end_to_end(base):
    heads = new_heads(base, head_type="medusa", num_heads=2)
    texts = random_prompts(10, seed=14)
    progress = []
    report = train_heads(
        base, heads, texts_or_prompts=texts, mode="self-distill", epochs=2, batch_size=16,
        max_new_tokens=6, heldout_fraction=0.2, progress=lambda *a: progress.append(a),
    )
    assert report.train_trajectories == 8 and report.heldout_trajectories == 2
    assert len(report.epoch_losses) == 2 and [a.depth for a in report.heldout] == [1, 2]
    assert {stage for stage, _, _ in progress} == {"generate", "train"}
    assert "head 2" in report.table()
    text_report = train_heads(base, heads, texts_or_prompts=texts, mode="text", epochs=1,
                              batch_size=16)
    assert text_report.mode == "text" and text_report.train_positions > 0
    with pytest.raises(EntmtpError):
        train_heads(base, heads, texts_or_prompts=texts, mode="rl")
    with pytest.raises(EntmtpError, match="encode_prompt"):
        train_heads(base, heads, texts_or_prompts=["some text"], epochs=1)


@pytest.mark.parametrize(("head_type", "shared"), [("medusa", False), ("hydra", True)])
def test_heads_on_a_bf16_base_train_in_float32(head_type, shared):
    model = make_tiny_llama(seed=8).to(torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    heads = new_heads(model, head_type=head_type, num_heads=3, shared_lm_head=shared)
    assert heads.dtype == torch.bfloat16
    data = cyclic_trajectories(model, count=12, length=20, period=5, seed=9)
    untrained = head_accuracy(heads, data)
    losses = fit_heads(heads, data, epochs=25, lr=1e-2, batch_size=64, seed=0,
                       frequent_tokens=2)
    assert {p.dtype for p in heads.parameters()} == {torch.float32}  # the master weights
    assert losses[-1] < losses[0]
    for new, old in zip(head_accuracy(heads, data), untrained, strict=True):
        assert new.top1 > old.top1 and new.top1 > 0.9
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, before[k])
               for k, v in model.state_dict().items())


def test_small_steps_are_kept_on_a_bf16_base():
    # Hydra's residual starts as the identity: a step of ~1e-4 on a weight of 1.0 is below
    # bf16's resolution there (2**-7) and would round away in bf16 weights.
    model = make_tiny_llama(seed=8).to(torch.bfloat16)
    heads = new_heads(model, head_type="hydra", num_heads=2)
    data = cyclic_trajectories(model, count=4, length=10, period=3, seed=9)
    fit_heads(heads, data, epochs=1, lr=1e-4, batch_size=64, seed=0)
    diagonal = heads.first[0].residual.weight.detach()[:, : model.config.hidden_size].diagonal()
    assert bool((diagonal != 1.0).any())


def test_warmup_cosine_rises_linearly_then_decays_to_zero():
    factor = warmup_cosine(200)  # 10 warm-up steps
    values = [factor(step) for step in range(200)]
    assert values[:10] == pytest.approx([(step + 1) / 10 for step in range(10)])
    assert values[10] == pytest.approx(1.0)
    assert all(later <= earlier for earlier, later in zip(values[10:], values[11:], strict=False))
    assert values[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 189 / 190)))
    assert warmup_cosine(3)(0) == 1.0  # fewer than 20 steps: a warm-up of one step


def test_fit_plan_shortens_only_to_what_ends_by_the_deadline():
    plan = FitPlan(planned=100, total=100)
    clock = 0.0
    while plan.taken < plan.total:  # 1 s per step, 50 s: about 47 steps fit (5% spare)
        plan.taken += 1
        clock += 1.0
        plan.fit_to(50.0, clock)
    assert 40 <= plan.taken <= 50 and plan.total == plan.taken < plan.planned
    roomy = FitPlan(planned=10, total=10)
    for step in range(1, 11):
        roomy.taken = step
        roomy.fit_to(1000.0, float(step))
    assert roomy.total == 10  # never lengthened, never cut when it fits
    late = FitPlan(planned=10, total=10, taken=1)
    late.fit_to(5.0, 6.0)  # past the deadline: stop now
    assert late.total == 1


@pytest.mark.parametrize("seconds_per_step", [0.0, 1.0])
def test_fit_heads_ends_by_its_deadline_with_the_learning_rate_decayed(seconds_per_step):
    model = make_tiny_llama(seed=8)
    heads = new_heads(model, head_type="medusa", num_heads=2)
    data = cyclic_trajectories(model, count=12, length=20, period=5, seed=9)
    plan = FitPlan()
    rates = []
    original = torch.optim.AdamW.step

    def step(optimizer, *args, **kwargs):
        rates.append(optimizer.param_groups[0]["lr"])
        return original(optimizer, *args, **kwargs)

    torch.optim.AdamW.step = step
    try:
        losses = fit_heads(heads, data, epochs=6, lr=1e-2, batch_size=32, seed=0,
                           deadline=30.0 if seconds_per_step else None,
                           clock=SteppingClock(seconds_per_step or 1e-9), plan=plan)
    finally:
        torch.optim.AdamW.step = original
    steps_per_epoch = math.ceil(len(_examples(data, heads.num_heads).rows) / 32)
    assert plan.planned == 6 * steps_per_epoch and plan.taken == len(rates)
    if seconds_per_step:  # one clock read per step: ~28 steps end by 30 s
        assert plan.taken < plan.planned and plan.taken <= 30
        assert rates[-1] < 0.1 * max(rates)  # the schedule decayed over the shortened run
        assert 1 <= len(losses) <= 6
    else:
        assert plan.taken == plan.planned and len(losses) == 6
