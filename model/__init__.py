"""entmtp.model: the model layer. Loading the base model (the default GGUF, a file, a folder, a
hub id) and draft heads (Medusa, Hydra) with their checkpoint formats, the packed CPU linear
kernel, greedy generation, the entropy and rank statistics, and the static Llama forward over a
preallocated cache. Depends on core and treesearch only.

Names are imported on first use, so ``import entmtp.model`` does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "BaseModel": "._base_model",
    "CHAT_END_TOKENS": "._base_model",
    "load_base_model": "._base_model",
    "model_fingerprint": "._base_model",
    "resolve_dtype": "._base_model",
    "cache_keyword": "._cache_keyword",
    "draft_vocab_coverage": "._draft_vocab",
    "frequent_tokens": "._draft_vocab",
    "target_token_counts": "._draft_vocab",
    "greedy_generate": "._greedy",
    "greedy_steps": "._greedy",
    "DraftHeads": "._heads",
    "HydraHeads": "._heads",
    "MIN_DRAFT_VOCAB": "._heads",
    "MedusaHeads": "._heads",
    "check_draft_vocab_size": "._heads",
    "check_heads_target": "._heads_format",
    "draft_columns": "._heads",
    "draft_projection_weight": "._heads",
    "draft_token_ids": "._heads",
    "draft_vocab_problem": "._heads",
    "load_heads": "._heads_load",
    "new_heads": "._heads",
    "read_heads_config": "._heads_load",
    "save_heads": "._heads_format",
    "unwrap_base": "._heads",
    "ENGINES": "._loading",
    "SHIPPED_HEADS": "._loading",
    "check_device": "._loading",
    "check_device_and_dtype": "._loading",
    "check_engine": "._loading",
    "check_head_type": "._loading",
    "load_base": "._loading",
    "load_heads_for": "._loading",
    "load_model_and_heads": "._loading",
    "quiet_transformers": "._loading",
    "resolve_dtype_name": "._loading",
    "resolve_heads": "._loading",
    "shipped_heads_path": "._loading",
    "random_model": "._random_model",
    "linear_kernel": "._row_gemm",
    "project_rows": "._row_gemm",
    "row_kernel": "._row_gemm",
    "GROUPED_KV_WAYS": "._static_model",
    "StaticLlama": "._static_model",
    "compact_static_cache": "._static_model",
    "static_support": "._static_model",
    "entropy_from_logits": "._stats",
    "topk_ranks": "._stats",
    "LOGIT_TRANSFORMS": "._support",
    "TREE_ATTENTION_IMPLEMENTATIONS": "._support",
    "attention_or_logits_problem": "._support",
    "check_tree_attention_support": "._support",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
