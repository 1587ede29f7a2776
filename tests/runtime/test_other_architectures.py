"""Models the static runtime cannot run (here GPT-2) decode on the eager runtime, say so in the
runtime note, and stay lossless: token-identical to ``model.generate``."""

from __future__ import annotations

import pytest
import torch

from entmtp.model._heads import new_heads
from entmtp.model._static_model import static_support
from entmtp.runtime._decode import SpeculativeDecoder, autoregressive_generate
from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._run import reference_tree
from entmtp.treesearch._schedule import DRAFT_ENTROPY, Schedule
from entmtp.treesearch._tree import Tree

PROMPTS = [[1, 5, 7, 9], [3, 70, 2, 2, 41, 8]]
NEW_TOKENS = 30


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    # a wide initialisation: varied greedy continuations rather than one repeated token
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=80, n_positions=256,
                        initializer_range=0.4, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(config).eval()
    references = {}
    for prompt in PROMPTS:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0)
        references[tuple(prompt)] = out[0, len(prompt):].tolist()
    return model, references


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_gpt2_decodes_losslessly_on_the_eager_runtime(gpt2, head_type):
    model, references = gpt2
    reason = static_support(model)
    assert reason is not None and "gpt2" in reason
    heads = new_heads(model, head_type=head_type, num_heads=4, seed=0)
    decoder = SpeculativeDecoder(model, heads, topk=10)
    assert decoder.static_engine is None
    assert decoder.runtime_note == f"greedy decoding runs on the eager runtime ({reason})"
    switching = Schedule((Tree.from_paths([[0], [1], [0, 0]]), Tree.from_paths([])), (2.0,),
                         EntropyEstimator.last(), DRAFT_ENTROPY)
    used = set()
    for prompt in PROMPTS:
        want = references[tuple(prompt)]
        assert len(set(want)) > 5  # not one repeated token
        for scheduler in (StaticScheduler(reference_tree("mc_sim_7b_63")),
                          BundleScheduler(switching)):
            got = decoder.generate(torch.tensor(prompt), scheduler, max_new_tokens=NEW_TOKENS)
            assert got.tokens == want
            assert sum(got.accept_lengths) + 1 == NEW_TOKENS
            if isinstance(scheduler, BundleScheduler):
                used.update(s.tree_index for s in got.step_log)
        plain = autoregressive_generate(model, prompt, max_new_tokens=NEW_TOKENS)
        assert plain.tokens == want and plain.steps == NEW_TOKENS - 1
    assert used == {0, 1}  # both trees of the switching schedule served steps


def test_asking_for_the_static_runtime_names_the_reason(gpt2):
    from entmtp.core import EntmtpError

    model, _ = gpt2
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    with pytest.raises(EntmtpError, match="engine='static' cannot run GPT2LMHeadModel: model "
                                          "type 'gpt2'"):
        SpeculativeDecoder(model, heads, engine="static")
