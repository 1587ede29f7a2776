"""The profiler against a plain per-position reference; batching, sharding and resume."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from entmtp.calibrate import _profiler
from entmtp.calibrate._profiler import profile_prompts, resolve_shard, shard_prompts
from entmtp.calibrate._tasks import TaskPrompt
from entmtp.core import EntmtpError
from entmtp.model._base_model import BaseModel
from entmtp.model._greedy import greedy_generate
from entmtp.treesearch._profile import Profile, merge_profiles
from support import make_tiny_llama

VOCAB, HIDDEN = 128, 32


class StandInHeads(torch.nn.Module):
    """Random heads with exactly the DraftHeads interface (until model/_heads.py lands).

    Hydra mixes an embedding of the prefix (order-dependent) into the hidden state.
    """

    def __init__(self, head_type: str, num_heads: int, *, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.head_type, self.num_heads = head_type, num_heads
        self.hidden_size, self.vocab_size = HIDDEN, VOCAB
        self.heads = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, VOCAB) for _ in range(num_heads))
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)

    def head_logits(self, depth, hidden, prefix_tokens):
        x = hidden
        if self.head_type == "hydra":
            assert prefix_tokens.shape == (hidden.shape[0], depth)
            weights = torch.arange(1, depth + 1, dtype=hidden.dtype)[None, :, None]
            x = x + (self.embed(prefix_tokens) * weights).sum(1)
        return self.heads[depth - 1](x) * 4

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for value in self.state_dict().values():
            digest.update(value.numpy().tobytes())
        return digest.hexdigest()


class CharTokenizer:
    """Just what BaseModel needs from a tokenizer for a base (non-chat) model."""

    chat_template = None
    pad_token_id, eos_token_id = 0, 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [3 + ord(c) % (VOCAB - 3) for c in text]}


def tiny_base(seed: int = 0) -> BaseModel:
    model = make_tiny_llama(seed)
    # With tied embeddings a random tiny model just echoes its last token; an untied random
    # lm_head gives varied trajectories, so that position and prefix mistakes show.
    model.config.tie_word_embeddings = False
    weight = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(seed)) * 0.5
    model.lm_head.weight = torch.nn.Parameter(weight)
    return BaseModel(model, CharTokenizer(), name="tiny", source="test", is_instruct=False)


PROMPTS = [
    TaskPrompt(i, f"p{i}", text)
    for i, text in enumerate(
        ["hello", "a much longer prompt about things", "x", "def f(a, b):", "tell me", "ok go"]
    )
]


def reference_trace(base: BaseModel, heads, ids: list[int], *, max_new_tokens, topk):
    """Unbatched, uncached, one full forward per prefix; ranks by counting larger logits."""
    model, eos = base.model, base.eos_token_ids
    generated: list[int] = []
    with torch.no_grad():
        while len(generated) < max_new_tokens:
            token = int(model(torch.tensor([ids + generated])).logits[0, -1].argmax())
            generated.append(token)
            if token in eos:
                break
        entropies, rank_rows, draft_entropies = [], [], []
        for i in range(len(generated)):
            prefix = torch.tensor([ids + generated[:i]])
            logits = model(prefix).logits[0, -1]
            hidden = model.model(prefix).last_hidden_state[:, -1]  # [1, hidden]
            assert torch.allclose(model.lm_head(hidden)[0], logits, atol=1e-5)
            p = torch.softmax(logits.double(), -1)
            entropies.append(float(-(p * p.log()).sum()))
            row = []
            for depth in range(1, heads.num_heads + 1):
                if i + depth >= len(generated):
                    row.append(-1)
                    continue
                prefix_tokens = torch.tensor([generated[i : i + depth]])
                head = heads.head_logits(depth, hidden, prefix_tokens)[0]
                above = int((head > head[generated[i + depth]]).sum())
                row.append(above if above < topk else -1)
            rank_rows.append(row)
            first = heads.head_logits(1, hidden, torch.tensor([generated[i : i + 1]]))[0]
            q = torch.softmax(first.double(), -1)
            draft_entropies.append(float(-(q * q.log()).sum()))
    ranks = np.array(rank_rows, dtype=np.int16).reshape(-1, heads.num_heads)
    return generated, np.array(entropies), ranks, np.array(draft_entropies)


@pytest.mark.parametrize(("head_type", "topk"), [("medusa", 40), ("hydra", 40), ("medusa", 3)])
def test_profile_matches_per_position_reference(head_type, topk):
    base, heads = tiny_base(), StandInHeads(head_type, 3)
    # make EOS a token the model actually emits, so some trajectories stop early
    probe = greedy_generate(base.model, [base.encode_prompt(PROMPTS[1].text)],
                            max_new_tokens=6)[0].tokens
    base.tokenizer.eos_token_id = probe[3]
    base.model.config.eos_token_id = probe[3]
    profile = profile_prompts(base, heads, PROMPTS, max_new_tokens=9, topk=topk, batch_size=4)
    assert [t.prompt_index for t in profile.traces] == list(range(len(PROMPTS)))
    lengths = set()
    for prompt, trace in zip(PROMPTS, profile.traces, strict=True):
        ids = base.encode_prompt(prompt.text)
        generated, entropy, ranks, draft = reference_trace(base, heads, ids, max_new_tokens=9,
                                                           topk=topk)
        lengths.add(len(generated))
        assert trace.prompt_id == prompt.prompt_id and trace.prompt_length == len(ids)
        np.testing.assert_allclose(trace.entropy, entropy, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(trace.ranks, ranks)
        np.testing.assert_allclose(trace.draft_entropy, draft, rtol=1e-5, atol=1e-5)
    assert len(lengths) > 1  # EOS cut some trajectories short
    assert profile.meta.head_type == head_type and profile.meta.topk == topk
    assert profile.meta.heads_sha256 == heads.sha256() and profile.meta.max_new_tokens == 9
    if topk == 40:
        assert (profile.ranks() >= 0).any()


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_profile_with_the_real_draft_heads(head_type):
    from entmtp.model._heads import new_heads

    base = tiny_base(1)
    heads = new_heads(base.model, head_type=head_type, num_heads=2, shared_lm_head=False, seed=3)
    profile = profile_prompts(base, heads, PROMPTS[:3], max_new_tokens=6, topk=30)
    for prompt, trace in zip(PROMPTS, profile.traces, strict=False):
        ids = base.encode_prompt(prompt.text)
        _, entropy, ranks, draft = reference_trace(base, heads, ids, max_new_tokens=6, topk=30)
        np.testing.assert_allclose(trace.entropy, entropy, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(trace.ranks, ranks)
        np.testing.assert_allclose(trace.draft_entropy, draft, rtol=1e-5, atol=1e-5)


def test_shards_merge_to_the_single_process_profile(tmp_path):
    base, heads = tiny_base(), StandInHeads("hydra", 2)
    single = profile_prompts(base, heads, PROMPTS, max_new_tokens=5, topk=20, batch_size=3)
    shards = [
        profile_prompts(base, heads, shard_prompts(PROMPTS, 3, index), max_new_tokens=5,
                        topk=20, batch_size=2)
        for index in range(3)
    ]
    for index, shard in enumerate(shards):  # through disk, as separate processes would
        shard.save(tmp_path / f"shard{index}.npz")
    merged = merge_profiles([Profile.load(tmp_path / f"shard{i}.npz") for i in range(3)])
    assert merged.meta == single.meta
    assert [t.prompt_index for t in merged.traces] == [t.prompt_index for t in single.traces]
    for a, b in zip(merged.traces, single.traces, strict=True):
        assert a.prompt_id == b.prompt_id and a.prompt_length == b.prompt_length
        np.testing.assert_array_equal(a.entropy, b.entropy)
        np.testing.assert_array_equal(a.ranks, b.ranks)


def test_resume_skips_stored_prompts_and_gives_the_same_profile(tmp_path, monkeypatch):
    base, heads = tiny_base(), StandInHeads("medusa", 2)
    full = profile_prompts(base, heads, PROMPTS, max_new_tokens=5, shard_dir=tmp_path)
    stored = sorted(tmp_path.glob("prompt-*.npz"))
    assert len(stored) == len(PROMPTS)
    for path in stored[1::2]:  # the "interrupted" run only finished every other prompt
        path.unlink()
    (tmp_path / ".prompt-0000001.npz.tmp").write_bytes(b"half written")  # ignored

    seen: list[list[int]] = []
    real = _profiler.greedy_generate

    def counting(model, prompt_ids, **kwargs):
        seen.extend(list(ids) for ids in prompt_ids)
        return real(model, prompt_ids, **kwargs)

    monkeypatch.setattr(_profiler, "greedy_generate", counting)
    done = []
    resumed = profile_prompts(base, heads, PROMPTS, max_new_tokens=5, shard_dir=tmp_path,
                              progress=lambda tokens, prompts: done.append(prompts))
    expected = sorted(base.encode_prompt(p.text) for p in PROMPTS[1::2])
    assert sorted(seen) == expected
    assert done[0] == 3 and done[-1] == len(PROMPTS)
    for a, b in zip(resumed.traces, full.traces, strict=True):
        assert (a.prompt_index, a.prompt_id, a.prompt_length) == (
            b.prompt_index, b.prompt_id, b.prompt_length)
        np.testing.assert_array_equal(a.entropy, b.entropy)
        np.testing.assert_array_equal(a.ranks, b.ranks)
    # other settings (top-k) never reuse the stored traces
    seen.clear()
    profile_prompts(base, heads, PROMPTS[:2], max_new_tokens=5, topk=4, shard_dir=tmp_path)
    assert len(seen) == 2


def test_rich_progress_is_fed():
    from rich.progress import Progress

    base, heads = tiny_base(), StandInHeads("medusa", 1)
    with Progress(disable=True) as bar:
        profile_prompts(base, heads, PROMPTS[:3], max_new_tokens=3, progress=bar)
        (task,) = bar.tasks
        assert task.completed == 3 and "tokens/s" in task.description


def test_shard_helpers(monkeypatch):
    items = list(range(10))
    parts = [shard_prompts(items, 3, i) for i in range(3)]
    assert sorted(x for part in parts for x in part) == items
    assert shard_prompts(items, 3, 1) == shard_prompts(items, 3, 1)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert resolve_shard() == (1, 0)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    assert resolve_shard() == (4, 2)
    assert resolve_shard(2, 1) == (2, 1)
    with pytest.raises(EntmtpError):
        resolve_shard(2, None)
    with pytest.raises(EntmtpError):
        resolve_shard(2, 2)
    with pytest.raises(EntmtpError):
        shard_prompts(items, 0, 0)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(EntmtpError):
        resolve_shard()


def test_mismatched_heads_and_bad_options_raise():
    base = tiny_base()
    wrong = StandInHeads("medusa", 2)
    wrong.vocab_size = 99
    with pytest.raises(EntmtpError, match="vocab"):
        profile_prompts(base, wrong, PROMPTS)
    with pytest.raises(EntmtpError):
        profile_prompts(base, StandInHeads("medusa", 2), PROMPTS, max_new_tokens=0)
    with pytest.raises(EntmtpError, match="twice"):
        profile_prompts(base, StandInHeads("medusa", 2), [PROMPTS[0], PROMPTS[0]])


@pytest.mark.parametrize("damage", ["entropy-nan", "rank-past-topk", "ranks-short"])
def test_a_stored_trace_with_impossible_values_is_profiled_again(tmp_path, damage):
    """A trace that would make every later profile unloadable is redone, not reused."""
    base, heads = tiny_base(), StandInHeads("medusa", 2)
    full = profile_prompts(base, heads, PROMPTS[:2], max_new_tokens=5, shard_dir=tmp_path)
    path = sorted(tmp_path.glob("prompt-*.npz"))[0]
    arrays = dict(np.load(path))
    if damage == "entropy-nan":
        arrays["entropy"] = arrays["entropy"].copy()
        arrays["entropy"][0] = np.nan
    elif damage == "rank-past-topk":
        arrays["ranks"] = arrays["ranks"].copy()
        arrays["ranks"][0, 0] = 99
    else:
        arrays["ranks"] = arrays["ranks"][:-1]
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    again = profile_prompts(base, heads, PROMPTS[:2], max_new_tokens=5, shard_dir=tmp_path)
    for a, b in zip(again.traces, full.traces, strict=True):
        np.testing.assert_array_equal(a.entropy, b.entropy)
        np.testing.assert_array_equal(a.ranks, b.ranks)
