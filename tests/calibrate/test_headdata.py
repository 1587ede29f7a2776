"""Head-training data on disk: round trip, resume after a killed shard, refusal of another
model's data, batched generation against plain greedy, and cached data training the same heads
as in-memory data."""

from __future__ import annotations

import json

import pytest
import torch

from entmtp.calibrate._headdata import (
    INDEX_NAME,
    DataItem,
    HeadData,
    Record,
    cached_trajectories,
    make_records,
    read_head_data,
    record_trajectories,
    shard_problem,
    trajectories_from_shard,
    write_head_data,
)
from entmtp.calibrate._train import fit_heads
from entmtp.core import EntmtpError
from entmtp.model._heads import new_heads
from support import make_tiny_llama, make_varied_tiny_llama

VOCAB = 128


@pytest.fixture(scope="module")
def base():
    return make_varied_tiny_llama(seed=3)


def items(count: int, seed: int) -> list[DataItem]:
    """Mixed self-distilled and teacher-forced items from three sources."""
    generator = torch.Generator().manual_seed(seed)
    result = []
    for index in range(count):
        length = int(torch.randint(2, 9, (1,), generator=generator))
        prompt = torch.randint(3, VOCAB, (length,), generator=generator).tolist()
        answer = None
        if index % 3 == 2:
            answer = torch.randint(3, VOCAB, (int(length) + 2,), generator=generator).tolist()
        result.append(DataItem(("math", "chat", "code")[index % 3], prompt, answer))
    return result


