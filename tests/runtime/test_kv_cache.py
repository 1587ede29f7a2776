"""Cache compaction leaves exactly the cache a plain causal forward of the kept tokens builds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.model._cache_keyword import cache_keyword
from entmtp.runtime._decode import SpeculativeDecoder
from entmtp.runtime._kv_cache import (
    cache_length,
    check_cache,
    compact_cache,
    new_cache,
    truncate_cache,
)
from entmtp.runtime._verify import forward_tokens, greedy_accept
from entmtp.treesearch._tree import Tree


def _assert_cache_equals_causal(rt, model, cache, sequence: torch.Tensor) -> None:
    reference = new_cache(model)
    with torch.inference_mode():
        forward_tokens(model, reference, sequence.unsqueeze(0))
    assert cache.get_seq_length() == len(sequence)
    for layer, ref in zip(cache.layers, reference.layers, strict=True):
        assert layer.keys.shape == ref.keys.shape
        assert torch.allclose(layer.keys, ref.keys, atol=1e-5)
        assert torch.allclose(layer.values, ref.values, atol=1e-5)


@pytest.mark.parametrize("accepted_branch", [(1,), (2, 0), (0, 1, 0), ()])
def test_compaction_after_a_step_equals_causal_cache(rt, accepted_branch):
    """Rig the draft so a chosen (possibly non-contiguous) branch is the greedy path."""
    model = rt.sharp_llama(2)
    prompt = torch.tensor([1, 9, 31, 77, 4])
    continuation = rt.greedy_reference(model, prompt, 8)
    depth = 3
    ranks = np.full((8, depth), 9, dtype=np.int64)  # inside the top-k, outside the tree
    ranks[0, : len(accepted_branch)] = accepted_branch
    heads = rt.OracleHeads(model, prompt, continuation, ranks, head_type="medusa", topk=10)
    tree = Tree.from_paths([[0], [1], [2], [0, 0], [0, 1], [2, 0], [0, 1, 0], [2, 0, 0]])
    decoder = SpeculativeDecoder(model, heads, topk=10)
    state, _ = decoder.prefill(prompt, lambda logits: int(logits.argmax()))
    assert state.pending == continuation[0]
    plan = decoder.plan(tree)
    outcome = decoder.step(state, plan, greedy_accept)
    expected_path = [tree.index(accepted_branch[:d]) if d else 0
                     for d in range(len(accepted_branch) + 1)]
    assert outcome.path == expected_path
    decoder.commit(state, outcome, outcome.path)
    kept = len(accepted_branch) + 1
    assert state.pending == continuation[kept]
    _assert_cache_equals_causal(rt, model, state.cache,
                                torch.cat([prompt, torch.tensor(continuation[:kept])]))


def test_compact_keeps_listed_entries_in_order():
    cache = _filled_cache(past=3, tree=6)
    before = cache.layers[0].keys.clone()
    compact_cache(cache, 3, [0, 2, 5])
    after = cache.layers[0].keys
    assert after.shape[-2] == 6
    assert torch.equal(after[..., :3, :], before[..., :3, :])
    assert torch.equal(after[..., 3:, :], before[..., [3, 5, 8], :])
    truncate_cache(cache, 4)
    assert cache.get_seq_length() == 4


def _filled_cache(*, past: int, tree: int):
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    generator = torch.Generator().manual_seed(0)
    for layer in range(2):
        keys = torch.randn(1, 2, past + tree, 4, generator=generator)
        cache.update(keys, keys + 1, layer)
    return cache


def test_sliding_window_cache_is_rejected(rt):
    from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

    cache = DynamicCache()
    cache.layers.append(DynamicSlidingWindowLayer(sliding_window=4))
    with pytest.raises(EntmtpError, match="sliding-window"):
        check_cache(cache)


def test_forward_tokens_passes_the_cache_under_a_pre_5_24_keyword(rt):
    """transformers before 5.24 call it ``past_key_values``; a ``cache=`` keyword would be
    swallowed by ``**kwargs`` and the forward would silently run without the past. Where the
    installed transformers is that old, its own decoder is the test; else an old signature is
    put around the new forward."""
    model = rt.make_tiny_llama(seed=3)
    decoder = model.get_decoder()
    new_forward = type(decoder).forward

    class OldSignatureDecoder(type(decoder)):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                    past_key_values=None, use_cache=None, **kwargs):
            assert "cache" not in kwargs
            return new_forward(self, input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, cache=past_key_values,
                               use_cache=use_cache)

    sequence = torch.randint(0, 128, (7,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, reference = forward_tokens(model, new_cache(model), sequence.unsqueeze(0))
        if cache_keyword(decoder) == "cache":
            decoder.__class__ = OldSignatureDecoder
        assert cache_keyword(decoder) == "past_key_values"
        cache = new_cache(model)
        forward_tokens(model, cache, sequence[:5].unsqueeze(0))
        _, logits = forward_tokens(model, cache, sequence[5:].unsqueeze(0))
    assert cache_length(cache) == 7
    torch.testing.assert_close(logits, reference[5:], rtol=1e-4, atol=1e-5)
