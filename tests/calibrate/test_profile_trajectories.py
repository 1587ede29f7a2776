"""Profiling given trajectories (live validation's replay input) is the profiler's own assembly:
on the greedy trajectories it gives exactly the profile ``profile_prompts`` makes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entmtp.calibrate._profiler import profile_prompts
from entmtp.calibrate._tasks import TaskPrompt
from entmtp.evaluation._trajectory_profile import profile_trajectories
from entmtp.model._base_model import BaseModel
from entmtp.model._greedy import greedy_generate
from entmtp.model._heads import new_heads
from support import make_char_tokenizer, make_tiny_llama

TEXTS = ["hello", "a much longer prompt about things", "x", "def f(a, b):", "ok go"]


def tiny_base() -> BaseModel:
    model = make_tiny_llama(0)
    # an untied random lm_head: varied trajectories and entropies
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(
        torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(5)))
    tokenizer = make_char_tokenizer(model.config.vocab_size)
    return BaseModel(model, tokenizer, name="tiny", source="test", is_instruct=False)


@pytest.mark.parametrize(("head_type", "batch_size"), [("medusa", 2), ("hydra", 8)])
def test_profile_of_the_greedy_trajectories_is_the_profilers_profile(head_type, batch_size):
    base = tiny_base()
    heads = new_heads(base.model, head_type=head_type, num_heads=3, seed=1)
    prompts = [TaskPrompt(i, f"p{i}", text) for i, text in enumerate(TEXTS)]
    expected = profile_prompts(base, heads, prompts, max_new_tokens=10, topk=7, batch_size=3,
                               task="code", split="all")
    encoded = [(p, base.encode_task_prompt(p)) for p in prompts]
    trajectories = [greedy_generate(base.model, [ids], max_new_tokens=10,
                                    eos_token_ids=base.eos_token_ids)[0].tokens
                    for _, ids in encoded]
    got = profile_trajectories(base, heads, encoded, trajectories, topk=7,
                               batch_size=batch_size, task="code", split="all")
    assert len(got.traces) == len(expected.traces) == len(TEXTS)
    for mine, theirs in zip(got.traces, expected.traces, strict=True):
        assert (mine.prompt_index, mine.prompt_id, mine.prompt_length) == (
            theirs.prompt_index, theirs.prompt_id, theirs.prompt_length)
        np.testing.assert_array_equal(mine.ranks, theirs.ranks)
        np.testing.assert_allclose(mine.entropy, theirs.entropy, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mine.draft_entropy, theirs.draft_entropy, rtol=1e-5,
                                   atol=1e-6)
    assert (got.ranks() >= 0).any()  # the heads ranked some true tokens
    # the same record of how it was made, but for the budget: the longest trajectory
    assert got.meta.max_new_tokens == max(len(t) for t in trajectories)
    for field in ("model", "vocab_size", "hidden_size", "head_type", "num_heads",
                  "heads_sha256", "task", "topk", "split", "extra"):
        assert getattr(got.meta, field) == getattr(expected.meta, field), field
