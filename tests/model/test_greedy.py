"""The one greedy generation loop against a plain reference (one sequence at a time, a full
forward over the whole prefix at each step, argmax), on tiny random models of three families:
batched equals unbatched, the EOS cut is inclusive, and no autograd graph is kept."""

from __future__ import annotations

import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.model import _greedy
from entmtp.model._greedy import greedy_generate, greedy_steps, static_greedy_steps
from support import make_tiny_llama

VOCAB = 96


def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random causal LM with an untied, scaled-up lm_head, so that greedy decoding does
    not echo one token and position or padding mistakes show."""
    import transformers

    torch.manual_seed(seed)
    if family == "llama":
        model = make_tiny_llama(seed, vocab_size=VOCAB)
        model.config.tie_word_embeddings = False
    elif family == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            tie_word_embeddings=False)).eval()
    else:  # an architecture the static runtime cannot run: learned absolute positions
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256,
            tie_word_embeddings=False)).eval()
    weight = torch.randn(VOCAB, 32, generator=torch.Generator().manual_seed(seed)) * 2.0
    model.get_output_embeddings().weight = torch.nn.Parameter(weight)
    return model


@torch.no_grad()
def reference(model, prompt: list[int], max_new_tokens: int, eos: set[int]):
    """One sequence, no cache: the full forward over the whole prefix at each step, argmax."""
    ids, tokens, hiddens = list(prompt), [], []
    while len(tokens) < max_new_tokens:
        hiddens.append(model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0, -1])
        token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        tokens.append(token)
        ids.append(token)
        if token in eos:
            break
    return tokens, torch.stack(hiddens)


PROMPTS = [[5, 17, 42, 9, 33, 71], [3], [60, 61, 62], [88, 2, 14, 14, 50, 7, 19, 23, 40], [11, 12]]
FAMILIES = ["llama", "qwen2", "gpt2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_generation_equals_the_plain_reference(family):
    model = tiny_model(family)
    batched = greedy_generate(model, PROMPTS, max_new_tokens=10, keep_hidden=True)
    for prompt, run in zip(PROMPTS, batched, strict=True):
        tokens, hidden = reference(model, prompt, 10, set())
        assert run.tokens == tokens
        torch.testing.assert_close(run.hidden, hidden, atol=1e-4, rtol=1e-4)
        alone = greedy_generate(model, [prompt], max_new_tokens=10, keep_hidden=True)[0]
        assert alone.tokens == run.tokens
        torch.testing.assert_close(alone.hidden, run.hidden, atol=1e-4, rtol=1e-4)
    assert len({tuple(run.tokens) for run in batched}) == len(PROMPTS)  # not a degenerate echo
    assert greedy_generate(model, PROMPTS[:1], max_new_tokens=10)[0].hidden is None


@pytest.mark.parametrize("family", FAMILIES)
def test_eos_ends_each_row_inclusively_and_the_batch_when_all_ended(family):
    model = tiny_model(family, seed=1)
    free = greedy_generate(model, PROMPTS, max_new_tokens=12, keep_hidden=True)
    assert all(len(run.tokens) == 12 for run in free)
    stop = free[0].tokens[3]
    cut = greedy_generate(model, PROMPTS, max_new_tokens=12, eos_token_ids=[stop, stop],
                          keep_hidden=True)
    for prompt, whole, run in zip(PROMPTS, free, cut, strict=True):
        end = whole.tokens.index(stop) + 1 if stop in whole.tokens else len(whole.tokens)
        assert run.tokens == whole.tokens[:end] == reference(model, prompt, 12, {stop})[0]
        torch.testing.assert_close(run.hidden, whole.hidden[:end], atol=1e-4, rtol=1e-4)
    assert len(cut[0].tokens) <= 4
    # every row ends on its first token: the batch stops after one step
    firsts = {run.tokens[0] for run in free}
    assert [len(run.tokens) for run in greedy_generate(
        model, PROMPTS, max_new_tokens=12, eos_token_ids=firsts)] == [1] * len(PROMPTS)


def test_steps_run_without_end_and_lengths_are_checked():
    model = tiny_model("llama", seed=2)
    steps = greedy_steps(model, [PROMPTS[0]])
    tokens = [int(next(steps).tokens[0]) for _ in range(15)]
    steps.close()
    assert tokens == reference(model, PROMPTS[0], 15, set())[0]
    assert len(greedy_generate(model, PROMPTS, max_new_tokens=1)[2].tokens) == 1
    with pytest.raises(EntmtpError, match="at least 1"):
        greedy_generate(model, PROMPTS, max_new_tokens=0)
    with pytest.raises(EntmtpError, match="empty prompt"):
        greedy_generate(model, [[1, 2], []], max_new_tokens=3)


def test_generation_keeps_no_autograd_graph():
    """Head-data generation calls this outside any no-grad block: with autograd on, every
    step's activations would stay alive for the whole batch (gigabytes on the real model)."""
    model = tiny_model("llama", seed=3)
    seen: list[bool] = []
    # the first layer's query projection runs once per forward in both loops (the static-shape
    # loop calls the layers' modules itself, not the decoder)
    hook = model.get_decoder().layers[0].self_attn.q_proj.register_forward_hook(
        lambda module, args, output: seen.append(torch.is_grad_enabled()))
    try:
        assert torch.is_grad_enabled()
        runs = greedy_generate(model, PROMPTS, max_new_tokens=4, keep_hidden=True)
        steps = greedy_steps(model, PROMPTS[:1])
        next(steps)
        next(steps)  # a resumed generator runs under inference mode too
        steps.close()
    finally:
        hook.remove()
    assert len(seen) == 4 + 2 and not any(seen)
    assert not any(run.hidden.requires_grad for run in runs)


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_family_models_generate_on_the_static_forward(family, monkeypatch):
    """greedy_generate runs the static-shape loop wherever the static forward runs the model,
    transformers' cached forward elsewhere; both give greedy_steps' positions."""
    model = tiny_model(family, seed=4)
    used = []
    for name in ("greedy_steps", "static_greedy_steps"):
        real = getattr(_greedy, name)
        monkeypatch.setattr(_greedy, name, lambda *a, _r=real, _n=name: used.append(_n) or _r(*a))
    runs = greedy_generate(model, PROMPTS, max_new_tokens=9, keep_hidden=True)
    assert used == ["greedy_steps" if family == "gpt2" else "static_greedy_steps"]
    if family == "gpt2":
        return
    steps = greedy_steps(model, PROMPTS)
    for position in range(9):
        step = next(steps)
        for row, run in enumerate(runs):
            assert run.tokens[position] == int(step.tokens[row])
            torch.testing.assert_close(run.hidden[position], step.hidden[row].float(),
                                       atol=1e-5, rtol=1e-5)
    steps.close()


def test_static_steps_stop_after_the_positions_they_were_sized_for():
    model = tiny_model("llama", seed=5)
    assert len(list(static_greedy_steps(model, PROMPTS, 4))) == 4
    with pytest.raises(EntmtpError, match="empty prompt"):
        next(static_greedy_steps(model, [[1, 2], []], 3))
