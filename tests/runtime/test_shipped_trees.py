"""Every distinct tree of the shipped bundles decodes token-identically to ``model.generate``.

The shipped bundles (trees/bundles/) hold trees of 3 to 128 nodes; the unit tests elsewhere
decode random trees of up to ~60 nodes and mc_sim_7b_63. Here each distinct tree of the
bundles (their schedules' trees and their best static trees, deduplicated per head type) is
verified in float32 on a tiny random Llama, on the static runtime (both attention windows) and
the eager one. A round-robin scheduler switches tree at every step, so one decode covers many
trees. The draft heads are oracles that know the greedy continuation and rank the true token
low (conftest ``OracleHeads``): random heads would accept next to nothing, while these accept
paths down to the trees' depth 4, through nodes past the 64th of the 128-node trees.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch

from entmtp.runtime import SpeculativeDecoder
from entmtp.runtime._scheduler import TreeChoice
from entmtp.treesearch import BASE_ENTROPY, Tree, load_bundle

PROMPTS = [[1, 17, 42, 99, 5], [1, 3], [1, 60, 61, 62, 63, 64, 65, 66, 120]]
NEW_TOKENS = 96


@cache
def shipped_trees(head_type: str) -> tuple[tuple[Tree, ...], int, int]:
    """The distinct trees of the shipped ``head_type`` bundles (first seen first, bundles by
    name), with the heads' number and top-k they were searched for."""
    folder = Path(str(resources.files("entmtp.trees").joinpath("bundles")))
    trees: dict[tuple, Tree] = {}
    heads = set()
    for path in sorted(folder.glob(f"*-{head_type}-*.json")):
        bundle = load_bundle(path)
        heads.add((bundle.heads.num_heads, bundle.heads.topk))
        best = [bundle.best_static.tree] if bundle.best_static is not None else []
        for tree in [*bundle.trees, *best]:
            trees.setdefault(tree.paths, tree)
    assert len(heads) == 1, f"{head_type} bundles are for several head sets: {heads}"
    (num_heads, topk), = heads
    return tuple(trees.values()), num_heads, topk


class RoundRobin:
    """A scheduler verifying the next of ``trees`` at every step, from tree ``start``."""

    signal = BASE_ENTROPY
    needs_draft_entropy = False
    reads_entropy = False

    def __init__(self, trees: tuple[Tree, ...], start: int) -> None:
        self.trees, self.start = trees, start
        self.reset()

    def reset(self) -> None:
        self._next = self.start

    def observe(self, entropies) -> None:
        pass

    def observe_draft(self, entropy: float) -> None:
        pass

    def choose(self) -> TreeChoice:
        index = self._next % len(self.trees)
        self._next += 1
        return TreeChoice(index, self.trees[index], math.nan)


@pytest.fixture(scope="module")
def setup(rt):
    model = rt.sharp_llama(3)
    references = {tuple(p): rt.greedy_reference(model, torch.tensor(p), NEW_TOKENS)
                  for p in PROMPTS}
    return model, references


def test_the_shipped_trees_are_many_and_large():
    for head_type in ("medusa", "hydra"):
        trees, num_heads, topk = shipped_trees(head_type)
        assert len(trees) >= 20 and len({t.paths for t in trees}) == len(trees)
        assert max(t.num_nodes for t in trees) == 128 and min(t.num_nodes for t in trees) < 8
        assert max(t.depth for t in trees) == num_heads
        for tree in trees:
            tree.check_fits(topk=topk, num_heads=num_heads)


def _logged(result) -> list[tuple]:
    return [(s.position, s.tree_index, s.num_nodes, s.depth, s.accept_length)
            for s in result.step_log]


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_every_shipped_tree_decodes_like_generate(rt, setup, head_type):
    model, references = setup
    trees, num_heads, topk = shipped_trees(head_type)
    rng = np.random.default_rng(41 if head_type == "medusa" else 42)
    steps = []  # (tree index, accept length) of every step
    for case, prompt in enumerate(PROMPTS):
        ids = torch.tensor(prompt)
        reference = references[tuple(prompt)]
        ranks = rt.random_ranks(rng, len(reference), num_heads, topk, miss=0.1)
        heads = rt.OracleHeads(model, ids, reference, ranks, head_type=head_type, topk=topk,
                               seed=case)
        decoders = {
            "static filled": SpeculativeDecoder(model, heads, topk=topk, window="filled"),
            "static full": SpeculativeDecoder(model, heads, topk=topk, window="full"),
            "eager": SpeculativeDecoder(model, heads, topk=topk, engine="eager"),
        }
        assert decoders["eager"].static_engine is None
        start = case * len(trees) // len(PROMPTS)
        runs = {name: decoder.generate(ids, RoundRobin(trees, start), max_new_tokens=NEW_TOKENS)
                for name, decoder in decoders.items()}
        for name, run in runs.items():
            assert run.tokens == reference, (name, prompt)
            assert _logged(run) == _logged(runs["eager"]), (name, prompt)
        steps += [(s.tree_index, s.accept_length) for s in runs["eager"].step_log]
    # every tree verified a step; the big trees accepted deep paths
    assert {index for index, _ in steps} == set(range(len(trees)))
    big = [length for index, length in steps if trees[index].num_nodes > 64]
    assert max(big) == num_heads + 1 and np.mean(big) > 2.5
