"""Synthetic profiles: determinism, the rank contract, regimes, and the structure they promise."""

from __future__ import annotations

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._acceptance import acceptance_table, independence_error
from entmtp.treesearch._greedy import best_tree
from entmtp.treesearch._profile import Profile
from entmtp.treesearch._synthetic import synthetic_profile


@pytest.fixture(scope="module")
def profile() -> Profile:
    return synthetic_profile(num_traces=16, positions=384, seed=0)


def test_deterministic_per_seed() -> None:
    a = synthetic_profile(num_traces=3, positions=64, seed=11)
    b = synthetic_profile(num_traces=3, positions=64, seed=11)
    c = synthetic_profile(num_traces=3, positions=64, seed=12)
    np.testing.assert_array_equal(a.ranks(), b.ranks())
    np.testing.assert_array_equal(a.entropy(), b.entropy())
    assert [t.prompt_length for t in a.traces] == [t.prompt_length for t in b.traces]
    assert not np.array_equal(a.ranks(), c.ranks())


@pytest.mark.parametrize(("heads", "topk"), [(1, 1), (3, 5), (5, 10)])
def test_shapes_meta_and_rank_contract(heads: int, topk: int) -> None:
    positions = 50
    p = synthetic_profile(num_traces=4, positions=positions, num_heads=heads, topk=topk, seed=2,
                          task="code", head_type="hydra")
    assert p.meta.num_heads == heads and p.meta.topk == topk
    assert p.meta.task == "code" and p.meta.head_type == "hydra"
    assert [t.prompt_index for t in p.traces] == [0, 1, 2, 3]
    assert len({t.prompt_id for t in p.traces}) == 4
    for trace in p.traces:
        assert trace.ranks.shape == (positions, heads) and trace.ranks.dtype == np.int16
        assert trace.entropy.dtype == np.float32 and np.all(trace.entropy > 0)
        assert trace.ranks.min() >= -1 and trace.ranks.max() < topk
        i, j = np.meshgrid(np.arange(positions), np.arange(1, heads + 1), indexing="ij")
        assert np.all(trace.ranks[i + j >= positions] == -1)  # past the end of the trajectory
        assert np.any(trace.ranks[i + j < positions] >= 0)


def test_bad_arguments_rejected() -> None:
    with pytest.raises(EntmtpError):
        synthetic_profile(num_heads=0)
    with pytest.raises(EntmtpError):
        synthetic_profile(positions=0)


def test_entropy_alternates_sticky_regimes(profile: Profile) -> None:
    for trace in profile.traces:
        entropy = trace.entropy.astype(np.float64)
        high = entropy > 1.4
        assert 0.05 < high.mean() < 0.95
        switches = np.count_nonzero(high[1:] != high[:-1])
        # Noise flips some positions, but regimes last: far fewer switches than coin flips.
        assert switches < 0.25 * len(entropy)
    entropy = profile.entropy()
    assert np.mean(entropy < 0.9) > 0.3 and np.mean(entropy > 1.8) > 0.2


def test_acceptance_falls_with_entropy_and_depth(profile: Profile) -> None:
    table = acceptance_table(profile.entropy(), profile.ranks(), topk=10, num_buckets=4)
    top1 = table.rank_probs[:, :, 0]
    assert top1[0, 0] > 0.65 and top1[-1, 0] < 0.5
    assert top1[0, 0] - top1[-1, 0] > 0.25
    assert np.all(np.diff(top1, axis=1) < 0)  # deeper heads are worse, in every bucket
    # High entropy puts relatively more of the hits on ranks past the first.
    tail_share = 1 - top1 / table.topk_acceptance[:, :, -1]
    assert tail_share[-1, 0] > tail_share[0, 0]


def test_independence_model_is_measurably_off(profile: Profile) -> None:
    ranks = profile.ranks()
    tree = best_tree(ranks, 32)
    dependent = independence_error(tree, ranks, 10)
    # Shuffling each head's column separately keeps the marginals and removes the dependence.
    rng = np.random.default_rng(0)
    shuffled = np.stack([rng.permutation(ranks[:, j]) for j in range(ranks.shape[1])], axis=1)
    independent = independence_error(tree, shuffled, 10)
    assert abs(dependent["relative_error"]) > 0.02
    assert abs(dependent["relative_error"]) > 3 * abs(independent["relative_error"])


def test_saves_and_loads(profile: Profile, tmp_path) -> None:
    loaded = Profile.load(profile.save(tmp_path / "synthetic.npz"))
    np.testing.assert_array_equal(loaded.ranks(), profile.ranks())
    assert loaded.meta == profile.meta
