"""Greedy generation with a KV cache: the one loop behind the profiler, head training, head data
and the eager autoregressive baseline.

``greedy_steps`` runs a batch of prompts, left-padded, and yields per generated position each
row's greedy token and the final-norm hidden state whose logits chose it; it never stops on its
own, so a caller that times each step (``runtime._decode.autoregressive_generate`` on the eager
runtime) stops it where it likes. ``greedy_generate`` is the batched caller: each row up to and
including its first EOS token, at most ``max_new_tokens`` tokens. For a Llama-family model it
runs ``static_greedy_steps`` instead: the same positions on the runtime's static-shape forward
over a preallocated cache, since a transformers ``DynamicCache`` concatenates every layer's
whole cache at every step (on a 2-core CPU at batch 64, 60 % of a step's time).

Padded positions are masked out and the position ids count only a row's own tokens, so a row's
tokens are those of its prompt run alone (up to the float rounding of a wider batch's kernels);
the pad id itself is never attended to, so any id serves. A batch without padding (one prompt)
passes no mask and no positions: the model's plain cached forward. Everything runs under
``torch.inference_mode``: with autograd on, every step's activations would stay alive until the
batch ends (gigabytes for a batch of long generations on a real model).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from entmtp.core import EntmtpError

from ._cache_keyword import cache_keyword, returned_cache

_PAD_ID = 0  # any id: padded positions are masked out


@dataclass
class GreedyStep:
    """One generated position of every row."""

    tokens: Tensor  # [rows] int64, on the model's device: each row's greedy token
    hidden: Tensor  # [rows, hidden_size] model dtype: the final-norm state that chose it


@dataclass
class GreedyRun:
    """One row's generation."""

    tokens: list[int]  # up to and including the first EOS token, at most max_new_tokens
    hidden: Tensor | None  # [len(tokens), hidden_size] float32 on the CPU; None unless asked


@torch.inference_mode()
def greedy_steps(model: torch.nn.Module, prompts: Sequence[Sequence[int]]) -> Iterator[GreedyStep]:
    """Greedy continuations of ``prompts`` (token ids), one position per ``next``, without end.

    ``model`` is a transformers causal LM (``get_decoder``, ``get_output_embeddings``). The
    forward for position ``i + 1`` runs when the caller asks for it, on the tokens of ``i``.
    """
    decoder = model.get_decoder()
    lm_head = model.get_output_embeddings()
    device = model.get_input_embeddings().weight.device
    input_ids, filled, positions = _left_padded(prompts, device)
    rows, width = input_ids.shape
    mask = filled.long()
    # Without padding the mask is all ones and the positions count from 0: pass neither, so a
    # single prompt's step is exactly the runtime's plain forward (runtime._verify.forward_tokens)
    padded = any(len(prompt) < width for prompt in prompts)
    layout = {"attention_mask": mask, "position_ids": positions} if padded else {}
    cache_arg = cache_keyword(decoder)
    out = decoder(input_ids=input_ids, use_cache=True, **layout)
    while True:
        hidden = out.last_hidden_state[:, -1]  # [rows, hidden_size]
        tokens = lm_head(hidden).argmax(dim=-1)  # [rows]
        yield GreedyStep(tokens, hidden)
        if padded:
            mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
            positions = positions[:, -1:] + 1
            layout = {"attention_mask": mask, "position_ids": positions}
        out = decoder(input_ids=tokens[:, None], use_cache=True,
                      **{cache_arg: returned_cache(out)}, **layout)


