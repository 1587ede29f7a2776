"""The best chain against a plain reference replay written step by step."""

from __future__ import annotations

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch import LatencyModel, synthetic_profile
from entmtp.treesearch._chain import best_chain, chain_tree


def reference_chain_replay(profile, latency: LatencyModel, length: int) -> tuple[int, int, float]:
    """(tokens, steps, ms) of drafting the ``length`` chain at every step: a step at position i
    accepts 1 + the run of leading rank-0 heads (at most ``length``), cut at the trace's end."""
    tokens = steps = 0
    ms = 0.0
    step_ms = float(latency.step_ms(length, length))
    for trace in profile.traces:
        ranks = np.asarray(trace.ranks)
        last = len(ranks) - 1
        i = 0
        while i < last:
            run = 0
            while run < length and ranks[i, run] == 0:
                run += 1
            accepted = min(1 + run, last - i)
            tokens += accepted
            steps += 1
            ms += step_ms
            i += accepted
    return tokens, steps, ms


LATENCIES = {
    "gpu": LatencyModel.gpu_like(),
    "cpu": LatencyModel.cpu_like(),
    "steep": LatencyModel((0, 1, 2, 4), (10.0, 10.5, 14.0, 30.0), 10.0),
    "costly-draft": LatencyModel((0, 1, 4), (10.0, 25.0, 40.0), 10.0),
}


@pytest.mark.parametrize("latency_name", list(LATENCIES))
@pytest.mark.parametrize("seed", [0, 3])
def test_best_chain_is_the_fastest_chain_by_reference_replay(latency_name, seed):
    latency = LATENCIES[latency_name]
    profile = synthetic_profile(num_traces=5, positions=200, num_heads=4, seed=seed)
    choice = best_chain(profile, latency)
    runs = {n: reference_chain_replay(profile, latency, n) for n in range(0, 5)}
    fastest = min(range(1, 5), key=lambda n: (runs[n][2], n))
    assert choice.length == fastest
    tokens, steps, ms = runs[fastest]
    assert choice.mean_accept_length == pytest.approx(tokens / steps)
    assert choice.tokens_per_second == pytest.approx(1000.0 * tokens / ms)
    assert choice.tree == chain_tree(fastest)
    plain_tokens, _, plain_ms = runs[0]
    assert choice.plain_is_faster == (1000.0 * plain_tokens / plain_ms > choice.tokens_per_second)


def test_a_costly_draft_makes_plain_decoding_faster_and_says_so():
    profile = synthetic_profile(num_traces=3, positions=128, num_heads=4, seed=1)
    choice = best_chain(profile, LatencyModel((0, 1), (10.0, 1000.0), 10.0))
    assert choice.plain_is_faster and choice.length >= 1


def test_chain_tree_and_bad_lengths():
    assert chain_tree(3).paths == ((0,), (0, 0), (0, 0, 0))
    assert chain_tree(0).num_nodes == 0
    with pytest.raises(EntmtpError, match="non-negative"):
        chain_tree(-1)
    with pytest.raises(EntmtpError, match="at least one"):
        best_chain(synthetic_profile(num_traces=1, positions=16, seed=0), LatencyModel.gpu_like(),
                   max_length=0)
