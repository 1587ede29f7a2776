"""KV-cache handling for tree verification on a transformers ``DynamicCache``.

A verification forward appends all ``q`` tree tokens to the cache; afterwards only the accepted
path's entries may stay. ``compact_cache`` moves them down to sit right after the past and drops
the rest, layer by layer, without a second forward.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from entmtp.core import EntmtpError


def new_cache(model: torch.nn.Module) -> DynamicCache:
    return DynamicCache(config=model.config)


def check_cache(cache: DynamicCache) -> None:
    """Raise ``EntmtpError`` unless every layer keeps the full history (compaction needs it)."""
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, DynamicSlidingWindowLayer) or not isinstance(layer, DynamicLayer):
            raise EntmtpError(
                f"KV-cache layer {index} is a {type(layer).__name__}: tree decoding needs full "
                "attention layers (DynamicLayer); use a model without sliding-window or linear "
                "attention layers"
            )


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def truncate_cache(cache: DynamicCache, length: int) -> None:
    """Drop every entry at position ``>= length``."""
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)


def compact_cache(cache: DynamicCache, past_len: int, keep: list[int]) -> None:
    """Keep the tree entries ``past_len + keep`` (ascending node indices) right after the past.

    ``keep`` lists the accepted path's nodes; entries at ``past_len + i`` for other tree nodes
    are dropped. When the path is already contiguous from the root nothing moves.
    """
    kept = len(keep)
    if kept and keep[-1] != kept - 1:
        device = cache.layers[0].keys.device
        source = torch.tensor(keep, dtype=torch.int64, device=device) + past_len
        for layer in cache.layers:
            if not layer.is_initialized:
                continue
            # index_select copies first, so overlapping source/target rows are safe.
            layer.keys[..., past_len : past_len + kept, :] = layer.keys.index_select(-2, source)
            layer.values[..., past_len : past_len + kept, :] = layer.values.index_select(-2, source)
    truncate_cache(cache, past_len + kept)
