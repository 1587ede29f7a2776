"""Drafted node tokens equal a node-by-node reference: head depth(node)'s top-k at its rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.model._heads import new_heads
from entmtp.runtime._drafter import TreeDrafter, fuses_with_base
from entmtp.runtime._tree_attention import tree_plan
from entmtp.treesearch._tree import Tree


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
            tokens = drafter.draft(plan, root, hidden)[0].tolist()
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


@pytest.mark.parametrize(("head_type", "shared"),
                         [("medusa", True), ("medusa", False), ("hydra", True)])
def test_a_batch_drafts_every_row_as_it_drafts_alone(rt, head_type, shared):
    """Rows drafted together (prepared, fused or not) give each row's tokens and prepared
    logits drafted alone."""
    model = rt.sharp_llama(7)
    heads = _noisy_heads(model, head_type, shared_lm_head=shared)
    drafter = TreeDrafter(heads)
    rng = np.random.default_rng(11)
    generator = torch.Generator().manual_seed(12)
    for trial in range(6):
        tree = rt.random_tree(rng, int(rng.integers(0, 30)), depth=1 + trial % 4, topk=5)
        plan = tree_plan(tree, 5 if trial % 2 else [6, 5, 5, 5])
        rows = 1 + trial % 4
        hidden = torch.randn(rows, heads.hidden_size, generator=generator)
        root = torch.tensor(rng.integers(0, heads.vocab_size, size=rows))
        with torch.inference_mode():
            prepared = drafter.prepare(root, hidden, max_depth=4)
            together = drafter.draft(plan, root, hidden)
            assert together.shape == (rows, plan.size)
            assert torch.equal(drafter.draft(plan, root, hidden, prepared), together)
            if fuses_with_base(model, heads):
                base, fused = drafter.project_with_base(hidden, 4)
                torch.testing.assert_close(fused.logits, prepared.logits, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(base, model.get_output_embeddings()(hidden),
                                           rtol=1e-5, atol=1e-5)
            for row in range(rows):
                alone = drafter.prepare(root[row : row + 1], hidden[row : row + 1], 4)
                torch.testing.assert_close(prepared.logits[row : row + 1], alone.logits,
                                           rtol=1e-5, atol=1e-5)
                assert together[row].tolist() == drafter.draft(
                    plan, root[row : row + 1], hidden[row : row + 1])[0].tolist(), (trial, row)


def test_unknown_head_type_is_rejected():
    class Heads(torch.nn.Module):
        head_type = "eagle"

    with pytest.raises(EntmtpError, match="head_type"):
        TreeDrafter(Heads())


def _noisy_heads(model, head_type: str, *, shared_lm_head: bool = True):
    heads = new_heads(model, head_type=head_type, num_heads=4, seed=3,
                      shared_lm_head=shared_lm_head)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return heads


@pytest.mark.parametrize(("head_type", "shared"),
                         [("medusa", True), ("medusa", False), ("hydra", True)])
def test_prepared_drafting_equals_unprepared(rt, head_type, shared):
    heads = _noisy_heads(rt.sharp_llama(7), head_type, shared_lm_head=shared)
    drafter = TreeDrafter(heads)
    rng = np.random.default_rng(3)
    generator = torch.Generator().manual_seed(2)
    for trial in range(8):
        tree = rt.random_tree(rng, int(rng.integers(0, 30)), depth=1 + trial % 4, topk=5)
        plan = tree_plan(tree, 5 if trial % 3 else [6, 5, 5, 5])
        hidden = torch.randn(1, heads.hidden_size, generator=generator)
        root = torch.tensor([int(rng.integers(0, heads.vocab_size))])
        with torch.inference_mode():
            prepared = drafter.prepare(root, hidden, max_depth=4)
            assert drafter.draft(plan, root, hidden, prepared)[0].tolist() == \
                drafter.draft(plan, root, hidden)[0].tolist(), (trial, tree)
            prefix = root.reshape(1, 1) if head_type == "hydra" else None
            head1 = heads.head_logits(1, hidden, prefix)[0]
            torch.testing.assert_close(prepared.first_logits[0], head1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_a_prepared_buffer_serves_every_depth_as_prepare_gives_it(rt, head_type):
    """What a static engine keeps: one buffer of ``prepared_rows`` rows, into which a
    preparation for depth d is copied, viewed back as ``prepare(d)``; ``prepare_depths`` lists
    one depth per distinct preparation."""
    heads = _noisy_heads(rt.sharp_llama(7), head_type)
    drafter = TreeDrafter(heads)
    generator = torch.Generator().manual_seed(4)
    hidden = torch.randn(1, heads.hidden_size, generator=generator)
    root = torch.tensor([11])
    distinct = set()
    with torch.inference_mode():
        buffer = torch.zeros(1, drafter.prepared_rows, heads.vocab_size)
        for depth in range(1, heads.num_heads + 1):
            prepared = drafter.prepare(root, hidden, depth)
            buffer[:, : prepared.logits.shape[1]].copy_(prepared.logits)
            view = drafter.prepared_view(buffer, depth)
            assert view.depth == prepared.depth >= depth
            assert torch.equal(view.logits, prepared.logits)
            distinct.add((prepared.depth, tuple(prepared.logits.shape)))
    assert sorted(depth for depth, _ in distinct) == drafter.prepare_depths()
    assert drafter.can_fuse_with_base == (head_type == "medusa")


def test_prepared_medusa_projects_all_heads_once(rt, monkeypatch):
    """Head 1 (for the entropy) and the deeper heads share one vocabulary matmul per step."""
    import entmtp.runtime._drafter as drafter_module

    heads = _noisy_heads(rt.sharp_llama(7), "medusa")
    calls = []
    real = drafter_module.project_rows

    def counting(features, weight, bias, **kwargs):
        calls.append(features.shape[0])
        return real(features, weight, bias, **kwargs)

    monkeypatch.setattr(drafter_module, "project_rows", counting)
    drafter = TreeDrafter(heads)
    plan = tree_plan(Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]]), 5)
    hidden = torch.randn(1, heads.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        prepared = drafter.prepare(torch.tensor([3]), hidden, max_depth=4)
        drafter.draft(plan, torch.tensor([3]), hidden, prepared)
    assert calls == [4]


def test_prepared_hydra_runs_level_one_once(rt, monkeypatch):
    heads = _noisy_heads(rt.sharp_llama(7), "hydra")
    calls = []
    real = heads.head_logits

    def counting(depth, hidden, prefix):
        calls.append((depth, hidden.shape[0]))
        return real(depth, hidden, prefix)

    monkeypatch.setattr(heads, "head_logits", counting)
    drafter = TreeDrafter(heads)
    plan = tree_plan(Tree.from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]]), 5)
    hidden = torch.randn(1, heads.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        prepared = drafter.prepare(torch.tensor([3]), hidden, max_depth=3)
        drafter.draft(plan, torch.tensor([3]), hidden, prepared)
    assert calls == [(1, 1), (2, 2), (3, 1)]


def test_draft_deeper_than_prepared_is_rejected(rt):
    heads = _noisy_heads(rt.sharp_llama(7), "medusa")
    drafter = TreeDrafter(heads)
    hidden = torch.zeros(1, heads.hidden_size)
    with torch.inference_mode():
        prepared = drafter.prepare(torch.tensor([3]), hidden, max_depth=1)
        with pytest.raises(EntmtpError, match="prepare"):
            drafter.draft(tree_plan(Tree.from_paths([[0], [0, 0]]), 5), torch.tensor([3]),
                          hidden, prepared)


def test_only_medusa_heads_sharing_the_plain_lm_head_fuse(rt):
    model = rt.sharp_llama(7)
    assert fuses_with_base(model, _noisy_heads(model, "medusa"))
    assert not fuses_with_base(model, _noisy_heads(model, "medusa", shared_lm_head=False))
    assert not fuses_with_base(model, _noisy_heads(model, "hydra"))
    other = rt.sharp_llama(7)  # equal weights, but not the model's own lm_head
    assert not fuses_with_base(model, _noisy_heads(other, "medusa"))
    heads = _noisy_heads(model, "medusa")
    model.config.final_logit_softcapping = 30.0  # logits are not the lm_head's output
    assert not fuses_with_base(model, heads)


def test_project_with_base_is_the_base_logits_and_the_prepared_heads(rt, monkeypatch):
    import entmtp.runtime._drafter as drafter_module

    model = rt.sharp_llama(7)
    heads = _noisy_heads(model, "medusa")
    drafter = TreeDrafter(heads)
    generator = torch.Generator().manual_seed(4)
    calls = []
    real = drafter_module.project_rows

    def counting(features, weight, bias, **kwargs):
        calls.append(features.shape[0])
        return real(features, weight, bias, **kwargs)

    monkeypatch.setattr(drafter_module, "project_rows", counting)
    for max_depth in (0, 2, 4):
        hidden = torch.randn(1, heads.hidden_size, generator=generator)
        with torch.inference_mode():
            calls.clear()
            logits, prepared = drafter.project_with_base(hidden, max_depth)
            assert calls == [1 + max(max_depth, 1)]  # one projection: base row + the heads
            reference = drafter.prepare(torch.tensor([3]), hidden, max_depth)
            base = model.get_output_embeddings()(hidden)
        assert logits.shape == base.shape and prepared.depth == reference.depth
        assert int(logits.argmax()) == int(base.argmax())
        torch.testing.assert_close(logits, base, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(prepared.logits, reference.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("head_type", "shared"),
                         [("medusa", True), ("medusa", False), ("hydra", True)])
def test_a_draft_vocabulary_drafts_the_full_top_k_masked_to_it(rt, head_type, shared):
    """Each node's token is the rank-r token of its head's full logits with every token outside
    the draft vocabulary masked out (Hydra: at the drafted prefix); prepared or not, fused or
    not."""
    model = rt.sharp_llama(7)
    heads = _noisy_heads(model, head_type, shared_lm_head=shared)
    generator = torch.Generator().manual_seed(6)
    vocab = torch.sort(torch.randperm(heads.vocab_size, generator=generator)[:70]).values
    outside = torch.ones(heads.vocab_size, dtype=torch.bool)
    outside[vocab] = False
    rng = np.random.default_rng(8)
    cases = []
    for trial in range(6):
        tree = rt.random_tree(rng, int(rng.integers(1, 30)), depth=1 + trial % 4, topk=5)
        cases.append((tree, tree_plan(tree, 5 if trial % 2 else [6, 5, 5, 5]),
                      torch.randn(1, heads.hidden_size, generator=generator),
                      torch.tensor([int(rng.integers(0, heads.vocab_size))])))
    heads.set_draft_vocab(vocab)
    drafter = TreeDrafter(heads)
    with torch.inference_mode():
        for trial, (tree, plan, hidden, root) in enumerate(cases):
            tokens = drafter.draft(plan, root, hidden)[0].tolist()
            prepared = drafter.prepare(root, hidden, max_depth=4)
            assert drafter.draft(plan, root, hidden, prepared)[0].tolist() == tokens
            if fuses_with_base(model, heads):
                _, fused = drafter.project_with_base(hidden, 4)
                torch.testing.assert_close(fused.logits, prepared.logits, rtol=1e-5, atol=1e-5)
                assert drafter.draft(plan, root, hidden, fused)[0].tolist() == tokens
            for node, path in enumerate(tree.paths, start=1):
                depth = len(path)
                prefix = torch.tensor([[tokens[tree.index(path[:d]) if d else 0]
                                        for d in range(depth)]])
                features = heads.head_features(depth, hidden,
                                               prefix if head_type == "hydra" else None)
                full = heads.project(depth, features)[0]  # the whole vocabulary
                full[outside] = float("-inf")
                expected = int(torch.topk(full, plan.topk[depth - 1]).indices[path[-1]])
                assert tokens[node] == expected, (trial, path)
                assert not outside[tokens[node]]


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_drafting_packs_each_weight_once(rt, monkeypatch, head_type):
    """Later steps reuse the packed copies of the first (shared lm_head: a fresh detached view
    each call), and the fused base row is bitwise the lm_head's own output."""
    from entmtp.model import _row_gemm

    if not _row_gemm.packing_available():
        pytest.skip("this torch has no oneDNN packed linear")
    model = rt.sharp_llama(7)
    _row_gemm.use_row_kernels(model)  # as the loaders do
    heads = _noisy_heads(model, head_type)
    drafter = TreeDrafter(heads)
    plan = tree_plan(Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]]), 5)
    generator = torch.Generator().manual_seed(5)
    packings = []
    real = _row_gemm._reorder
    monkeypatch.setattr(_row_gemm, "_reorder",
                        lambda weight, size: packings.append(weight.shape) or real(weight, size))
    counts = []
    for _ in range(3):
        hidden = torch.randn(1, heads.hidden_size, generator=generator)
        with torch.inference_mode():
            prepared = drafter.prepare(torch.tensor([3]), hidden, max_depth=4)
            drafter.draft(plan, torch.tensor([3]), hidden, prepared)
            if head_type == "medusa":
                logits, _ = drafter.project_with_base(hidden, 4)
                assert torch.equal(logits, model.get_output_embeddings()(hidden))
        counts.append(len(packings))
    assert counts[0] > 0 and counts[1] == counts[2] == counts[0]
