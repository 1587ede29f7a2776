"""Tree plans and the tree-attention forward against plain causal decoding of each branch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.model._support import check_tree_attention_support
from entmtp.runtime._kv_cache import new_cache
from entmtp.runtime._tree_attention import tree_plan
from entmtp.runtime._verify import forward_tokens, probe_tree_attention, tree_forward
from entmtp.treesearch._tree import Tree

REPO = Path(__file__).resolve().parents[2]


def default_tree() -> Tree:
    return Tree.from_json(json.loads((REPO / "trees" / "mc_sim_7b_63.json").read_text()))


def test_plan_matches_tree_buffers_and_brute_force(rt):
    rng = np.random.default_rng(0)
    for tree in [default_tree(), Tree.from_paths([]), *(
        rt.random_tree(rng, int(rng.integers(1, 30)), depth=4, topk=6) for _ in range(20)
    )]:
        plan = tree_plan(tree, 10)
        buffers = tree.buffers(10)
        assert plan.size == tree.num_nodes + 1
        assert torch.equal(plan.tree_mask, torch.as_tensor(buffers.attention_mask))
        assert plan.depths.tolist() == buffers.depths.tolist()
        assert plan.tree_indices.tolist() == buffers.tree_indices.tolist()
        paths = [()] + list(tree.paths)
        for node, path in enumerate(paths):
            # ancestors: the node index of every prefix of the path
            expected = [tree.index(path[:d]) if d else 0 for d in range(len(path) + 1)]
            assert plan.ancestors[node, : len(path) + 1].tolist() == expected
            children = [i for i, p in enumerate(paths) if len(p) == len(path) + 1
                        and p[:-1] == path]
            children.sort(key=lambda i: paths[i][-1])
            row = [c for c in plan.children[node].tolist() if c >= 0]
            assert row == children
        for depth in range(1, tree.depth + 1):
            nodes = plan.level_nodes[depth].tolist()
            assert nodes == [i for i, p in enumerate(paths) if len(p) == depth]
            parents = plan.expand_nodes[depth - 1][plan.parent_slot[depth - 1]].tolist()
            assert parents == [tree.index(paths[i][:-1]) if depth > 1 else 0 for i in nodes]
        # node (head, rank) gather equals Medusa's flat candidate indexing
        flat_index = 1 + plan.node_head * 10 + plan.node_rank
        assert flat_index.tolist() == plan.tree_indices[1:].tolist()


def test_plan_is_cached_per_tree_and_checks_topk():
    tree = Tree.from_paths([[0], [3], [0, 1]])
    assert tree_plan(tree, 4) is tree_plan(tree, 4)
    assert tree_plan(tree, [4, 2]).topk == (4, 2)
    with pytest.raises(EntmtpError):
        tree_plan(tree, 3)
    with pytest.raises(EntmtpError):
        tree_plan(tree, [4, 1])


def test_attention_mask_allows_past_and_tree_ancestors():
    tree = Tree.from_paths([[0], [1], [0, 0]])
    plan = tree_plan(tree, 2)
    mask = plan.attention_mask(5, torch.float32)
    assert mask.shape == (1, 1, 4, 9)
    allowed = mask[0, 0] == 0
    assert allowed[:, :5].all()
    assert torch.equal(allowed[:, 5:], plan.tree_mask)
    assert (mask[0, 0][~allowed] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_logits_equal_causal_decoding_of_every_branch(rt, attn):
    model = rt.sharp_llama(1, attn=attn)
    rng = np.random.default_rng(1)
    prompt = torch.tensor([1, 17, 42, 99, 5, 64])
    trees = [default_tree(), rt.random_tree(rng, 25, depth=5, topk=4)]
    for tree in trees:
        plan = tree_plan(tree, 10)
        tokens = torch.as_tensor(rng.integers(3, 128, size=plan.size), dtype=torch.int64)
        cache = new_cache(model)
        with torch.inference_mode():
            forward_tokens(model, cache, prompt.unsqueeze(0))
            hidden, logits = tree_forward(model, cache, plan, tokens, len(prompt),
                                          dtype=torch.float32)
        assert cache.get_seq_length() == len(prompt) + plan.size
        paths = [()] + list(tree.paths)
        for node, path in enumerate(paths):
            branch = [tree.index(path[:d]) if d else 0 for d in range(len(path) + 1)]
            sequence = torch.cat([prompt, tokens[branch]])
            ref_hidden, ref_logits = rt.causal_forward(model, sequence)
            assert torch.allclose(logits[node], ref_logits[-1], atol=1e-5), (attn, node)
            assert torch.allclose(hidden[node], ref_hidden[-1], atol=1e-5)


def test_probe_accepts_llama_in_both_kernels(rt):
    for attn in ("sdpa", "eager"):
        assert probe_tree_attention(rt.sharp_llama(0, attn=attn)) < 1e-4


def test_unsupported_models_get_a_clear_error(rt):
    model = rt.sharp_llama(0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(EntmtpError, match="attn_implementation"):
        check_tree_attention_support(model)
    model = rt.sharp_llama(0)
    model.config.sliding_window = 16
    with pytest.raises(EntmtpError, match="sliding-window"):
        check_tree_attention_support(model)
    with pytest.raises(EntmtpError, match="causal LM"):
        check_tree_attention_support(torch.nn.Linear(2, 2))


def test_probe_catches_a_model_that_drops_the_tree_mask(rt):
    from entmtp.model._heads import new_heads
    from entmtp.runtime._decode import SpeculativeDecoder

    model = rt.sharp_llama(0)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    SpeculativeDecoder(model, heads, topk=4, probe=True)  # an honest model passes
    decoder = model.get_decoder()
    plain_forward = decoder.forward
    decoder.forward = lambda **kwargs: plain_forward(**{**kwargs, "attention_mask": None})
    with pytest.raises(EntmtpError, match="tree attention mask"):
        SpeculativeDecoder(model, heads, topk=4, probe=True)
