"""entropy_from_logits and topk_ranks against plain references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from entmtp.model._stats import entropy_from_logits, topk_ranks


def test_entropy_matches_numpy_reference():
    logits = torch.randn(5, 7, 33, generator=torch.Generator().manual_seed(0)) * 3
    x = logits.double().numpy()
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = -(p * np.log(p)).sum(-1)
    got = entropy_from_logits(logits)
    assert got.shape == (5, 7) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_entropy_bounds_uniform_and_masked():
    vocab = 50
    assert entropy_from_logits(torch.zeros(vocab)).item() == pytest.approx(math.log(vocab))
    one_hot = torch.full((vocab,), float("-inf"))
    one_hot[3] = 0.0
    assert entropy_from_logits(one_hot).item() == 0.0  # no nan from 0 * -inf
    two = torch.full((vocab,), float("-inf"))
    two[[1, 4]] = 2.0
    assert entropy_from_logits(two).item() == pytest.approx(math.log(2))


def test_entropy_of_half_precision_is_computed_in_float32():
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(1)) * 4
    half = entropy_from_logits(logits.half())
    assert half.dtype == torch.float32
    np.testing.assert_allclose(half.numpy(), entropy_from_logits(logits.half().float()).numpy())


def test_topk_ranks_match_brute_force_on_distinct_logits():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 9, 40, generator=gen)
    targets = torch.randint(0, 40, (6, 9), generator=gen)
    for k in (1, 5, 40, 100):
        got = topk_ranks(logits, targets, k)
        above = (logits > logits.gather(-1, targets[..., None])).sum(-1)  # distinct: exact rank
        expected = torch.where(above < min(k, 40), above, torch.full_like(above, -1))
        assert torch.equal(got, expected), k


def test_topk_ranks_follow_torch_topk_order_on_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.5, 3.0]])
    order = torch.topk(logits, 6, dim=-1).indices[0].tolist()
    for rank, token in enumerate(order):
        assert topk_ranks(logits, torch.tensor([token]), 6).item() == rank
        expected = rank if rank < 3 else -1
        assert topk_ranks(logits, torch.tensor([token]), 3).item() == expected


def test_topk_ranks_negative_target_is_a_miss_and_k_must_be_positive():
    logits = torch.randn(3, 10)
    assert topk_ranks(logits, torch.tensor([-1, -1, -1]), 10).tolist() == [-1, -1, -1]
    with pytest.raises(ValueError):
        topk_ranks(logits, torch.tensor([0, 0, 0]), 0)
