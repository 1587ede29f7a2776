"""Greedy decoding in low precision: every departure from plain greedy decoding in the same
dtype is a near-tie of the plain decoder's top logits; a clear choice is flagged.

Covered: Medusa and Hydra heads, the reference tree mc_sim_7b_63 and the largest tree of the
shipped bundles of each head type (128 nodes, depth 4), the static and the eager engine.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from pathlib import Path

import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.evaluation._departures import (
    NEAR_TIE_ULPS,
    check_departure,
    dtype_ulp,
    explain_departure,
    first_departure,
    plain_greedy_logits,
)
from entmtp.model._heads import new_heads
from entmtp.runtime import SpeculativeDecoder, StaticScheduler, autoregressive_generate
from entmtp.treesearch import Tree, load_bundle, reference_tree
from support import make_tiny_llama

VOCAB = 128
PROMPTS = 12
MAX_NEW_TOKENS = 40


def varied_llama(seed: int, dtype: torch.dtype):
    """A tiny random Llama with an untied, scaled lm_head (varied greedy continuations)."""
    model = make_tiny_llama(seed, vocab_size=VOCAB, hidden_size=64)
    generator = torch.Generator().manual_seed(1000 + seed)
    model.lm_head.weight = torch.nn.Parameter(
        torch.randn(model.lm_head.weight.shape, generator=generator) * 2.0)
    model.config.tie_word_embeddings = False
    return model.to(dtype).eval()


def prompts(seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (6,), generator=generator).tolist() for _ in range(PROMPTS)]


@cache
def largest_shipped_tree(head_type: str) -> Tree:
    """The largest (then deepest) tree of the shipped bundles for ``head_type`` heads."""
    folder = Path(str(resources.files("entmtp.trees").joinpath("bundles")))
    trees = [tree for path in sorted(folder.glob(f"*-{head_type}-*.json"))
             for tree in load_bundle(path).trees]
    return max(trees, key=lambda tree: (tree.num_nodes, tree.depth))


def test_the_largest_shipped_trees_are_large():
    for head_type in ("medusa", "hydra"):
        tree = largest_shipped_tree(head_type)
        assert tree.num_nodes >= 120 and tree.depth == 4


def departures(seed: int, dtype: torch.dtype, *, head_type: str = "medusa",
               tree: str = "mc_sim_7b_63", engine: str = "auto") -> list:
    """First departures of tree decoding (``tree``: the reference tree or ``largest``, the
    largest shipped tree of ``head_type``; ``engine``: auto = static, or eager) from plain
    greedy decoding, over the prompts of ``seed``."""
    model = varied_llama(seed, dtype)
    heads = new_heads(model, head_type=head_type, num_heads=4, seed=seed)
    decoder = SpeculativeDecoder(model, heads, topk=10, engine=engine)
    assert (decoder.static_engine is None) == (engine == "eager")
    tree = largest_shipped_tree(head_type) if tree == "largest" else reference_tree(tree)
    found = []
    for prompt in prompts(seed):
        decoded = decoder.generate(prompt, StaticScheduler(tree), max_new_tokens=MAX_NEW_TOKENS)
        plain = autoregressive_generate(model, prompt, max_new_tokens=MAX_NEW_TOKENS)
        departure = check_departure(model, prompt, decoded.tokens, plain.tokens)
        if departure is not None:
            found.append(departure)
    return found


@pytest.mark.parametrize(("seed", "dtype", "head_type", "tree", "engine"), [
    (0, torch.bfloat16, "medusa", "mc_sim_7b_63", "auto"),
    (2, torch.bfloat16, "medusa", "mc_sim_7b_63", "auto"),
    (0, torch.float16, "medusa", "mc_sim_7b_63", "auto"),
    (1, torch.bfloat16, "hydra", "mc_sim_7b_63", "auto"),
    (2, torch.bfloat16, "medusa", "largest", "eager"),
    (0, torch.bfloat16, "hydra", "largest", "auto"),
    (1, torch.bfloat16, "hydra", "largest", "eager"),
    (0, torch.float16, "hydra", "largest", "eager"),
])
def test_every_low_precision_departure_is_a_near_tie(seed, dtype, head_type, tree, engine):
    found = departures(seed, dtype, head_type=head_type, tree=tree, engine=engine)
    assert found, "no departure on these prompts: the test would check nothing"
    for departure in found:
        assert departure.dtype == str(dtype).removeprefix("torch.")
        assert departure.top1_token == departure.plain_token  # the same logits as the reference
        assert departure.gap_decoded <= NEAR_TIE_ULPS * departure.ulp, departure
        assert departure.near_tie


@pytest.mark.parametrize(("head_type", "tree", "engine"), [
    ("medusa", "mc_sim_7b_63", "auto"), ("hydra", "largest", "auto"),
    ("medusa", "largest", "eager"),
])
def test_fp32_decoding_never_departs(head_type, tree, engine):
    assert departures(0, torch.float32, head_type=head_type, tree=tree, engine=engine) == []


def test_a_departure_from_a_clear_choice_is_flagged():
    model = varied_llama(0, torch.bfloat16)
    prompt = prompts(0)[0]
    plain = autoregressive_generate(model, prompt, max_new_tokens=MAX_NEW_TOKENS).tokens
    position = 5
    logits = plain_greedy_logits(model, prompt, plain, position)
    worst = int(logits.argmin())  # a token the plain decoder ranks last: no tie
    decoded = plain[:position] + [worst] + plain[position + 1:]
    departure = check_departure(model, prompt, decoded, plain)
    assert departure.position == position and departure.decoded_token == worst
    assert departure.gap_decoded > 100 * departure.ulp and not departure.near_tie


def test_plain_logits_are_the_plain_decoders_choices():
    model = varied_llama(1, torch.bfloat16)
    prompt = prompts(1)[0]
    plain = autoregressive_generate(model, prompt, max_new_tokens=12).tokens
    for position, token in enumerate(plain):
        assert int(plain_greedy_logits(model, prompt, plain, position).argmax()) == token


def test_first_departure():
    assert first_departure([1, 2, 3], [1, 2, 3]) is None
    assert first_departure([1, 2, 3], [1, 5, 3]) == 1
    assert first_departure([7], [8]) == 0
    with pytest.raises(EntmtpError, match="max_new_tokens"):
        first_departure([1, 2], [1, 2, 3])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_ulp_is_the_spacing_of_representable_values(dtype):
    for value in (0.75, 1.0, 3.0, 23.25, -40.5, 1000.0):
        x = torch.tensor([value], dtype=dtype)
        up = torch.nextafter(x.abs(), torch.tensor([math.inf], dtype=dtype))
        assert dtype_ulp(value, dtype) == float(up - x.abs())


def test_near_tie_margin_in_units_of_the_resolution():
    ulp = dtype_ulp(20.0, torch.bfloat16)  # 0.125: bf16 keeps 8 significant bits
    assert ulp == 0.125
    logits = torch.full((8,), -5.0)
    logits[3] = 20.0
    for gap_ulps, near in ((0, True), (NEAR_TIE_ULPS, True), (NEAR_TIE_ULPS + 1, False)):
        logits[6] = 20.0 - gap_ulps * ulp
        departure = explain_departure(logits, position=4, plain_token=3, decoded_token=6,
                                      dtype=torch.bfloat16)
        assert departure.near_tie is near and departure.gap_decoded_ulps == gap_ulps
        assert (departure.top1_token, departure.top2_token) == (3, 6)
    tied = torch.zeros(4)
    tied[1] = tied[2] = 1.0  # greedy takes the first of tied maxima
    departure = explain_departure(tied, position=0, plain_token=1, decoded_token=2,
                                  dtype=torch.float16)
    assert (departure.top1_token, departure.top2_token, departure.gap_top2) == (1, 2, 0.0)
    assert departure.near_tie
