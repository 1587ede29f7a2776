"""entmtp.evaluation: measuring the runtime. Step-latency profiling (the latency model of a
model and its heads on this machine), the profile of live greedy trajectories, live validation
against the exact replay, the prediction check, departures from plain decoding, and the
benchmark with its paired statistics. Depends on core, treesearch, model and runtime.

Names are imported on first use, so ``import entmtp.evaluation`` does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "AUTOREGRESSIVE": "._benchmark",
    "BEST_STATIC": "._benchmark",
    "BundleArm": "._benchmark",
    "REFERENCE": "._benchmark",
    "REFERENCE_ROWS": "._benchmark",
    "REFERENCE_TREE": "._benchmark",
    "bench_methods": "._benchmark",
    "bench_rows": "._benchmark",
    "bundle_prediction": "._benchmark",
    "profile_per_head_set": "._benchmark",
    "speedup_interval": "._benchmark",
    "torch_threads": "._benchmark",
    "NEAR_TIE_ULPS": "._departures",
    "check_departure": "._departures",
    "budget_tree": "._latency_profile",
    "fixed_context_steps": "._latency_profile",
    "hardware_info": "._latency_profile",
    "profile_latency": "._latency_profile",
    "run_record": "._latency_profile",
    "trimmed_mean": "._latency_profile",
    "describe_hardware": "._measure",
    "load_for_latency": "._measure",
    "measure_latency": "._measure",
    "DRIFT_LIMIT": "._prediction",
    "OracleBound": "._prediction",
    "PredictionCheck": "._prediction",
    "check_heads_fit": "._trajectory_profile",
    "profile_meta": "._trajectory_profile",
    "profile_trajectories": "._trajectory_profile",
    "trajectory_traces": "._trajectory_profile",
    "EncodedPrompt": "._validation",
    "MethodRuns": "._validation",
    "RATE_DEFINITION": "._validation",
    "RunProgress": "._validation",
    "autoregressive_method": "._validation",
    "bundle_topk": "._validation",
    "capture_line": "._validation",
    "check_replay": "._validation",
    "profile_live_trajectories": "._validation",
    "ratio": "._validation",
    "run_side_by_side": "._validation",
    "runtime_report": "._validation",
    "speculative_method": "._validation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
