"""entmtp.evaluation: measuring the runtime. Step-latency profiling (the latency model of a
model and its heads on this machine), the profile of greedy trajectories (entropy and head ranks
per position), live validation against the exact replay, the prediction check, departures from
plain decoding, and the benchmark with its paired statistics.

Names are imported on first use, so ``import entmtp.evaluation`` does not import torch.

Layer 5 of 7. Depends on core, treesearch, model, runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from entmtp.core import lazy_attributes

if TYPE_CHECKING:
    from ._batch_bench import SweepAtSize, run_batch_sweep, sweep_measured_runs
    from ._benchmark import (
        AUTOREGRESSIVE,
        BEST_STATIC,
        REFERENCE,
        REFERENCE_ROWS,
        REFERENCE_TREE,
        BundleArm,
        bench_methods,
        bench_rows,
        bundle_prediction,
        profile_per_head_set,
        speedup_interval,
        torch_threads,
    )
    from ._departures import NEAR_TIE_ULPS, check_departure
    from ._latency_profile import (
        budget_tree,
        fixed_context_steps,
        profile_latency,
        run_record,
        trimmed_mean,
    )
    from ._measure import load_for_latency, measure_batch_latency, measure_latency
    from ._paired import paired_ratio_interval
    from ._prediction import DRIFT_LIMIT, OracleBound, PredictionCheck, check_prediction
    from ._selftest import run_selftest
    from ._trajectory_profile import (
        check_heads_fit,
        profile_meta,
        profile_trajectories,
        trajectory_traces,
    )
    from ._validation import (
        RATE_DEFINITION,
        EncodedPrompt,
        MethodRuns,
        RunProgress,
        autoregressive_method,
        bundle_topk,
        capture_line,
        check_replay,
        profile_live_trajectories,
        quartiles,
        ratio,
        run_side_by_side,
        runtime_report,
        speculative_method,
    )

__all__ = [
    "profile_latency",
    "measure_latency",
    "measure_batch_latency",
    "profile_trajectories",
    "run_side_by_side",
    "MethodRuns",
    "check_replay",
    "check_prediction",
    "PredictionCheck",
    "bench_methods",
    "bench_rows",
    "BundleArm",
    "run_batch_sweep",
    "check_departure",
    "paired_ratio_interval",
]

# What entmtp's upper layers and bench scripts import from this package besides __all__: not a
# stable API.
_LAYER_API = [
    "SweepAtSize",
    "sweep_measured_runs",
    "quartiles",
    "AUTOREGRESSIVE",
    "BEST_STATIC",
    "DRIFT_LIMIT",
    "EncodedPrompt",
    "NEAR_TIE_ULPS",
    "OracleBound",
    "RATE_DEFINITION",
    "REFERENCE",
    "REFERENCE_ROWS",
    "REFERENCE_TREE",
    "RunProgress",
    "autoregressive_method",
    "budget_tree",
    "bundle_prediction",
    "bundle_topk",
    "capture_line",
    "check_heads_fit",
    "fixed_context_steps",
    "load_for_latency",
    "profile_live_trajectories",
    "profile_meta",
    "profile_per_head_set",
    "ratio",
    "run_record",
    "run_selftest",
    "runtime_report",
    "speculative_method",
    "speedup_interval",
    "torch_threads",
    "trajectory_traces",
    "trimmed_mean",
]

# module -> the names above it defines, imported on first use
_LAZY = {
    "._batch_bench": ("SweepAtSize", "run_batch_sweep", "sweep_measured_runs"),
    "._benchmark": (
        "AUTOREGRESSIVE",
        "BEST_STATIC",
        "REFERENCE",
        "REFERENCE_ROWS",
        "REFERENCE_TREE",
        "BundleArm",
        "bench_methods",
        "bench_rows",
        "bundle_prediction",
        "profile_per_head_set",
        "speedup_interval",
        "torch_threads",
    ),
    "._departures": ("NEAR_TIE_ULPS", "check_departure"),
    "._latency_profile": (
        "budget_tree",
        "fixed_context_steps",
        "profile_latency",
        "run_record",
        "trimmed_mean",
    ),
    "._measure": ("load_for_latency", "measure_batch_latency", "measure_latency"),
    "._paired": ("paired_ratio_interval",),
    "._prediction": ("DRIFT_LIMIT", "OracleBound", "PredictionCheck", "check_prediction"),
    "._selftest": ("run_selftest",),
    "._trajectory_profile": (
        "check_heads_fit",
        "profile_meta",
        "profile_trajectories",
        "trajectory_traces",
    ),
    "._validation": (
        "RATE_DEFINITION",
        "EncodedPrompt",
        "MethodRuns",
        "RunProgress",
        "autoregressive_method",
        "bundle_topk",
        "capture_line",
        "check_replay",
        "profile_live_trajectories",
        "quartiles",
        "ratio",
        "run_side_by_side",
        "runtime_report",
        "speculative_method",
    ),
}
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