@torch.inference_mode()
def plain_greedy(model, prompt: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    """Reference: one full forward without cache per token, batch of one."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        if token in eos:
            break
    return ids


def test_batched_records_equal_plain_greedy_token_for_token(base):
    given = items(9, seed=1)
    batched = make_records(base, given, max_new_tokens=7, generation_batch_size=4)
    single = make_records(base, given, max_new_tokens=7, generation_batch_size=1)
    assert len(batched) == len(given)
    for item, record, alone in zip(given, batched, single, strict=True):
        assert torch.equal(record.tokens, alone.tokens)
        assert record.start == len(item.prompt_ids) - 1 and record.source == item.source
        if item.answer_ids is None:
            assert record.tokens.tolist() == plain_greedy(base, item.prompt_ids, 7, {2})
        else:
            assert record.tokens.tolist() == item.prompt_ids + item.answer_ids


def test_data_round_trip_is_exact(base, tmp_path):
    given = items(11, seed=2)
    index = write_head_data(base, tmp_path / "d", given, max_new_tokens=6,
                            generation_batch_size=4, shard_size=4)
    expected = make_records(base, given, max_new_tokens=6, generation_batch_size=4)
    data = read_head_data(tmp_path / "d", base)
    assert index["complete"] and index["num_shards"] == 3 and len(index["shards"]) == 3
    assert len(data.records) == len(expected)
    for got, want in zip(data.records, expected, strict=True):
        assert torch.equal(got.tokens, want.tokens)
        assert (got.start, got.source) == (want.start, want.source)
    assert sum(s["records"] for s in index["shards"]) == len(given)
    assert sum(s["tokens"] for s in index["shards"]) == sum(len(r.tokens) for r in expected)
    by_source: dict[str, int] = {}
    for record in expected:
        by_source[record.source] = by_source.get(record.source, 0) + record.trained_positions
    totals: dict[str, int] = {}
    for shard in index["shards"]:
        for source, count in shard["positions_by_source"].items():
            totals[source] = totals.get(source, 0) + count
    assert totals == by_source and index["sources"] == ["chat", "code", "math"]
    stored = json.loads((tmp_path / "d" / INDEX_NAME).read_text())
    assert stored == index


def test_resume_after_a_killed_shard(base, tmp_path, monkeypatch):
    from entmtp.calibrate import _headdata

    given = items(10, seed=4)
    folder = tmp_path / "d"
    calls = []
    real = _headdata.make_records

    def dies_on_third_shard(*args, **kwargs):
        calls.append(len(args[1]))
        if len(calls) == 3:
            # a partial shard left behind by the killed run, and no index entry for it
            (folder / "shard-00002.safetensors").write_bytes(b"partial")
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(_headdata, "make_records", dies_on_third_shard)
    with pytest.raises(KeyboardInterrupt):
        write_head_data(base, folder, given, max_new_tokens=5, shard_size=3)
    with pytest.raises(EntmtpError, match="unfinished"):
        read_head_data(folder, base)
    partial = read_head_data(folder, base, allow_unfinished=True)
    assert len(partial.records) == 6 and not partial.index["complete"]
    calls.clear()
    monkeypatch.setattr(_headdata, "make_records", real)
    counted = []
    monkeypatch.setattr(_headdata, "make_records",
                        lambda *a, **k: counted.append(len(a[1])) or real(*a, **k))
    write_head_data(base, folder, given, max_new_tokens=5, shard_size=3)
    assert counted == [3, 1]  # shards 2 and 3 only
    monkeypatch.setattr(_headdata, "make_records", real)
    write_head_data(base, tmp_path / "whole", given, max_new_tokens=5, shard_size=3)
    resumed = read_head_data(folder, base).records
    whole = read_head_data(tmp_path / "whole", base).records
    assert [r.tokens.tolist() for r in resumed] == [r.tokens.tolist() for r in whole]
    with pytest.raises(EntmtpError, match="other prompts or settings"):
        write_head_data(base, folder, given, max_new_tokens=6, shard_size=3)


def test_resuming_in_another_dtype_is_refused(base, tmp_path):
    given = items(6, seed=6)
    folder = tmp_path / "d"
    write_head_data(base, folder, given[:3], max_new_tokens=4, shard_size=3)
    index = json.loads((folder / INDEX_NAME).read_text())
    assert index["dtype"] == "float32"
    index["complete"], index["num_shards"] = False, 2  # as a run killed after shard 1
    (folder / INDEX_NAME).write_text(json.dumps(index))
    before = (folder / INDEX_NAME).read_bytes()
    in_bf16 = make_varied_tiny_llama(seed=3).to(torch.bfloat16)
    with pytest.raises(EntmtpError, match="generated in float32, not bfloat16.*--dtype float32"):
        write_head_data(in_bf16, folder, given[:3], max_new_tokens=4, shard_size=3)
    assert (folder / INDEX_NAME).read_bytes() == before
    # the same dtype resumes
    write_head_data(base, folder, given[:3], max_new_tokens=4, shard_size=3)


def test_another_models_data_is_refused(base, tmp_path):
    write_head_data(base, tmp_path / "d", items(4, seed=5), max_new_tokens=3)
    same_shape = make_tiny_llama(seed=11)  # same architecture, other weights
    wider = make_tiny_llama(seed=3, hidden_size=48)
    for other in (same_shape, wider):
        with pytest.raises(EntmtpError, match="made for model"):
            read_head_data(tmp_path / "d", other)
    # the same model in another dtype is the same model
    read_head_data(tmp_path / "d", make_varied_tiny_llama(seed=3).to(torch.bfloat16))


def test_not_a_data_folder_is_one_clear_error(tmp_path):
    with pytest.raises(EntmtpError, match="no head-data folder"):
        read_head_data(tmp_path)
    (tmp_path / INDEX_NAME).write_text('{"format": "other"}')
    with pytest.raises(EntmtpError, match="not an entmtp head-data index"):
        read_head_data(tmp_path)


def _shard(**changes):
    """A good shard's arrays (two records of 3 and 2 tokens), with ``changes``."""
    arrays = {"tokens": torch.tensor([5, 6, 7, 8, 9], dtype=torch.int32),
              "lengths": torch.tensor([3, 2], dtype=torch.int32),
              "starts": torch.tensor([1, 1], dtype=torch.int32),
              "source_ids": torch.tensor([0, 1], dtype=torch.int32)}
    return {**arrays, **changes}


@pytest.mark.parametrize(("changes", "problem"), [
    ({}, None),
    ({"tokens": torch.tensor([5, 6, 7, 8, VOCAB], dtype=torch.int32)}, "outside the model's"),
    ({"tokens": torch.tensor([5, -7, 7, 8, 9], dtype=torch.int32)}, "outside the model's"),
    ({"tokens": torch.tensor([5.0, 6, 7, 8, 9])}, "tokens is not a 1-D integer array"),
    ({"starts": torch.tensor([[1, 1]], dtype=torch.int32)}, "starts is not a 1-D integer"),
    ({"source_ids": torch.tensor([0, 2], dtype=torch.int32)}, "source ids outside the 2"),
    ({"source_ids": torch.tensor([0, -1], dtype=torch.int32)}, "source ids outside"),
    ({"starts": torch.tensor([1, 2], dtype=torch.int32)}, "start is not one of its positions"),
    ({"starts": torch.tensor([-1, 0], dtype=torch.int32)}, "start is not one of its positions"),
    ({"lengths": torch.tensor([5, 0], dtype=torch.int32)}, "a record has no token"),
    ({"lengths": torch.tensor([3, 3], dtype=torch.int32)}, "add up to 6, not the 5"),
    ({"source_ids": torch.tensor([0], dtype=torch.int32)}, "differ in length"),
])
def test_shard_problems_are_named(changes, problem):
    found = shard_problem(**_shard(**changes), vocab_size=VOCAB, num_sources=2)
    assert found == problem if problem is None else problem in found


def test_a_damaged_shard_is_one_clear_error(base, tmp_path):
    from safetensors.torch import load_file, save_file

    write_head_data(base, tmp_path / "d", items(4, seed=5), max_new_tokens=3)
    shard = tmp_path / "d" / "shard-00000.safetensors"
    arrays = load_file(shard)
    arrays["source_ids"][0] = 9
    save_file(arrays, shard)
    with pytest.raises(EntmtpError, match=r"is damaged \(source ids outside the 3 sources.*make "
                                          r"the data again"):
        read_head_data(tmp_path / "d", base)


def test_record_trajectories_are_the_trained_positions(base):
    given = items(5, seed=6)
    records = make_records(base, given, max_new_tokens=4, generation_batch_size=2)
    trajectories = record_trajectories(base, records, batch_size=2)
    for record, trajectory in zip(records, trajectories, strict=True):
        assert torch.equal(trajectory.tokens, record.tokens[record.start + 1:])
        with torch.inference_mode():
            hidden = base.base_model(input_ids=record.tokens[None]).last_hidden_state[0]
        torch.testing.assert_close(trajectory.hidden, hidden[record.start:-1],
                                   atol=1e-5, rtol=1e-5)
        assert trajectory.source == record.source


def test_whole_record_trajectories_hold_the_prompt_then_the_trained_positions(base):
    records = make_records(base, items(5, seed=6), max_new_tokens=4, generation_batch_size=2)
    trained = record_trajectories(base, records, batch_size=2)
    whole = record_trajectories(base, records, batch_size=3, whole=True)
    for record, part, full in zip(records, trained, whole, strict=True):
        assert torch.equal(full.tokens, record.tokens[1:])
        assert torch.equal(full.tokens[record.start:], part.tokens)
        torch.testing.assert_close(full.hidden[record.start:], part.hidden, atol=1e-5, rtol=1e-5)
        assert full.hidden.shape[0] == len(record.tokens) - 1


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_cached_data_trains_the_same_heads_as_in_memory_data(base, tmp_path, head_type):
    given = items(12, seed=7)
    write_head_data(base, tmp_path / "d", given, max_new_tokens=6, shard_size=5)
    from_disk = record_trajectories(base, read_head_data(tmp_path / "d", base).records)
    in_memory = record_trajectories(
        base, make_records(base, given, max_new_tokens=6, generation_batch_size=64))
    trained = []
    for trajectories in (from_disk, in_memory):
        heads = new_heads(base, head_type=head_type, num_heads=2, seed=1)
        fit_heads(heads, trajectories, epochs=2, batch_size=8, seed=0, softmax_vocab="full")
        trained.append(heads.state_dict())
    for name, tensor in trained[0].items():
        assert torch.equal(tensor, trained[1][name]), name


def test_hidden_cache_of_the_first_shards_is_extended_by_the_new_shards_only(
        base, tmp_path, monkeypatch):
    from entmtp.calibrate import _headdata

    write_head_data(base, tmp_path / "d", items(10, seed=8), max_new_tokens=5, shard_size=3)
    whole = read_head_data(tmp_path / "d", base)
    first_two = whole.index["shards"][:2]
    early = HeadData(index={**whole.index, "shards": first_two, "complete": False},
                     records=whole.records[:sum(entry["records"] for entry in first_two)])
    cache = tmp_path / "hidden.safetensors"
    assert len(cached_trajectories(base, early, cache)) == 6
    forwarded = []
    real = _headdata.record_trajectories
    monkeypatch.setattr(_headdata, "record_trajectories",
                        lambda b, records, **k: forwarded.append(records) or real(b, records, **k))
    extended = cached_trajectories(base, whole, cache)
    assert forwarded == [whole.records[6:]]  # the two new shards' records, nothing else
    fresh = real(base, whole.records)
    assert len(extended) == len(fresh) == 10
    for got, want in zip(extended, fresh, strict=True):
        assert torch.equal(got.tokens, want.tokens) and got.source == want.source
        torch.testing.assert_close(got.hidden, want.hidden, atol=1e-5, rtol=1e-5)
    forwarded.clear()
    again = cached_trajectories(base, whole, cache)  # now the whole data's cache: read as is
    assert forwarded == [] and all(torch.equal(a.hidden, b.hidden)
                                   for a, b in zip(again, extended, strict=True))
    with pytest.raises(EntmtpError, match="other head data, shards"):
        cached_trajectories(base, early, cache)  # a cache of more shards than the data has
    skipped = HeadData(index={**whole.index, "shards": whole.index["shards"][1:]},
                       records=whole.records[3:])
    with pytest.raises(EntmtpError, match="other head data, shards"):
        cached_trajectories(base, skipped, cache)  # its shards are no continuation of the cache's


def test_trajectories_from_shard_are_those_of_the_later_shards_records(base, tmp_path):
    """Against a plain reference: the forward of the records of shards N.. alone. A record
    with no trained position (it has no trajectory) sits in the skipped shards."""
    write_head_data(base, tmp_path / "d", items(10, seed=9), max_new_tokens=5, shard_size=3)
    data = read_head_data(tmp_path / "d", base)
    empty = Record(data.records[0].tokens[:2].clone(), 1, "math")
    assert empty.trained_positions == 0
    shards = [{**entry} for entry in data.index["shards"]]
    shards[0]["records"] += 1
    data = HeadData(index={**data.index, "shards": shards}, records=[empty, *data.records])
    every = record_trajectories(base, data.records)
    assert len(every) == 10
    for first in range(len(shards)):
        skipped = sum(entry["records"] for entry in shards[:first])
        want = record_trajectories(base, data.records[skipped:])
        got = trajectories_from_shard(data, every, first)
        assert len(got) == len(want) == 10 - 3 * first
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.tokens, b.tokens) and a.source == b.source
            torch.testing.assert_close(a.hidden, b.hidden, atol=1e-5, rtol=1e-5)
    for first in (-1, len(shards)):
        with pytest.raises(EntmtpError, match=f"--from-shard {first}: the data has 4 finished"):
            trajectories_from_shard(data, every, first)