def _left_padded(prompts: Sequence[Sequence[int]], device: torch.device
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """``prompts`` as one left-padded batch: token ids [rows, width] (``_PAD_ID`` in the
    padding), which slots hold a prompt token [rows, width] bool, and each slot's position id
    [rows, width] (a row counts only its own tokens)."""
    if not prompts or any(len(prompt) == 0 for prompt in prompts):
        raise EntmtpError("an empty prompt (or none) cannot be continued: drop it")
    rows, width = len(prompts), max(len(prompt) for prompt in prompts)
    input_ids = torch.full((rows, width), _PAD_ID, dtype=torch.int64, device=device)
    filled = torch.zeros((rows, width), dtype=torch.bool, device=device)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.as_tensor(prompt, dtype=torch.int64)
        filled[row, width - len(prompt):] = True
    positions = (filled.long().cumsum(-1) - 1).clamp(min=0)
    return input_ids, filled, positions


def batch_greedy_steps(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                       max_new_tokens: int) -> Iterator[GreedyStep]:
    """At least ``max_new_tokens`` greedy positions of ``prompts``: ``static_greedy_steps``
    where the static-shape forward runs ``model``, else ``greedy_steps``."""
    from ._static_model import static_support

    if static_support(model) is None:
        return static_greedy_steps(model, prompts, max_new_tokens)
    return greedy_steps(model, prompts)


@torch.inference_mode()
def static_greedy_steps(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                        max_new_tokens: int) -> Iterator[GreedyStep]:
    """``greedy_steps`` for a Llama-family ``model`` (``runtime._static_model.static_support``)
    over a cache preallocated for ``max_new_tokens`` positions; it stops after them.

    Row ``r``'s prompt sits left-padded in slots ``[width - len_r, width)``; generated position
    ``i`` is slot ``width + i`` in every row. A padded slot is never attended to, except by its
    own padded query in the prompt's forward (which would otherwise attend to nothing).
    """
    from ._static_model import StaticLlama

    net = StaticLlama(model)
    device = net.device
    input_ids, filled, positions = _left_padded(prompts, device)
    rows, width = input_ids.shape
    cache = net.new_cache(width + max_new_tokens, batch=rows)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    own = torch.eye(width, dtype=torch.bool, device=device)
    mask = causal & filled[:, None, :] | own  # [rows, width, width]
    slots = torch.arange(width, device=device)
    hidden = net.backbone(cache, input_ids, positions, slots, mask, width)[:, -1]
    # the steps' mask as an additive bias: SDPA's CPU kernel reads it faster than a bool mask
    bias = torch.zeros(rows, 1, width + max_new_tokens, dtype=net.dtype, device=device)
    bias[..., :width].masked_fill_(~filled[:, None], float("-inf"))  # [rows, 1, slots]
    last = positions[:, -1:]  # [rows, 1]
    for step in range(max_new_tokens):
        tokens = net.logits(hidden).argmax(dim=-1)  # [rows]
        yield GreedyStep(tokens, hidden)
        if step + 1 == max_new_tokens:
            return
        last = last + 1
        slot = width + step
        hidden = net.backbone(cache, tokens[:, None], last, slots.new_full((1,), slot),
                              bias[..., : slot + 1], slot + 1)[:, -1]


@torch.inference_mode()
def greedy_generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    keep_hidden: bool = False,
) -> list[GreedyRun]:
    """Greedy continuations of ``prompts`` in one batch, in order: each row up to and including
    its first EOS token, at most ``max_new_tokens``; with ``keep_hidden`` the hidden states too.

    The batch stops when every row has ended. Sort prompts by length before batching them:
    the batch pads every prompt to the longest.
    """
    if max_new_tokens < 1:
        raise EntmtpError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    stops = {int(token) for token in eos_token_ids}
    device = model.get_input_embeddings().weight.device
    eos = torch.tensor(sorted(stops), dtype=torch.int64, device=device)
    ended = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    columns: list[Tensor] = []  # [rows] per position
    hiddens: list[Tensor] = []  # [rows, hidden_size] per position
    steps = batch_greedy_steps(model, prompts, max_new_tokens)
    try:
        for step in steps:
            columns.append(step.tokens)
            if keep_hidden:
                hiddens.append(step.hidden.float().cpu())
            ended |= torch.isin(step.tokens, eos)
            if len(columns) == max_new_tokens or bool(ended.all()):
                break
    finally:
        steps.close()
    table = torch.stack(columns, dim=1).tolist()  # [rows, positions]
    stacked = torch.stack(hiddens, dim=1) if keep_hidden else None  # [rows, positions, hidden]
    runs = []
    for row, row_tokens in enumerate(table):
        kept = _through_first(row_tokens, stops)
        hidden = stacked[row, : len(kept)].clone() if stacked is not None else None
        runs.append(GreedyRun(kept, hidden))
    return runs


def _through_first(tokens: list[int], stops: set[int]) -> list[int]:
    """``tokens`` up to and including the first one in ``stops`` (all of them if none is)."""
    for position, token in enumerate(tokens):
        if token in stops:
            return tokens[: position + 1]
    return tokens
