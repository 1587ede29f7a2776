"""entmtp.calibrate: model + heads loading, task datasets, the profiler, head training.

Names are imported on first use, so ``import entmtp.calibrate`` does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "BaseModel": "._model",
    "load_base_model": "._model",
    "model_fingerprint": "._model",
    "resolve_dtype": "._model",
    "TASKS": "._tasks",
    "TaskPrompt": "._tasks",
    "load_prompts": "._tasks",
    "entropy_from_logits": "._stats",
    "topk_ranks": "._stats",
    "profile_prompts": "._profiler",
    "shard_prompts": "._profiler",
    "resolve_shard": "._profiler",
    "DraftHeads": "._heads",
    "MedusaHeads": "._heads",
    "HydraHeads": "._heads",
    "load_heads": "._heads",
    "new_heads": "._heads",
    "save_heads": "._heads",
    "train_heads": "._train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
