"""Acceptance rules: greedy and typical take the longest valid path; rejection is lossless."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from entmtp.runtime._decode import SpeculativeDecoder
from entmtp.runtime._sampling import rejection_accept, typical_accept
from entmtp.runtime._scheduler import StaticScheduler
from entmtp.runtime._tree_attention import tree_plan
from entmtp.runtime._verify import greedy_accept
from entmtp.treesearch._tree import Tree

TREE = Tree.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]])


def _check_longest_valid_path(plan, path: list[int], node_ok: list[bool]) -> None:
    """``path`` is a root path of accepted nodes, and no accepted root path is longer."""
    parents = plan.parents.tolist()
    depths = plan.depths.tolist()
    assert path[0] == 0
    for parent, child in itertools.pairwise(path):
        assert parents[child] == parent and node_ok[child]
    fully_ok = [True] + [False] * (plan.size - 1)
    for node in range(1, plan.size):  # canonical order: parents first
        fully_ok[node] = node_ok[node] and fully_ok[parents[node]]
    assert len(path) - 1 == max(d for d, ok in zip(depths, fully_ok, strict=True) if ok)


def test_greedy_and_typical_accept_the_longest_valid_path(rt):
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)
    vocab = 6
    for trial in range(200):
        tree = rt.random_tree(rng, int(rng.integers(0, 15)), depth=4, topk=3)
        plan = tree_plan(tree, 3)
        logits = torch.as_tensor(rng.normal(size=(plan.size, vocab)) * 3, dtype=torch.float32)
        # siblings carry distinct tokens, as top-k drafting guarantees
        tokens = torch.zeros(plan.size, dtype=torch.int64)
        for node in range(1, plan.size):
            perm = np.random.default_rng(trial * 1000 + int(plan.parents[node])).permutation(vocab)
            tokens[node] = int(perm[int(plan.ranks[node])])
        parents = plan.parents
        path, after = greedy_accept(plan, tokens, logits)
        argmax = logits.argmax(-1)
        _check_longest_valid_path(plan, path, (tokens == argmax[parents]).tolist())
        assert after == int(argmax[path[-1]])

        temperature, threshold, alpha = 0.7, 0.09, 0.3
        path, after = typical_accept(plan, tokens, logits, temperature=temperature,
                                     posterior_threshold=threshold, posterior_alpha=alpha,
                                     generator=generator)
        probs = torch.softmax(logits / temperature, -1)
        ok = []
        for node in range(plan.size):
            p = probs[int(parents[node])]
            entropy = float(-(p * torch.log(p + 1e-5)).sum())
            ok.append(float(p[tokens[node]]) > min(threshold, alpha * math.exp(-entropy)))
        _check_longest_valid_path(plan, path, ok)
        assert 0 <= after < vocab


class _MarkovChain:
    """Target: token after ``a`` ~ softmax(logits[a] / T). Drafts: a fixed ranking per token."""

    def __init__(self, vocab: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.logits = torch.as_tensor(rng.normal(size=(vocab, vocab)) * 1.5, dtype=torch.float32)
        self.draft_order = [rng.permutation(vocab) for _ in range(vocab)]
        self.plan = tree_plan(TREE, 3)
        self._trees = {root: self._draft(root) for root in range(vocab)}

    def _draft(self, root: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.zeros(self.plan.size, dtype=torch.int64)
        tokens[0] = root
        for node in range(1, self.plan.size):
            parent_token = int(tokens[int(self.plan.parents[node])])
            tokens[node] = int(self.draft_order[parent_token][int(self.plan.ranks[node])])
        return tokens, self.logits[tokens]

    def target(self, first: int, length: int, temperature: float) -> dict[tuple, float]:
        probs = torch.softmax(self.logits / temperature, -1).double()
        out = {}
        vocab = probs.shape[0]
        for seq in itertools.product(range(vocab), repeat=length):
            p, previous = 1.0, first
            for token in seq:
                p *= float(probs[previous, token])
                previous = token
            out[seq] = p
        return out

    def sample(self, kernel, first: int, length: int, temperature: float, generator) -> tuple:
        out: list[int] = []
        pending = first
        while len(out) < length:
            tokens, logits = self._trees[pending]
            path, after = kernel(self.plan, tokens, logits, temperature=temperature,
                                 generator=generator)
            out.extend(tokens[path[1:]].tolist())
            out.append(after)
            pending = after
        return tuple(out[:length])


def _chi_square(counts: dict[tuple, int], target: dict[tuple, float], n: int) -> tuple[float, int]:
    """Pearson statistic with cells of expected count < 5 pooled; returns (statistic, df)."""
    stat, pooled_observed, pooled_expected, cells = 0.0, 0, 0.0, 0
    for outcome, p in target.items():
        expected = n * p
        if expected < 5:
            pooled_observed += counts.get(outcome, 0)
            pooled_expected += expected
            continue
        stat += (counts.get(outcome, 0) - expected) ** 2 / expected
        cells += 1
    if pooled_expected > 0:
        stat += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        cells += 1
    return stat, cells - 1


def _critical_value(df: int, z: float = 3.719) -> float:
    """Chi-square quantile by Wilson-Hilferty; z = 3.719 is the normal 1 - 1e-4 quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _biased_kernel(plan, tokens, logits, *, temperature, generator):
    """A classic mistake: accept child j with probability p(x_j), never renormalising by the
    mass left after its rejected siblings, and sample the bonus token from the full p."""
    probs = torch.softmax(logits / temperature, -1)
    children = plan.children.tolist()
    node, path = 0, [0]
    while True:
        chosen = None
        for child in children[node]:
            if child < 0:
                break
            if float(torch.rand((), generator=generator)) < float(probs[node, tokens[child]]):
                chosen = child
                break
        if chosen is None:
            return path, int(torch.multinomial(probs[node], 1, generator=generator))
        node = chosen
        path.append(node)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_rejection_sampling_on_a_tree_follows_the_target_distribution(temperature):
    chain = _MarkovChain(vocab=4, seed=11)
    length, n = 3, 3000
    target = chain.target(0, length, temperature)
    results = {}
    kernels = [("rejection", rejection_accept)]
    if temperature == 1.0:
        kernels.append(("biased", _biased_kernel))
    for name, kernel in kernels:
        generator = torch.Generator().manual_seed(123)
        counts: dict[tuple, int] = {}
        for _ in range(n):
            outcome = chain.sample(kernel, 0, length, temperature, generator)
            counts[outcome] = counts.get(outcome, 0) + 1
        results[name] = _chi_square(counts, target, n)
    stat, df = results["rejection"]
    print(results)
    assert stat < _critical_value(df), results
    if "biased" in results:  # the same test catches a kernel that is not lossless
        biased_stat, biased_df = results["biased"]
        assert biased_stat > _critical_value(biased_df), results


