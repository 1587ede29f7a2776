"""entmtp.runtime: live tree-attention speculative decoding (PyTorch): drafters, the eager and
static engines with their steps, the one decode loop, and the schedulers that pick each step's
tree.

Names are imported on first use, so ``import entmtp.runtime`` does not import torch.

Layer 4 of 7. Depends on core, treesearch, model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from entmtp.core import lazy_attributes

if TYPE_CHECKING:
    from ._decode import (
        DecodingState,
        SpeculativeDecoder,
        autoregressive_engine,
        autoregressive_generate,
        autoregressive_generate_batch,
        autoregressive_static_engine,
        greedy_choice,
    )
    from ._drafter import TreeDrafter
    from ._engine import Engine
    from ._kv_cache import compact_cache, new_cache, truncate_cache
    from ._loop import decode, decode_batch
    from ._records import BatchDecodeResult, DecodeResult, StepLog
    from ._scheduler import BundleScheduler, Scheduler, StaticScheduler
    from ._static_step import StaticEngine, TreeStep
    from ._verify import forward_tokens, greedy_accept

__all__ = [
    "SpeculativeDecoder",
    "DecodeResult",
    "StepLog",
    "Scheduler",
    "StaticScheduler",
    "BundleScheduler",
    "autoregressive_generate",
    "autoregressive_engine",
    "StaticEngine",
    "TreeDrafter",
    "Engine",
    "decode",
    "decode_batch",
    "BatchDecodeResult",
    "autoregressive_generate_batch",
]

# What entmtp's upper layers and bench scripts import from this package besides __all__: not a
# stable API.
_LAYER_API = [
    "DecodingState",
    "TreeStep",
    "autoregressive_static_engine",
    "compact_cache",
    "forward_tokens",
    "greedy_accept",
    "greedy_choice",
    "new_cache",
    "truncate_cache",
]

# module -> the names above it defines, imported on first use
_LAZY = {
    "._decode": (
        "DecodingState",
        "SpeculativeDecoder",
        "autoregressive_engine",
        "autoregressive_generate",
        "autoregressive_generate_batch",
        "autoregressive_static_engine",
        "greedy_choice",
    ),
    "._drafter": ("TreeDrafter",),
    "._engine": ("Engine",),
    "._kv_cache": ("compact_cache", "new_cache", "truncate_cache"),
    "._loop": ("decode", "decode_batch"),
    "._records": ("BatchDecodeResult", "DecodeResult", "StepLog"),
    "._scheduler": ("BundleScheduler", "Scheduler", "StaticScheduler"),
    "._static_step": ("StaticEngine", "TreeStep"),
    "._verify": ("forward_tokens", "greedy_accept"),
}
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
