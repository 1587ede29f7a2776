"""Profile storage and shard merging."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._profile import Profile, ProfileMeta, Trace, merge_profiles


def make_profile(num_traces: int = 5, heads: int = 3, seed: int = 0, *,
                 draft: bool = True) -> Profile:
    rng = np.random.default_rng(seed)
    traces = []
    for i in range(num_traces):
        positions = int(rng.integers(0, 40))
        traces.append(
            Trace(
                prompt_index=i,
                prompt_id=f"task/{i} \u00e9",
                entropy=rng.gamma(2.0, 1.0, positions).astype(np.float32),
                ranks=rng.integers(-1, 10, size=(positions, heads)),
                prompt_length=int(rng.integers(1, 500)),
                draft_entropy=rng.gamma(1.5, 1.0, positions) if draft else None,
            )
        )
    meta = ProfileMeta(model="m", vocab_size=128, hidden_size=32, num_heads=heads, task="code",
                       topk=10, split="calibration", max_new_tokens=40, seed=seed,
                       extra={"note": "x"})
    return Profile(meta, traces)


def assert_same(a: Profile, b: Profile) -> None:
    assert a.meta == b.meta
    assert len(a.traces) == len(b.traces)
    for x, y in zip(a.traces, b.traces, strict=True):
        assert (x.prompt_index, x.prompt_id, x.prompt_length) == (
            y.prompt_index, y.prompt_id, y.prompt_length
        )
        assert x.entropy.dtype == y.entropy.dtype and x.ranks.dtype == y.ranks.dtype
        np.testing.assert_array_equal(x.entropy, y.entropy)
        np.testing.assert_array_equal(x.ranks, y.ranks)
        if x.draft_entropy is None:
            assert y.draft_entropy is None
        else:
            assert y.draft_entropy.dtype == np.float32
            np.testing.assert_array_equal(x.draft_entropy, y.draft_entropy)


def test_save_load_round_trip_is_exact(tmp_path) -> None:
    profile = make_profile()
    loaded = Profile.load(profile.save(tmp_path / "p.npz"))
    assert_same(profile, loaded)
    assert loaded.num_positions == profile.num_positions
    np.testing.assert_array_equal(loaded.ranks(), profile.ranks())
    np.testing.assert_array_equal(loaded.entropy(), profile.entropy())


def test_profile_without_draft_entropy_round_trips_and_says_so(tmp_path) -> None:
    old = make_profile(draft=False)
    loaded = Profile.load(old.save(tmp_path / "old.npz"))
    assert_same(old, loaded)
    assert not loaded.has_draft_entropy
    with pytest.raises(EntmtpError, match="no draft"):
        loaded.draft_entropy()
    with_draft = make_profile()
    assert with_draft.has_draft_entropy
    np.testing.assert_array_equal(
        with_draft.draft_entropy(), np.concatenate([t.draft_entropy for t in with_draft.traces]))
    with pytest.raises(EntmtpError, match="draft entropies"):
        Trace(0, "x", np.zeros(3), np.zeros((3, 2)), draft_entropy=np.zeros(2))


def test_empty_profile_round_trips(tmp_path) -> None:
    empty = Profile(ProfileMeta(num_heads=4), [])
    loaded = Profile.load(empty.save(tmp_path / "empty.npz"))
    assert loaded.traces == [] and loaded.ranks().shape == (0, 4)


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_merge_equals_whole_in_any_order(num_shards: int) -> None:
    whole = make_profile(num_traces=6)
    rng = np.random.default_rng(num_shards)
    assignment = rng.integers(0, num_shards, size=6)
    shards = [
        Profile(whole.meta, [t for t, s in zip(whole.traces, assignment, strict=True) if s == k])
        for k in range(num_shards)
    ]
    for order in itertools.permutations(range(num_shards)):
        assert_same(merge_profiles([shards[k] for k in order]), whole)


def test_merge_of_saved_shards(tmp_path) -> None:
    whole = make_profile(num_traces=4)
    paths = [
        Profile(whole.meta, whole.traces[k::2]).save(tmp_path / f"shard{k}.npz") for k in range(2)
    ]
    assert_same(merge_profiles([Profile.load(p) for p in reversed(paths)]), whole)


def test_merge_rejects_duplicates_mismatches_and_nothing() -> None:
    whole = make_profile(num_traces=4)
    with pytest.raises(EntmtpError):
        merge_profiles(
            [Profile(whole.meta, whole.traces[:3]), Profile(whole.meta, whole.traces[2:])]
        )
    other = make_profile(num_traces=4, seed=1)
    with pytest.raises(EntmtpError):
        merge_profiles(
            [Profile(whole.meta, whole.traces[:2]), Profile(other.meta, other.traces[2:])]
        )
    with pytest.raises(EntmtpError):
        merge_profiles([])


def test_truncated_or_foreign_file_raises(tmp_path) -> None:
    good = make_profile().save(tmp_path / "p.npz")
    data = good.read_bytes()
    for cut in (len(data) // 3, len(data) - 10, 5):
        truncated = tmp_path / f"cut{cut}.npz"
        truncated.write_bytes(data[:cut])
        with pytest.raises(EntmtpError):
            Profile.load(truncated)
    with pytest.raises(EntmtpError):
        Profile.load(tmp_path / "missing.npz")
    foreign = tmp_path / "foreign.npz"
    header = json.dumps({"format": "something"}).encode()
    np.savez(foreign, header=np.frombuffer(header, dtype=np.uint8), offsets=np.zeros(1),
             prompt_index=np.zeros(0), prompt_length=np.zeros(0), entropy=np.zeros(0),
             ranks=np.zeros((0, 1)))
    with pytest.raises(EntmtpError):
        Profile.load(foreign)


def test_newer_format_version_rejected(tmp_path) -> None:
    path = make_profile().save(tmp_path / "p.npz")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(bytes(arrays["header"]).decode())
    header["format_version"] = 99
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(EntmtpError):
        Profile.load(path)


def test_trace_and_profile_validation() -> None:
    with pytest.raises(EntmtpError):
        Trace(0, "a", entropy=np.zeros(3), ranks=np.zeros((2, 2)))
    with pytest.raises(EntmtpError):
        Trace(0, "a", entropy=np.zeros(3), ranks=np.zeros(3))
    t2 = Trace(0, "a", entropy=np.zeros(2), ranks=np.zeros((2, 2)))
    t3 = Trace(1, "b", entropy=np.zeros(2), ranks=np.zeros((2, 3)))
    with pytest.raises(EntmtpError):
        Profile(ProfileMeta(), [t2, t3])
    with pytest.raises(EntmtpError):
        Profile(ProfileMeta(num_heads=3), [t2])


def test_subset_keeps_requested_prompts() -> None:
    whole = make_profile(num_traces=5)
    sub = whole.subset([1, 3, 99])
    assert [t.prompt_index for t in sub.traces] == [1, 3]
