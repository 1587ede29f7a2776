"""entmtp.model: the model layer. Loading the base model (the default GGUF, a file, a folder,
a hub id) and draft heads (Medusa, Hydra) with their checkpoint formats, the packed CPU linear
kernel, greedy generation, the entropy and rank statistics, and the static Llama forward over a
preallocated cache.

Names are imported on first use, so ``import entmtp.model`` does not import torch.

Layer 3 of 7. Depends on core, treesearch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from entmtp.core import lazy_attributes

if TYPE_CHECKING:
    from ._base_model import (
        CHAT_END_TOKENS,
        BaseModel,
        load_base_model,
        model_fingerprint,
        resolve_dtype,
    )
    from ._cache_keyword import cache_keyword
    from ._draft_vocab import draft_vocab_coverage, frequent_tokens, target_token_counts
    from ._greedy import greedy_generate
    from ._heads import (
        DraftHeads,
        HydraHeads,
        MedusaHeads,
        check_draft_vocab_size,
        draft_columns,
        draft_projection_weight,
        draft_token_ids,
        new_heads,
        unwrap_base,
    )
    from ._heads_format import check_heads_target, save_heads
    from ._heads_load import load_heads, read_heads_config
    from ._loading import (
        SHIPPED_HEADS,
        check_device,
        check_device_and_dtype,
        check_device_name,
        check_engine,
        check_head_type,
        load_base,
        load_heads_for,
        load_model_and_heads,
        quiet_transformers,
        resolve_dtype_name,
        resolve_heads,
        shipped_heads_path,
    )
    from ._random_model import random_model
    from ._row_gemm import linear_kernel, project_rows, row_kernel
    from ._static_model import GROUPED_KV_WAYS, StaticLlama, compact_static_cache, static_support
    from ._stats import entropy_from_logits, topk_ranks
    from ._support import LOGIT_TRANSFORMS, check_tree_attention_support

__all__ = [
    "BaseModel",
    "load_base_model",
    "random_model",
    "DraftHeads",
    "MedusaHeads",
    "HydraHeads",
    "new_heads",
    "load_heads",
    "save_heads",
    "read_heads_config",
    "load_model_and_heads",
    "greedy_generate",
    "StaticLlama",
    "static_support",
    "entropy_from_logits",
    "topk_ranks",
]

# What entmtp's upper layers and bench scripts import from this package besides __all__: not a
# stable API.
_LAYER_API = [
    "check_device_name",
    "CHAT_END_TOKENS",
    "GROUPED_KV_WAYS",
    "LOGIT_TRANSFORMS",
    "SHIPPED_HEADS",
    "cache_keyword",
    "check_device",
    "check_device_and_dtype",
    "check_draft_vocab_size",
    "check_engine",
    "check_head_type",
    "check_heads_target",
    "check_tree_attention_support",
    "compact_static_cache",
    "draft_columns",
    "draft_projection_weight",
    "draft_token_ids",
    "draft_vocab_coverage",
    "frequent_tokens",
    "linear_kernel",
    "load_base",
    "load_heads_for",
    "model_fingerprint",
    "project_rows",
    "quiet_transformers",
    "resolve_dtype",
    "resolve_dtype_name",
    "resolve_heads",
    "row_kernel",
    "shipped_heads_path",
    "target_token_counts",
    "unwrap_base",
]

# module -> the names above it defines, imported on first use
_LAZY = {
    "._base_model": (
        "CHAT_END_TOKENS",
        "BaseModel",
        "load_base_model",
        "model_fingerprint",
        "resolve_dtype",
    ),
    "._cache_keyword": ("cache_keyword",),
    "._draft_vocab": ("draft_vocab_coverage", "frequent_tokens", "target_token_counts"),
    "._greedy": ("greedy_generate",),
    "._heads": (
        "DraftHeads",
        "HydraHeads",
        "MedusaHeads",
        "check_draft_vocab_size",
        "draft_columns",
        "draft_projection_weight",
        "draft_token_ids",
        "new_heads",
        "unwrap_base",
    ),
    "._heads_format": ("check_heads_target", "save_heads"),
    "._heads_load": ("load_heads", "read_heads_config"),
    "._loading": (
        "SHIPPED_HEADS",
        "check_device",
        "check_device_and_dtype",
        "check_device_name",
        "check_engine",
        "check_head_type",
        "load_base",
        "load_heads_for",
        "load_model_and_heads",
        "quiet_transformers",
        "resolve_dtype_name",
        "resolve_heads",
        "shipped_heads_path",
    ),
    "._random_model": ("random_model",),
    "._row_gemm": ("linear_kernel", "project_rows", "row_kernel"),
    "._static_model": ("GROUPED_KV_WAYS", "StaticLlama", "compact_static_cache", "static_support"),
    "._stats": ("entropy_from_logits", "topk_ranks"),
    "._support": ("LOGIT_TRANSFORMS", "check_tree_attention_support"),
}
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