def test_sampling_modes_are_seeded_and_cold_sampling_is_greedy(rt):
    model = rt.sharp_llama(4)
    prompt = torch.tensor([1, 8, 15, 16, 23, 42])
    reference = rt.greedy_reference(model, prompt, 24)
    from entmtp.model._heads import new_heads

    heads = new_heads(model, head_type="hydra", num_heads=3, seed=0)
    decoder = SpeculativeDecoder(model, heads, topk=4)
    tree = StaticScheduler(Tree.from_paths([[0], [1], [0, 0], [0, 0, 0], [2]]))
    for mode in ("rejection", "typical"):
        first = decoder.generate(prompt, tree, max_new_tokens=24, mode=mode, temperature=1.0,
                                 seed=3)
        again = decoder.generate(prompt, tree, max_new_tokens=24, mode=mode, temperature=1.0,
                                 seed=3)
        assert first.tokens == again.tokens and len(first.tokens) == 24
        others = {tuple(decoder.generate(prompt, tree, max_new_tokens=24, mode=mode,
                                         temperature=1.0, seed=s).tokens) for s in (4, 5)}
        assert len(others | {tuple(first.tokens)}) > 1
    cold = decoder.generate(prompt, tree, max_new_tokens=24, mode="rejection",
                            temperature=1e-4, seed=0)
    assert cold.tokens == reference
