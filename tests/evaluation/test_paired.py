"""The paired bootstrap interval of a speedup, against a plain loop over the same resamples."""

from __future__ import annotations

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.evaluation._paired import (
    carryover_balanced_orders,
    paired_ratio_interval,
    ratio_of_rates,
)


def _reference_interval(ta, ma, tb, mb, *, level, resamples, seed):
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ta), size=(resamples, len(ta)))
    ratios = []
    for row in picks:
        rate_a = sum(ta[i] for i in row) / sum(ma[i] for i in row)
        rate_b = sum(tb[i] for i in row) / sum(mb[i] for i in row)
        ratios.append(rate_a / rate_b)
    ratios.sort()
    tail = (1 - level) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


def test_ratio_of_rates_is_a_ratio_of_totals():
    assert ratio_of_rates([10, 30], [100, 200], [20, 20], [400, 400]) == pytest.approx(
        (40 / 300) / (40 / 800))


def test_interval_matches_a_plain_loop():
    rng = np.random.default_rng(3)
    ta = rng.integers(50, 128, 12).tolist()
    ma = rng.uniform(2000, 6000, 12).tolist()
    tb = rng.integers(50, 128, 12).tolist()
    mb = rng.uniform(2000, 6000, 12).tolist()
    got = paired_ratio_interval(ta, ma, tb, mb, level=0.9, resamples=300, seed=5)
    want = _reference_interval(ta, ma, tb, mb, level=0.9, resamples=300, seed=5)
    assert got == pytest.approx(want, rel=1e-12)


def test_a_constant_per_prompt_ratio_has_no_spread():
    tokens = [100, 120, 90, 128]
    ms = [5000.0, 6100.0, 4400.0, 6600.0]
    faster = [m / 1.25 for m in ms]  # the same tokens in 80% of the time: 1.25x
    low, high = paired_ratio_interval(tokens, faster, tokens, ms, resamples=500)
    assert low == pytest.approx(1.25) and high == pytest.approx(1.25)


def test_interval_holds_the_point_estimate_and_narrows_with_more_prompts():
    rng = np.random.default_rng(0)

    def rows(n):
        tokens = np.full(n, 128.0)
        ms_b = rng.uniform(5000, 7000, n)
        ms_a = ms_b / 1.05 * rng.normal(1.0, 0.04, n)  # 5% faster, 4% noise per prompt
        return tokens, ms_a, tokens, ms_b

    few, many = rows(8), rows(200)
    low_few, high_few = paired_ratio_interval(*few)
    low_many, high_many = paired_ratio_interval(*many)
    assert low_few <= ratio_of_rates(*few) <= high_few
    assert low_many <= ratio_of_rates(*many) <= high_many
    assert high_many - low_many < high_few - low_few
    assert low_many > 1.0


@pytest.mark.parametrize("args, message", [
    (([], [], [], []), "same non-zero number"),
    (([1, 2], [1.0, 1.0], [1], [1.0]), "same non-zero number"),
    (([1], [0.0], [1], [1.0]), "positive decoding times"),
])
def test_bad_input_is_one_line(args, message):
    with pytest.raises(EntmtpError, match=message):
        paired_ratio_interval(*args)


@pytest.mark.parametrize("count", range(1, 10))
def test_run_orders_balance_places_and_predecessors(count):
    from collections import Counter

    rows = carryover_balanced_orders(count)
    assert len(rows) == (2 * count if count % 2 else count)
    assert all(sorted(row) == list(range(count)) for row in rows)
    per_place = len(rows) // count
    for place in range(count):
        assert Counter(row[place] for row in rows) == {m: per_place for m in range(count)}
    follows = Counter((a, b) for row in rows for a, b in zip(row[:-1], row[1:], strict=True))
    expected = len(rows) // count  # each ordered pair of distinct methods
    pairs = [(a, b) for a in range(count) for b in range(count) if a != b]
    assert {pair: follows[pair] for pair in pairs} == {pair: expected for pair in pairs}
    assert sum(follows.values()) == len(pairs) * expected


def test_run_orders_need_a_method():
    with pytest.raises(EntmtpError, match="at least one method"):
        carryover_balanced_orders(0)
