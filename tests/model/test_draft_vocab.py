"""Draft vocabularies: frequency choice against brute force, heads drafting over a subset of the
vocabulary against the full projection masked to it, identity and storage."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.model._draft_vocab import draft_vocab_coverage, frequent_tokens, target_token_counts
from entmtp.model._heads import MIN_DRAFT_VOCAB, draft_columns, draft_token_ids, new_heads
from entmtp.model._heads_format import save_heads
from entmtp.model._heads_load import load_heads
from entmtp.model._stats import topk_ranks
from support import make_tiny_llama


def test_target_counts_count_only_the_tokens_after_trained_positions():
    sequences = [(torch.tensor([5, 6, 7, 7, 9]), 1), (torch.tensor([1, 2, 3]), 0),
                 (torch.tensor([4, 4]), 1)]
    counts = target_token_counts(sequences, 12)
    expected = np.zeros(12, dtype=np.int64)
    for tokens, start in sequences:
        for token in tokens[start + 1:].tolist():
            expected[token] += 1
    assert counts.tolist() == expected.tolist()  # 7 twice, 9, 2, 3; not 5, 6, 1 or 4
    with pytest.raises(ValueError, match="outside"):
        target_token_counts([(torch.tensor([0, 12]), 0)], 12)


def test_frequent_tokens_are_the_most_counted_with_ties_to_the_smaller_id():
    rng = np.random.default_rng(0)
    for trial in range(50):
        counts = rng.integers(0, 6, size=int(rng.integers(1, 40)))
        size = int(rng.integers(1, len(counts) + 1))
        chosen = frequent_tokens(counts, size)
        brute = sorted(sorted(range(len(counts)), key=lambda i: (-counts[i], i))[:size])
        assert chosen.tolist() == brute, trial
        assert draft_vocab_coverage(counts, chosen) == pytest.approx(
            counts[brute].sum() / counts.sum()) if counts.sum() else True
    with pytest.raises(ValueError, match="size"):
        frequent_tokens(np.ones(4), 5)


def _noisy(head_type: str, *, shared: bool = True, seed: int = 3):
    model = make_tiny_llama(7)
    heads = new_heads(model, head_type=head_type, num_heads=3, seed=seed, shared_lm_head=shared)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    return model, heads


def _vocab(size: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    return torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))[:size]


@pytest.mark.parametrize(("head_type", "shared"),
                         [("medusa", True), ("medusa", False), ("hydra", True), ("hydra", False)])
def test_head_logits_over_a_draft_vocabulary_are_the_full_logits_at_its_tokens(head_type, shared):
    _, heads = _noisy(head_type, shared=shared)
    hidden = torch.randn(9, heads.hidden_size, generator=torch.Generator().manual_seed(1))
    full = []
    for depth in (1, 2, 3):
        prefix = torch.randint(0, heads.vocab_size, (9, depth)) if head_type == "hydra" else None
        full.append((depth, prefix, heads.head_logits(depth, hidden, prefix)))
    ids = _vocab(80, heads.vocab_size)
    heads.set_draft_vocab(ids)
    vocab = torch.sort(ids).values
    assert heads.draft_vocab.tolist() == vocab.tolist() and heads.draft_vocab_size == 80
    for depth, prefix, logits in full:
        restricted = heads.head_logits(depth, hidden, prefix)
        assert restricted.shape == (9, 80)
        torch.testing.assert_close(restricted, logits[:, vocab], rtol=1e-5, atol=1e-5)
        # the top-k over the subset is the full top-k with every other token masked out
        masked = torch.full_like(logits, float("-inf"))
        masked[:, vocab] = logits[:, vocab]
        top = draft_token_ids(heads, torch.topk(restricted, 5, dim=-1).indices)
        assert top.tolist() == torch.topk(masked, 5, dim=-1).indices.tolist()
    if head_type == "medusa":
        stacked = heads.all_head_logits(hidden)
        assert stacked.shape == (3, 9, 80)
        torch.testing.assert_close(stacked[1], full[1][2][:, vocab], rtol=1e-5, atol=1e-5)
    heads.set_draft_vocab(None)
    torch.testing.assert_close(heads.head_logits(*full[0][:1], hidden, full[0][1]), full[0][2])


def test_columns_and_token_ids_are_inverse_and_outside_tokens_have_no_column():
    _, heads = _noisy("medusa")
    tokens = torch.arange(-2, heads.vocab_size + 2)
    assert draft_columns(heads, tokens) is tokens  # no draft vocabulary: column = token id
    heads.set_draft_vocab(_vocab(70, heads.vocab_size, seed=4))
    columns = draft_columns(heads, tokens)
    inside = set(heads.draft_vocab.tolist())
    for token, column in zip(tokens.tolist(), columns.tolist(), strict=True):
        if token in inside:
            assert int(draft_token_ids(heads, torch.tensor(column))) == token
        else:
            assert column == -1
    assert sorted(columns[columns >= 0].tolist()) == list(range(70))
    # a target outside the vocabulary ranks as a miss, one inside at its rank among the subset
    logits = torch.randn(4, 70)
    targets = torch.tensor([int(heads.draft_vocab[3]), int(heads.draft_vocab[50]), 0, 1])
    ranks = topk_ranks(logits, draft_columns(heads, targets), 10)
    for row, token in enumerate(targets.tolist()):
        order = torch.argsort(logits[row], descending=True).tolist()
        column = heads.draft_vocab.tolist().index(token) if token in inside else None
        expected = order.index(column) if column is not None else -1
        assert int(ranks[row]) == (expected if expected < 10 else -1)


@pytest.mark.parametrize(("ids", "needle"), [
    (torch.arange(MIN_DRAFT_VOCAB - 1), "must hold"),
    (torch.cat([torch.arange(70), torch.tensor([3])]), "twice"),
    (torch.arange(60, 60 + MIN_DRAFT_VOCAB + 10), "must lie in"),
    (torch.arange(70).float(), "integers"),
    (torch.arange(70).reshape(7, 10), "one list"),
])
def test_bad_draft_vocabularies_are_refused(ids, needle):
    _, heads = _noisy("hydra")
    with pytest.raises(EntmtpError, match=needle):
        heads.set_draft_vocab(ids)
    assert heads.draft_vocab is None


def test_the_draft_vocabulary_is_stored_hashed_and_loaded(tmp_path):
    model, heads = _noisy("hydra")
    before = heads.sha256()
    assert "draft_vocab_size" not in heads.config_dict()  # heads without one keep their hash
    plain = save_heads(heads, tmp_path / "plain", dtype=None)
    assert load_heads(plain, model).sha256() == before
    heads.set_draft_vocab(_vocab(100, heads.vocab_size))
    assert heads.sha256() != before
    path = save_heads(heads, tmp_path / "heads")
    config = json.loads((path / "config.json").read_text())
    assert config["draft_vocab_size"] == 100 and config["storage_dtype"] == "float16"
    loaded = load_heads(path, model)
    assert loaded.draft_vocab.tolist() == heads.draft_vocab.tolist()
    assert loaded.draft_vocab.dtype == torch.int64
    assert loaded.sha256() == config["sha256"]
    other = heads.draft_vocab.clone()
    other[0] = int(torch.tensor([i for i in range(heads.vocab_size)
                                 if i not in set(other.tolist())][0]))
    heads.set_draft_vocab(other)
    assert heads.sha256() != config["sha256"]  # another subset is other heads
    # the hash follows the stored values through a cast, as for heads without a subset
    assert loaded.to(torch.bfloat16).sha256() == config["sha256"]
    assert loaded.draft_vocab.dtype == torch.int64


def test_a_half_stored_draft_vocabulary_is_refused_in_one_line(tmp_path):
    model, heads = _noisy("medusa")
    heads.set_draft_vocab(_vocab(90, heads.vocab_size))
    path = save_heads(heads, tmp_path / "heads")
    config = json.loads((path / "config.json").read_text())
    config["draft_vocab_size"] = 91
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(EntmtpError, match="draft_vocab_size 91 but it holds 90"):
        load_heads(path, model)
    del config["draft_vocab_size"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(EntmtpError, match=r"half stored \(nothing in config.json\)"):
        load_heads(path, model)
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / "heads.safetensors"))
    del state["draft_vocab"]
    save_file(state, str(path / "heads.safetensors"))
    config["draft_vocab_size"] = 90
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(EntmtpError, match=r"half stored \(nothing in heads.safetensors\)"):
        load_heads(path, model)


def test_a_latency_model_of_another_draft_vocabulary_is_named():
    from dataclasses import replace

    from entmtp.calibrate._pipeline import draft_vocab_mismatch
    from entmtp.treesearch import LatencyModel, ProfileMeta

    measured = LatencyModel.cpu_like()
    measured = replace(measured, hardware={**measured.hardware, "kind": "measured"})
    full = ProfileMeta(vocab_size=128)
    subset = ProfileMeta(vocab_size=128, extra={"draft_vocab_size": 96})

    def timed(size):
        hardware = {**measured.hardware}
        if size is not None:
            hardware["draft_vocab_size"] = size
        return replace(measured, hardware=hardware)

    assert draft_vocab_mismatch(full, timed(None), source="x") is None  # older files: all
    assert draft_vocab_mismatch(full, timed(128), source="x") is None
    assert draft_vocab_mismatch(subset, timed(96), source="x") is None
    for meta, latency, numbers in ((subset, timed(None), (128, 96)),
                                   (subset, timed(128), (128, 96)),
                                   (full, timed(96), (96, 128)), (subset, timed(64), (64, 96))):
        warning = draft_vocab_mismatch(meta, latency, source="lat.json")
        assert warning.startswith(f"lat.json timed drafting over {numbers[0]} tokens but the "
                                  f"profiled heads draft over {numbers[1]}")
        assert f"--draft-vocab-size {numbers[1]}" in warning
    synthetic = replace(measured, hardware={"kind": "synthetic"})
    assert draft_vocab_mismatch(subset, synthetic, source="x") is None


def test_profiles_record_the_draft_vocabulary_of_their_heads():
    from entmtp.evaluation._trajectory_profile import profile_meta

    class Base:
        name, vocab_size, hidden_size, source = "tiny", 128, 32, "test"
        model = make_tiny_llama(1)

    _, heads = _noisy("medusa")
    assert "draft_vocab_size" not in profile_meta(Base(), heads, task="t", topk=5, split="s",
                                                  max_new_tokens=4).extra
    heads.set_draft_vocab(_vocab(100, heads.vocab_size))
    meta = profile_meta(Base(), heads, task="t", topk=5, split="s", max_new_tokens=4)
    assert meta.extra["draft_vocab_size"] == 100 and meta.heads_sha256 == heads.sha256()
