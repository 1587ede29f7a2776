"""entmtp.runtime: live tree-attention speculative decoding (PyTorch).

Names are imported on first use, so ``import entmtp.runtime`` does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "DecodeResult": "._records",
    "DecodingState": "._decode",
    "SpeculativeDecoder": "._decode",
    "StepLog": "._records",
    "autoregressive_engine": "._decode",
    "autoregressive_generate": "._decode",
    "autoregressive_static_engine": "._decode",
    "greedy_choice": "._decode",
    "compact_cache": "._kv_cache",
    "new_cache": "._kv_cache",
    "truncate_cache": "._kv_cache",
    "BundleScheduler": "._scheduler",
    "StaticScheduler": "._scheduler",
    "TreeStep": "._static_step",
    "forward_tokens": "._verify",
    "greedy_accept": "._verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
