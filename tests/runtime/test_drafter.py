"""Drafted node tokens equal a node-by-node reference: head depth(node)'s top-k at its rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entmtp.calibrate._heads import new_heads
from entmtp.runtime._drafter import TreeDrafter
from entmtp.runtime._tree_attention import tree_plan
from entmtp.treesearch._errors import EntmtpError


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_drafted_tokens_equal_per_node_reference(rt, head_type):
    model = rt.sharp_llama(7)
    heads = new_heads(model, head_type=head_type, num_heads=4, seed=3)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    drafter = TreeDrafter(heads)
    rng = np.random.default_rng(2)
    for trial in range(6):
        tree = rt.random_tree(rng, int(rng.integers(1, 30)), depth=4 - trial % 2, topk=5)
        topk = 5 if trial % 3 else [6, 5, 5, 5]
        plan = tree_plan(tree, topk)
        hidden = torch.randn(1, heads.hidden_size, generator=generator)
        root = torch.tensor([int(rng.integers(0, heads.vocab_size))])
        with torch.inference_mode():
            tokens = drafter.draft(plan, root, hidden).tolist()
            assert tokens[0] == int(root)
            for node, path in enumerate(tree.paths, start=1):
                depth = len(path)
                prefix_nodes = [tree.index(path[:d]) if d else 0 for d in range(depth)]
                prefix = torch.tensor([[tokens[i] for i in prefix_nodes]])
                logits = heads.head_logits(depth, hidden,
                                           prefix if head_type == "hydra" else None)
                k = plan.topk[depth - 1]
                expected = int(torch.topk(logits[0], k).indices[path[-1]])
                assert tokens[node] == expected, (trial, path)


def test_unknown_head_type_is_rejected():
    class Heads(torch.nn.Module):
        head_type = "eagle"

    with pytest.raises(EntmtpError, match="head_type"):
        TreeDrafter(Heads())
