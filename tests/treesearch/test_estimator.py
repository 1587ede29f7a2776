"""Entropy estimators: offline vectors against plain loops, online state against offline."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._estimator import EntropyEstimator

ESTIMATORS = [
    EntropyEstimator.ema(1.0),
    EntropyEstimator.ema(0.5),
    EntropyEstimator.ema(0.037),
    EntropyEstimator.ema(1e-4),
    EntropyEstimator.window(1),
    EntropyEstimator.window(3),
    EntropyEstimator.window(17),
    EntropyEstimator.last(),
]


def plain_estimates(estimator: EntropyEstimator, entropy) -> list[float]:
    """The definitions, one position at a time."""
    values = [float(h) for h in entropy]
    out = []
    for i, h in enumerate(values):
        if estimator.kind == "ema":
            prev = out[-1] if out else None
            out.append(h if prev is None else estimator.alpha * h + (1 - estimator.alpha) * prev)
        elif estimator.kind == "window":
            recent = values[max(0, i + 1 - estimator.size) : i + 1]
            out.append(math.fsum(recent) / len(recent))
        else:
            out.append(h)
    return out


def random_entropy(rng: np.random.Generator, n: int) -> np.ndarray:
    # Profiles store float32 nats; mix calm and spiky stretches.
    scale = rng.choice([0.05, 1.0, 6.0], size=n)
    return (rng.exponential(1.0, size=n) * scale).astype(np.float32)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.describe())
def test_estimates_match_the_definition(estimator):
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 64, 1000):
        entropy = random_entropy(rng, n)
        got = estimator.estimates(entropy)
        assert got.dtype == np.float64 and got.shape == (n,)
        np.testing.assert_allclose(got, plain_estimates(estimator, entropy), rtol=0, atol=1e-12)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.describe())
def test_online_state_matches_offline_for_any_chunking(estimator):
    rng = np.random.default_rng(2)
    entropy = random_entropy(rng, 300)
    offline = estimator.estimates(entropy)
    for _ in range(5):
        state = estimator.new_state()
        cuts = np.sort(rng.choice(np.arange(1, 300), size=rng.integers(0, 40), replace=False))
        seen = 0
        for chunk in np.split(entropy, cuts):
            state.update(chunk.tolist() if rng.random() < 0.5 else chunk)
            seen += len(chunk)
            assert state.count == seen
            i = seen - 1
            if estimator.kind == "ema":
                assert abs(state.value - offline[i]) <= 1e-12
            else:  # window and last perform the same float operations in the same order
                assert state.value == offline[i]


def test_online_state_accepts_scalars_and_rejects_reading_before_data():
    state = EntropyEstimator.ema(0.3).new_state()
    with pytest.raises(EntmtpError, match="before the first entropy"):
        _ = state.value
    state.update(2.0)
    assert state.value == 2.0
    state.update(1.0)
    assert state.value == pytest.approx(0.3 * 1.0 + 0.7 * 2.0, abs=1e-15)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.describe())
def test_trace_starts_restart_the_estimator(estimator):
    rng = np.random.default_rng(3)
    lengths = [7, 0, 1, 40, 0, 13]
    parts = [random_entropy(rng, n) for n in lengths]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    together = estimator.estimates(np.concatenate(parts), trace_starts=starts)
    separately = np.concatenate([estimator.estimates(p) for p in parts])
    np.testing.assert_allclose(together, separately, rtol=0, atol=1e-12)


def test_empty_entropy_gives_empty_estimates():
    for estimator in ESTIMATORS:
        assert estimator.estimates(np.zeros(0, dtype=np.float32)).shape == (0,)


def test_bad_trace_starts_are_rejected():
    with pytest.raises(EntmtpError, match="trace_starts"):
        EntropyEstimator.ema(0.5).estimates(np.ones(4), trace_starts=[1, 2])
    with pytest.raises(EntmtpError, match="trace_starts"):
        EntropyEstimator.ema(0.5).estimates(np.ones(4), trace_starts=[0, 9])


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.describe())
def test_json_round_trip(estimator):
    obj = json.loads(json.dumps(estimator.to_json()))
    assert obj["kind"] == estimator.kind
    assert EntropyEstimator.from_json(obj) == estimator


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"kind": "median"}, "kind"),
        ({"kind": "ema"}, "alpha"),
        ({"kind": "ema", "alpha": 0.0}, "alpha"),
        ({"kind": "ema", "alpha": 1.5}, "alpha"),
        ({"kind": "ema", "alpha": float("nan")}, "alpha"),
        ({"kind": "ema", "alpha": "0.3"}, "alpha"),
        ({"kind": "window", "size": 0}, "size"),
        ({"kind": "window", "size": 2.5}, "size"),
        ({"kind": "window", "size": True}, "size"),
        ({"kind": "last", "size": 3}, "size"),
        ({"kind": "ema", "alpha": 0.5, "size": 3}, "size"),
        ({"alpha": 0.5}, "kind"),
        ("ema", "kind"),
    ],
)
def test_from_json_rejects_bad_estimators(obj, field):
    with pytest.raises(EntmtpError, match=field):
        EntropyEstimator.from_json(obj)
