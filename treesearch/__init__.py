"""entmtp.treesearch: pure numpy trees, acceptance, search, replay, schedules and bundles.

Imports neither torch nor transformers.

Layer 2 of 7. Depends on core.
"""

from ._acceptance import AcceptanceTable, expected_accept_length
from ._batch_exports import (
    BATCH_SCHEDULE_FORMATS,
    best_chain_by_batch,
    trtllm_draft_len_schedule,
    vllm_batch_schedule,
)
from ._batch_latency import MAX_BATCH_SIZE, BatchLatency, import_step_times
from ._batch_replay import batch_replay, batch_rows
from ._bundle import Bundle, load_bundle, save_bundle
from ._estimator import EntropyEstimator
from ._exports import EXPORT_FORMATS, export_bundle
from ._greedy import best_tree
from ._latency import (
    MAX_TREE_NODES,
    LatencyModel,
    LatencyPoint,
    padding_summary,
    runtime_padding,
    with_padding,
)
from ._pareto import TreeCandidate, build_front, pareto_front
from ._profile import Profile, ProfileMeta, Trace, merge_profiles, values_problem
from ._replay import Replayer, ReplayResult, oracle_replay, replay
from ._run import (
    SearchSettings,
    make_bundle,
    outcome_to_json,
    reference_tree,
    report_markdown,
    search,
    search_by_batch_size,
)
from ._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule, batch_estimate
from ._storage import open_storage
from ._synthetic import synthetic_profile
from ._tree import Tree

__all__ = [
    "Tree",
    "Profile",
    "ProfileMeta",
    "Trace",
    "synthetic_profile",
    "merge_profiles",
    "expected_accept_length",
    "best_tree",
    "build_front",
    "pareto_front",
    "TreeCandidate",
    "LatencyModel",
    "BatchLatency",
    "replay",
    "oracle_replay",
    "ReplayResult",
    "Schedule",
    "SearchSettings",
    "search",
    "Bundle",
    "make_bundle",
    "load_bundle",
    "save_bundle",
    "export_bundle",
    "reference_tree",
]

# What entmtp's upper layers and bench scripts import from this package besides __all__: not a
# stable API.
_LAYER_API = [
    "batch_replay",
    "batch_rows",
    "search_by_batch_size",
    "BATCH_SCHEDULE_FORMATS",
    "MAX_BATCH_SIZE",
    "LatencyPoint",
    "best_chain_by_batch",
    "import_step_times",
    "trtllm_draft_len_schedule",
    "vllm_batch_schedule",
    "AcceptanceTable",
    "BASE_ENTROPY",
    "DRAFT_ENTROPY",
    "EXPORT_FORMATS",
    "batch_estimate",
    "EntropyEstimator",
    "MAX_TREE_NODES",
    "Replayer",
    "open_storage",
    "outcome_to_json",
    "padding_summary",
    "report_markdown",
    "runtime_padding",
    "values_problem",
    "with_padding",
]
