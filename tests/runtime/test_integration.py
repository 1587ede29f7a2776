"""The real default model (SmolLM2-135M-Instruct): tree decoding is lossless there too."""

from __future__ import annotations

import pytest
import torch

from entmtp.model._base_model import load_base_model
from entmtp.model._heads import new_heads
from entmtp.runtime._decode import SpeculativeDecoder
from entmtp.runtime._scheduler import StaticScheduler
from entmtp.treesearch._tree import Tree


@pytest.mark.integration
def test_default_model_tree_decoding_equals_generate():
    base = load_base_model()
    model = base.model
    prompt = base.encode_prompt("Name three colours.")
    heads = new_heads(model, head_type="hydra", num_heads=3, seed=0)
    tree = Tree.from_paths([[0], [1], [2], [0, 0], [1, 0], [0, 0, 0]])
    result = SpeculativeDecoder(model, heads, topk=10, probe=True).generate(
        prompt, StaticScheduler(tree), max_new_tokens=10, eos_token_ids=base.eos_token_ids
    )
    ids = torch.tensor([prompt])
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                              do_sample=False, eos_token_id=sorted(base.eos_token_ids),
                              pad_token_id=sorted(base.eos_token_ids)[0])
    assert result.tokens == expected[0, len(prompt):].tolist()
    assert result.steps >= 1 and all(a >= 1 for a in result.accept_lengths)
