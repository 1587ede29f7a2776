"""bf16 / fp16 decoding against transformers' own greedy decoding in the same dtype.

The reference is ``model.generate`` (transformers' forward and cache, independent of entmtp's
static model code), not entmtp's ``autoregressive_generate``, which runs on the same static
model as tree decoding and so shares its bugs. Measured on these models (seeds 0-9, GQA and MHA,
8 short and 2 300-token prompts each): entmtp's plain decoding, static and eager, was
token-identical to ``generate`` on all 200 prompts in bf16 and all 200 in fp16, so it is asserted
identical; tree decoding (mc_sim_7b_63, random heads) departed on 17 of 200 prompts in bf16 and 4
of 200 in fp16, each time at a near-tie of transformers' top two logits (0-2 units of the dtype's
resolution), which is what is asserted of it.

The models attend sharply (query and key projections scaled up), so that attention depends on
the rotary positions, and two prompts are 300 tokens long (positions past 256, which bf16 does
not represent exactly): a rotary embedding computed in low precision then turns into departures
from clear choices, not only into flipped near-ties. (Rotary angles computed in the model's dtype
in model/_static_model.py fail the plain test in bf16 and fp16, and the bf16 tree test by a
departure 16 units from the top logit on a long prompt.)
"""

from __future__ import annotations

import itertools

import pytest
import torch

from entmtp.evaluation._departures import NEAR_TIE_ULPS, check_departure
from entmtp.model._heads import new_heads
from entmtp.runtime import SpeculativeDecoder, StaticScheduler, autoregressive_generate
from entmtp.treesearch._run import reference_tree

VOCAB = 128
# Seeds where tree decoding departs from generate in each dtype and each kv-head layout below
# (fp16 departures are rare: 4 of 200 prompts over seeds 0-9), so the near-tie check judges
# something.
SEEDS = (3, 7)
SHORT_PROMPTS, SHORT_NEW = 8, 32
LONG_PROMPTS, LONG_LENGTH, LONG_NEW = 2, 300, 16
DTYPES = [torch.bfloat16, torch.float16]
KV_HEADS = {"gqa": 2, "mha": 4}  # of 4 attention heads
HEAD_TYPE = {3: "hydra", 7: "medusa"}  # by seed: both head types
# The eager engine runs one seed of each test (it departs where the static one does).
EAGER_PLAIN_SEED, EAGER_TREE_SEED = 3, 7


def position_sensitive_llama(seed: int, kv_heads: int, dtype: torch.dtype):
    """A tiny random Llama with varied greedy continuations (an untied, scaled lm_head) and
    sharp, position-dependent attention (query and key projections scaled 8x)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape,
                                               generator=generator) * 2.0)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    return model.to(dtype).eval()


def prompts(seed: int) -> list[tuple[list[int], int]]:
    """(prompt, max_new_tokens): short prompts, then long ones."""
    generator = torch.Generator().manual_seed(seed)
    short = [torch.randint(3, VOCAB, (6,), generator=generator).tolist()
             for _ in range(SHORT_PROMPTS)]
    generator = torch.Generator().manual_seed(100 + seed)
    long = [torch.randint(3, VOCAB, (LONG_LENGTH,), generator=generator).tolist()
            for _ in range(LONG_PROMPTS)]
    return [(p, SHORT_NEW) for p in short] + [(p, LONG_NEW) for p in long]


def generate_reference(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy decoding (no EOS) in the model's dtype."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def case():
    """(dtype, kv_heads, seed) -> (model, [(prompt, max_new_tokens, generate's tokens)])."""
    made: dict = {}

    def get(dtype: torch.dtype, kv_heads: int, seed: int):
        key = (dtype, kv_heads, seed)
        if key not in made:
            model = position_sensitive_llama(seed, kv_heads, dtype)
            made[key] = model, [(p, n, generate_reference(model, p, n)) for p, n in prompts(seed)]
        return made[key]

    return get


@pytest.mark.parametrize("kv", KV_HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_decoding_is_token_identical_to_generate(case, dtype, kv):
    """entmtp's plain greedy decoding, on the static runtime and the eager one, emits exactly
    transformers' tokens in the same dtype."""
    for seed in SEEDS:
        model, runs = case(dtype, KV_HEADS[kv], seed)
        for engine in ("auto", "eager") if seed == EAGER_PLAIN_SEED else ("auto",):
            for index, (prompt, max_new, reference) in enumerate(runs):
                plain = autoregressive_generate(model, prompt, max_new_tokens=max_new,
                                                engine=engine).tokens
                departure = check_departure(model, prompt, plain, reference)
                assert departure is None, (seed, engine, index, departure)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tree_decoding_departs_from_generate_only_at_near_ties(case, dtype):
    """Tree decoding (mc_sim_7b_63, random heads; static and eager engines) emits transformers'
    tokens up to its first departure, and that departure is a near-tie of transformers' top two
    logits."""
    tree = reference_tree("mc_sim_7b_63")
    found = []
    for kv, seed in itertools.product(KV_HEADS.values(), SEEDS):
        model, runs = case(dtype, kv, seed)
        heads = new_heads(model, head_type=HEAD_TYPE[seed], num_heads=4, seed=seed)
        for engine in ("auto", "eager") if seed == EAGER_TREE_SEED else ("auto",):
            decoder = SpeculativeDecoder(model, heads, topk=10, engine=engine)
            assert (decoder.static_engine is None) == (engine == "eager")
            for index, (prompt, max_new, reference) in enumerate(runs):
                decoded = decoder.generate(prompt, StaticScheduler(tree),
                                           max_new_tokens=max_new).tokens
                departure = check_departure(model, prompt, decoded, reference)
                if departure is None:
                    continue
                found.append(departure)
                where = (kv, seed, engine, index, departure)
                # transformers' recomputed logits choose generate's token there
                assert departure.top1_token == departure.plain_token, where
                assert departure.gap_decoded <= NEAR_TIE_ULPS * departure.ulp, where
                assert departure.near_tie, where
    assert found, "no departure: the near-tie check would judge nothing"
