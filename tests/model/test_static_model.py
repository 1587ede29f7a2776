"""The compact static-cache forward equals transformers' forward (prefill and tree steps)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from entmtp.core import EntmtpError
from entmtp.model._static_model import (
    GROUPED_KV_WAYS,
    StaticLlama,
    compact_static_cache,
    static_support,
)
from entmtp.runtime._kv_cache import new_cache
from entmtp.runtime._tree_attention import tree_plan
from entmtp.runtime._verify import forward_tokens, tree_forward

ROPES = {
    "default": None,
    "smollm2_theta": {"rope_type": "default", "rope_theta": 100000.0},
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
               "rope_theta": 500000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
             "rope_theta": 10000.0},
}


def _llama(kv_heads: int, rope: str, attn: str = "sdpa", seed: int = 0) -> LlamaForCausalLM:
    extra = {} if ROPES[rope] is None else {"rope_parameters": ROPES[rope]}
    config = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=80,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                         max_position_embeddings=256, tie_word_embeddings=False, **extra)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def _window(static: StaticLlama, cache, past_len: int, q: int, tree_mask, full: bool):
    """Mask and kv_len of a tree of ``q`` nodes after ``past_len`` cached tokens."""
    if not full:
        mask = torch.ones(q, past_len + q, dtype=torch.bool)
        mask[:, past_len:] = tree_mask
        return mask, past_len + q
    capacity = cache.shape[3]
    mask = torch.zeros(q, capacity, dtype=torch.bool)
    mask[:, :past_len] = True
    mask[:, past_len : past_len + q] = tree_mask
    return mask, None


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("full", [False, True])
def test_prefill_and_tree_step_equal_transformers(rt, kv_heads, rope, full):
    model = _llama(kv_heads, rope)
    assert static_support(model) is None
    static = StaticLlama(model)
    rng = np.random.default_rng(kv_heads)
    prompt = torch.tensor(rng.integers(0, 96, size=70))  # past yarn's / llama3's original
    tree = rt.random_tree(rng, 12, depth=4, topk=4)
    plan = tree_plan(tree, 4)
    tokens = torch.tensor(rng.integers(0, 96, size=plan.size))
    with torch.inference_mode():
        reference_logits = model(prompt[None]).logits[0]
        eager_cache = new_cache(model)
        forward_tokens(model, eager_cache, prompt[None])
        _, reference_tree = tree_forward(model, eager_cache, plan, tokens, len(prompt),
                                         dtype=torch.float32)

        cache = static.new_cache(len(prompt) + plan.size + 5)
        p = len(prompt)
        causal = torch.ones(p, p, dtype=torch.bool).tril()
        mask, kv_len = _window(static, cache, 0, p, causal, full)
        hidden = static.backbone(cache, prompt, torch.arange(p), torch.arange(p), mask, kv_len)
        torch.testing.assert_close(static.logits(hidden), reference_logits, rtol=1e-5,
                                   atol=1e-5)
        mask, kv_len = _window(static, cache, p, plan.size, plan.tree_mask, full)
        hidden = static.backbone(cache, tokens, plan.depths + p, torch.arange(plan.size) + p,
                                 mask, kv_len)
        torch.testing.assert_close(static.logits(hidden), reference_tree, rtol=1e-5, atol=1e-5)
        # the cache holds what transformers' cache holds, tree entries included
        for index, layer in enumerate(eager_cache.layers):
            length = layer.keys.shape[2]
            torch.testing.assert_close(cache[index, 0, :, :length], layer.keys[0], rtol=1e-5,
                                       atol=1e-5)
            torch.testing.assert_close(cache[index, 1, :, :length], layer.values[0],
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("way", [w for w in GROUPED_KV_WAYS if w != "repeat"])
def test_each_grouped_kv_way_computes_the_repeated_keys_attention(rt, kv_heads, dtype, full,
                                                                  way):
    """Every way of reading grouped key/value heads computes what repeating them per query head
    does (transformers' way), prompt and tree steps, hidden states and cache: SDPA's own grouped
    heads to the bit, the folded rows to rounding (a kernel may split the rows differently)."""
    model = _llama(kv_heads, "smollm2_theta", seed=2).to(dtype)
    static = StaticLlama(model)
    assert static.grouped_kv is None
    rng = np.random.default_rng(20 + kv_heads)
    prompt = torch.tensor(rng.integers(0, 96, size=40))
    plan = tree_plan(rt.random_tree(rng, 10, depth=4, topk=3), 3)
    tokens = torch.tensor(rng.integers(0, 96, size=plan.size))
    p = len(prompt)
    results = {}
    with torch.inference_mode():
        for grouped_kv in (way, "repeat"):
            static.grouped_kv = grouped_kv
            cache = static.new_cache(p + plan.size + 3)
            mask, kv_len = _window(static, cache, 0, p, torch.ones(p, p, dtype=torch.bool).tril(),
                                   full)
            prompt_hidden = static.backbone(cache, prompt, torch.arange(p), torch.arange(p),
                                            mask, kv_len)
            mask, kv_len = _window(static, cache, p, plan.size, plan.tree_mask, full)
            tree_hidden = static.backbone(cache, tokens, plan.depths + p,
                                          torch.arange(plan.size) + p, mask, kv_len)
            results[grouped_kv] = (prompt_hidden, tree_hidden, cache)
    for grouped, repeated in zip(results[way], results["repeat"], strict=True):
        if way == "sdpa":
            assert torch.equal(grouped, repeated)
        else:
            torch.testing.assert_close(grouped, repeated)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("way", GROUPED_KV_WAYS)
def test_a_batch_equals_each_sequence_alone(rt, kv_heads, way):
    """The batch forward (batched greedy generation): rows with their own positions and masks,
    a prompt forward then a tree step at once, equal each row run alone on a sequence cache;
    each row alone runs with the keys and values repeated per query head (transformers' way),
    the batch with each way of grouped-query attention."""
    model = _llama(kv_heads, "smollm2_theta", seed=1)
    static = StaticLlama(model)
    static.grouped_kv = way
    rng = np.random.default_rng(10 + kv_heads)
    rows, p = 3, 20
    prompts = torch.tensor(rng.integers(0, 96, size=(rows, p)))
    starts = torch.tensor([0, 3, 7])  # each row's positions start here (as a left-padded row's)
    tree = rt.random_tree(rng, 6, depth=3, topk=3)
    plan = tree_plan(tree, 3)
    tokens = torch.tensor(rng.integers(0, 96, size=(rows, plan.size)))
    causal = torch.ones(p, p, dtype=torch.bool).tril()
    step_mask = torch.ones(plan.size, p + plan.size, dtype=torch.bool)
    step_mask[:, p:] = plan.tree_mask
    # each row attends to a different part of its past (a padded row's slots are masked out)
    hidden_from = torch.tensor([0, 2, 5])
    with torch.inference_mode():
        batch_cache = static.new_cache(p + plan.size, batch=rows)
        assert batch_cache.shape == (2, 2, rows, kv_heads, p + plan.size, static.head_dim)
        prompt_mask = causal & (torch.arange(p) >= hidden_from[:, None])[:, None, :]
        prompt_mask |= torch.eye(p, dtype=torch.bool)
        positions = starts[:, None] + torch.arange(p)
        batch_prompt = static.backbone(batch_cache, prompts, positions, torch.arange(p),
                                       prompt_mask, p)
        tree_mask = step_mask & (torch.arange(p + plan.size) >= hidden_from[:, None])[:, None]
        batch_tree = static.backbone(batch_cache, tokens, plan.depths + positions[:, -1:] + 1,
                                     torch.arange(plan.size) + p, tree_mask, p + plan.size)
        assert batch_tree.shape == (rows, plan.size, static.hidden_size)
        static.grouped_kv = "repeat"
        for row in range(rows):
            cache = static.new_cache(p + plan.size)
            alone = static.backbone(cache, prompts[row], positions[row], torch.arange(p),
                                    prompt_mask[row], p)
            torch.testing.assert_close(batch_prompt[row], alone, rtol=1e-5, atol=1e-5)
            alone = static.backbone(cache, tokens[row], plan.depths + positions[row, -1] + 1,
                                    torch.arange(plan.size) + p, tree_mask[row], p + plan.size)
            torch.testing.assert_close(batch_tree[row], alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(batch_cache[:, :, row], cache, rtol=1e-5, atol=1e-5)


def test_weights_are_shared_by_reference(rt):
    model = rt.sharp_llama(1)
    static = StaticLlama(model)
    assert static.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    assert static.inv_freq.data_ptr() == model.model.rotary_emb.inv_freq.data_ptr()


def test_unsupported_models_say_why():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    assert "model type 'gpt2'" in static_support(model)
    dynamic = _llama(2, "default")
    dynamic.model.rotary_emb.rope_type = "dynamic"
    assert "dynamic" in static_support(dynamic)
    capped = _llama(2, "default")
    capped.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in static_support(capped)


def test_sliding_window_models_are_refused_by_the_static_runtime_itself():
    """A window shorter than the context changes attention: every entry to the static
    runtime refuses it (not only the decoder's earlier check); no window, or one switched off,
    runs."""
    import transformers

    from entmtp.runtime import autoregressive_engine

    def mistral(**window):
        config = transformers.MistralConfig(
            vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, **window)
        return transformers.MistralForCausalLM(config).eval()

    windowed = mistral(sliding_window=8)
    assert "sliding-window" in static_support(windowed)
    with pytest.raises(EntmtpError, match="sliding-window"):
        StaticLlama(windowed)
    with pytest.raises(EntmtpError, match="sliding-window"):
        autoregressive_engine(windowed)
    assert static_support(mistral(sliding_window=None)) is None
    qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
        use_sliding_window=False)).eval()
    assert static_support(qwen) is None


def test_compaction_equals_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(30):
        past, q, depth = int(rng.integers(0, 6)), int(rng.integers(1, 9)), int(rng.integers(0, 4))
        cache = torch.randn(2, 2, 3, past + q + 3, 4)
        # an increasing node path from the root, padded with arbitrary nodes
        length = int(rng.integers(1, min(depth, q - 1) + 2))
        path = [0, *sorted(rng.choice(np.arange(1, q), size=length - 1, replace=False).tolist())]
        padded = path + rng.integers(0, q, size=depth + 1 - length).tolist() \
            if len(path) <= depth + 1 else path
        padded = torch.tensor(padded[: max(depth + 1, length)])
        expected = cache.clone()
        expected[:, :, :, past : past + length] = cache[:, :, :, [past + n for n in path]]
        compact_static_cache(cache, torch.tensor(past), padded, torch.arange(len(padded)))
        torch.testing.assert_close(cache[..., : past + length, :],
                                   expected[..., : past + length, :], rtol=0, atol=0)


def test_batched_compaction_compacts_each_row_at_its_own_past():
    """Rows at different past lengths with different paths: each row as the one-row
    compaction moves it (bitwise), the other rows untouched."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        rows, q, depth = int(rng.integers(1, 5)), int(rng.integers(2, 9)), 3
        pasts = rng.integers(0, 6, size=rows)
        cache = torch.randn(2, 2, rows, 3, int(pasts.max()) + q + 3, 4)
        paths = []
        for _row in range(rows):
            length = int(rng.integers(1, min(depth, q - 1) + 2))
            path = [0, *sorted(rng.choice(np.arange(1, q), size=length - 1,
                                          replace=False).tolist())]
            paths.append(path + [0] * (depth + 1 - len(path)))
        expected = cache.clone()
        for row in range(rows):
            compact_static_cache(expected[:, :, row], torch.tensor(int(pasts[row])),
                                 torch.tensor(paths[row]), torch.arange(depth + 1))
        compact_static_cache(cache, torch.tensor(pasts), torch.tensor(paths),
                             torch.arange(depth + 1))
        assert torch.equal(cache, expected)


def test_per_row_slots_write_and_read_each_row_at_its_own_past(rt):
    """A batch whose rows sit at different past lengths (slots [batch, q]) gives each row's
    hidden states and cache as the row alone at its own slots."""
    model = rt.sharp_llama(4)
    static = StaticLlama(model)
    rng = np.random.default_rng(2)
    lengths = [5, 2, 9]
    tree = rt.random_tree(rng, 6, depth=3, topk=3)
    plan = tree_plan(tree, 3)
    capacity = max(lengths) + plan.size
    tokens = torch.tensor(rng.integers(0, 96, size=(len(lengths), plan.size)))
    with torch.inference_mode():
        batch_cache = static.new_cache(capacity, batch=len(lengths))
        alone_caches = []
        for row, length in enumerate(lengths):
            prompt = torch.tensor(rng.integers(0, 96, size=length))
            positions = torch.arange(length)
            causal = torch.ones(length, length, dtype=torch.bool).tril()
            static.backbone(batch_cache[:, :, row], prompt, positions, positions, causal, length)
            alone = static.new_cache(capacity)
            static.backbone(alone, prompt, positions, positions, causal, length)
            alone_caches.append(alone)
        past = torch.tensor(lengths)
        columns = torch.arange(capacity)
        relative = columns[None] - past[:, None]
        tree_part = plan.tree_mask[:, relative.clamp(0, plan.size - 1)].transpose(0, 1)
        mask = (relative < 0)[:, None] | (tree_part & ((relative >= 0)
                                                      & (relative < plan.size))[:, None])
        slots = torch.arange(plan.size) + past[:, None]
        hidden = static.backbone(batch_cache, tokens, plan.depths + past[:, None], slots, mask,
                                 None)
        for row, length in enumerate(lengths):
            alone = static.backbone(alone_caches[row], tokens[row], plan.depths + length,
                                    torch.arange(plan.size) + length, mask[row], None)
            torch.testing.assert_close(hidden[row], alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(batch_cache[:, :, row, ..., : length + plan.size, :],
                                       alone_caches[row][..., : length + plan.size, :],
                                       rtol=1e-5, atol=1e-5)


def test_cpu_linears_keep_the_row_kernels(rt, monkeypatch):
    import entmtp.model._row_gemm as row_gemm

    model = rt.sharp_llama(2)
    linears = row_gemm.use_row_kernels(model)
    calls = []
    real = row_gemm.project_rows

    def counting(features, weight, bias, **kwargs):
        calls.append((features.shape[-2], kwargs.get("reused")))
        return real(features, weight, bias, **kwargs)

    monkeypatch.setattr(row_gemm, "project_rows", counting)
    static = StaticLlama(model)
    cache = static.new_cache(16)
    with torch.inference_mode():
        hidden = static.backbone(cache, torch.tensor([5, 6, 7]), torch.arange(3),
                                 torch.arange(3), torch.ones(3, 3, dtype=torch.bool).tril(), 3)
        static.logits(hidden)
    assert linears == 7 * len(static.layers) + 1 and calls == [(3, True)] * linears


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_other_llama_block_families_equal_transformers(rt, family):
    import transformers

    config_class = {"mistral": transformers.MistralConfig, "qwen2": transformers.Qwen2Config}
    model_class = {"mistral": transformers.MistralForCausalLM,
                   "qwen2": transformers.Qwen2ForCausalLM}
    config = config_class[family](vocab_size=96, hidden_size=48, intermediate_size=80,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=256,
                                  sliding_window=None, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_class[family](config).eval()
    assert static_support(model) is None
    static = StaticLlama(model)
    rng = np.random.default_rng(1)
    prompt = torch.tensor(rng.integers(0, 96, size=20))
    plan = tree_plan(rt.random_tree(rng, 8, depth=3, topk=4), 4)
    tokens = torch.tensor(rng.integers(0, 96, size=plan.size))
    with torch.inference_mode():
        eager_cache = new_cache(model)
        forward_tokens(model, eager_cache, prompt[None])
        _, reference = tree_forward(model, eager_cache, plan, tokens, len(prompt),
                                    dtype=torch.float32)
        cache = static.new_cache(64)
        p = len(prompt)
        static.backbone(cache, prompt, torch.arange(p), torch.arange(p),
                        torch.ones(p, p, dtype=torch.bool).tril(), p)
        mask, kv_len = _window(static, cache, p, plan.size, plan.tree_mask, False)
        hidden = static.backbone(cache, tokens, plan.depths + p, torch.arange(plan.size) + p,
                                 mask, kv_len)
        torch.testing.assert_close(static.logits(hidden), reference, rtol=1e-5, atol=1e-5)


def test_the_grouped_kv_way_is_the_measured_choice_unless_set():
    """docs/hardware.md, "Grouped key/value heads": on the CPU SDPA's own grouped heads, but the
    fold for a float32 batch; a way that is set serves every forward."""
    for dtype, sequence, batch in ((torch.float32, "sdpa", "fold"),
                                   (torch.bfloat16, "sdpa", "sdpa")):
        static = StaticLlama(_llama(2, "default").to(dtype))
        assert (static.grouped_kv_way(False), static.grouped_kv_way(True)) == (sequence, batch)
        static.grouped_kv = "repeat"
        assert static.grouped_kv_way(False) == static.grouped_kv_way(True) == "repeat"


def test_the_chosen_way_is_the_one_that_runs(monkeypatch):
    model = _llama(2, "default")
    static = StaticLlama(model)
    seen = []
    real = StaticLlama._attend

    def spy(self, queries, keys, values, mask, way):
        seen.append(way)
        return real(self, queries, keys, values, mask, way)

    monkeypatch.setattr(StaticLlama, "_attend", spy)
    with torch.inference_mode():
        static.backbone(static.new_cache(8), torch.tensor([5, 6]), torch.arange(2),
                        torch.arange(2), torch.ones(2, 2, dtype=torch.bool).tril(), 2)
        static.backbone(static.new_cache(8, batch=2), torch.tensor([[5], [6]]),
                        torch.zeros(2, 1, dtype=torch.int64), torch.arange(1), None, 1)
    layers = len(static.layers)
    assert seen == ["sdpa"] * layers + ["fold"] * layers
