"""entmtp.runtime: live tree-attention speculative decoding (PyTorch).

Names are imported on first use, so ``import entmtp.runtime`` does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "SpeculativeDecoder": "._decode",
    "DecodeResult": "._decode",
    "StepLog": "._decode",
    "autoregressive_generate": "._decode",
    "autoregressive_engine": "._decode",
    "StaticScheduler": "._scheduler",
    "BundleScheduler": "._scheduler",
    "profile_latency": "._latency_profile",
    "hardware_info": "._latency_profile",
    "run_record": "._latency_profile",
    "budget_tree": "._latency_profile",
    "fixed_context_steps": "._latency_profile",
    "trimmed_mean": "._latency_profile",
    # the pieces one decoding step is made of, for benchmarks of them
    "StaticLlama": "._static_model",
    "GROUPED_KV_WAYS": "._static_model",
    "static_support": "._static_model",
    "compact_cache": "._kv_cache",
    "new_cache": "._kv_cache",
    "truncate_cache": "._kv_cache",
    "forward_tokens": "._verify",
    "greedy_accept": "._verify",
    "NEAR_TIE_ULPS": "._departures",
    "check_departure": "._departures",
    # live validation: side-by-side runs and the live-versus-replay checks
    "RATE_DEFINITION": "._validation",
    "EncodedPrompt": "._validation",
    "MethodRuns": "._validation",
    "RunProgress": "._validation",
    "autoregressive_method": "._validation",
    "bundle_topk": "._validation",
    "check_replay": "._validation",
    "profile_live_trajectories": "._validation",
    "ratio": "._validation",
    "run_side_by_side": "._validation",
    "runtime_report": "._validation",
    "capture_line": "._validation",
    "speculative_method": "._validation",
    "OracleBound": "._prediction",
    "PredictionCheck": "._prediction",
    "DRIFT_LIMIT": "._prediction",
    # entmtp bench's arms and rows
    "AUTOREGRESSIVE": "._benchmark",
    "BEST_STATIC": "._benchmark",
    "REFERENCE": "._benchmark",
    "REFERENCE_ROWS": "._benchmark",
    "REFERENCE_TREE": "._benchmark",
    "BundleArm": "._benchmark",
    "bench_methods": "._benchmark",
    "bench_rows": "._benchmark",
    "bundle_prediction": "._benchmark",
    "speedup_interval": "._benchmark",
    "profile_per_head_set": "._benchmark",
    "torch_threads": "._benchmark",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
