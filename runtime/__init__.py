"""entmtp.runtime: live tree-attention speculative decoding (PyTorch).

Names are imported on first use, so ``import entmtp.runtime`` does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "SpeculativeDecoder": "._decode",
    "DecodeResult": "._decode",
    "StepLog": "._decode",
    "autoregressive_generate": "._decode",
    "StaticScheduler": "._scheduler",
    "BundleScheduler": "._scheduler",
    "profile_latency": "._latency_profile",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
