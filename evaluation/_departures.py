"""Where a speculative decoder's greedy output first departs from plain greedy decoding, and
whether a near-tie of the plain decoder's top logits explains it.

In float32 greedy tree verification is token-identical to plain greedy decoding. In bf16 / fp16
a batched tree forward and a one-token forward accumulate their sums in different orders and
round differently, so where the plain decoder's two best tokens are nearly tied the verifier may
pick the other one; from there on the outputs differ. Such a departure is not a bug in the
verification. A departure where the plain decoder's choice was clear is one.

The test: at the first position where the outputs differ, take the plain decoder's logits there
(``plain_greedy_logits``, one token per forward over a KV cache as plain greedy decoding runs,
in the model's dtype) and the gap ``logit[plain token] - logit[decoded token]``. The departure
is a near-tie when that gap is at most ``NEAR_TIE_ULPS`` units of the dtype's resolution at the
top logit: ``ulp = 2**floor(log2|top logit|) * finfo(dtype).eps`` (the spacing of representable
values there; bf16 keeps 8 significant bits, fp16 11, fp32 24), so the margin scales with the
logits and the dtype. The logits themselves are rounded to that spacing, and the hidden state
they are projected from carries the rounding of every layer before; ``NEAR_TIE_ULPS = 8``
allows a few units of accumulated rounding on each of the two logits and is still far below
the gaps of clear choices (tens to thousands of units).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from entmtp.core import EntmtpError, dtype_name
from entmtp.model import cache_keyword

# How many units of the dtype's resolution at the top logit a departure's gap may be.
NEAR_TIE_ULPS = 8.0


@dataclass(frozen=True)
class Departure:
    """The first position where a decoded output differs from plain greedy decoding."""

    position: int  # index among the generated tokens (0: the prefill's token)
    plain_token: int  # plain greedy decoding's token there
    decoded_token: int  # the decoder's token there
    top1_token: int  # argmax of the plain decoder's logits there (== plain_token unless
    #                  the recomputed logits round differently from the reference run)
    top2_token: int  # the runner-up
    top1_logit: float
    gap_top2: float  # top-1 logit minus top-2 logit
    gap_decoded: float  # top-1 logit minus the decoded token's logit (>= gap_top2)
    ulp: float  # the dtype's resolution at the top-1 logit
    dtype: str
    near_tie: bool  # gap_decoded <= NEAR_TIE_ULPS * ulp

    @property
    def gap_decoded_ulps(self) -> float:
        return self.gap_decoded / self.ulp

    @property
    def gap_top2_ulps(self) -> float:
        return self.gap_top2 / self.ulp

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gap_decoded_ulps": self.gap_decoded_ulps,
                "gap_top2_ulps": self.gap_top2_ulps, "margin_ulps": NEAR_TIE_ULPS}


def first_departure(decoded: Sequence[int], plain: Sequence[int]) -> int | None:
    """Index of the first token where ``decoded`` and ``plain`` differ; None when equal.

    Both must come from the same ``max_new_tokens``, so that neither is a proper prefix of the
    other (an EOS in one of them is itself a differing token).
    """
    for index, (a, b) in enumerate(zip(decoded, plain, strict=False)):
        if int(a) != int(b):
            return index
    if len(decoded) != len(plain):
        raise EntmtpError(
            f"outputs of {len(decoded)} and {len(plain)} tokens agree on all shared tokens: "
            "decode both with the same max_new_tokens"
        )
    return None


def dtype_ulp(value: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype``'s representable numbers at ``|value|`` (its normal range)."""
    info = torch.finfo(dtype)
    magnitude = max(abs(float(value)), info.tiny)
    return math.ldexp(float(info.eps), math.floor(math.log2(magnitude)))


@torch.inference_mode()
def plain_greedy_logits(
    model: torch.nn.Module, prompt_ids: Sequence[int], plain_tokens: Sequence[int], position: int
) -> torch.Tensor:
    """[vocab] float32 logits plain greedy decoding chooses generated token ``position`` from.

    Runs as plain greedy decoding does, in the model's dtype on its device: the prompt in one
    forward, then ``plain_tokens[:position]`` one token per forward over a KV cache (transformers'
    own forward and ``DynamicCache``, independent of entmtp's runtime).
    """
    from transformers.cache_utils import DynamicCache

    if not 0 <= position <= len(plain_tokens):
        raise EntmtpError(f"position {position} is outside the {len(plain_tokens)} tokens")
    device = model.get_output_embeddings().weight.device
    cache = {cache_keyword(model): DynamicCache(config=model.config)}
    ids = torch.tensor([list(prompt_ids)], dtype=torch.int64, device=device)
    logits = model(input_ids=ids, use_cache=True, **cache).logits[0, -1]
    for token in plain_tokens[:position]:
        step = torch.tensor([[int(token)]], dtype=torch.int64, device=device)
        logits = model(input_ids=step, use_cache=True, **cache).logits[0, -1]
    return logits.float().cpu()


def explain_departure(
    logits: torch.Tensor, *, position: int, plain_token: int, decoded_token: int,
    dtype: torch.dtype,
) -> Departure:
    """The departure at ``position`` judged on the plain decoder's ``logits`` [vocab] there."""
    values = logits.float()
    top1_token = int(values.argmax())  # the first of tied maxima, as greedy decoding picks
    others = values.clone()
    others[top1_token] = -math.inf
    top2_token = int(others.argmax())
    top1, top2 = float(values[top1_token]), float(values[top2_token])
    ulp = dtype_ulp(top1, dtype)
    gap_decoded = top1 - float(values[int(decoded_token)])
    return Departure(
        position=int(position), plain_token=int(plain_token), decoded_token=int(decoded_token),
        top1_token=top1_token, top2_token=top2_token, top1_logit=top1,
        gap_top2=top1 - top2, gap_decoded=gap_decoded, ulp=ulp,
        dtype=dtype_name(dtype),
        near_tie=gap_decoded <= NEAR_TIE_ULPS * ulp,
    )


def check_departure(
    model: torch.nn.Module, prompt_ids: Sequence[int], decoded: Sequence[int],
    plain: Sequence[int],
) -> Departure | None:
    """The first departure of ``decoded`` from ``plain`` (both greedy outputs of ``prompt_ids``
    in the model's dtype) with its near-tie verdict; None when they are identical."""
    position = first_departure(decoded, plain)
    if position is None:
        return None
    logits = plain_greedy_logits(model, prompt_ids, plain, position)
    dtype = model.get_output_embeddings().weight.dtype
    return explain_departure(logits, position=position, plain_token=plain[position],
                             decoded_token=decoded[position], dtype=dtype)
