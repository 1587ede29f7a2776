"""entmtp.treesearch: pure numpy trees, acceptance, search, replay, schedules and bundles.

Imports neither torch nor transformers.
"""

from entmtp.core import EntmtpError

from ._acceptance import (
    AcceptanceTable,
    accept_lengths,
    acceptance_table,
    bucket_of,
    entropy_bucket_edges,
    expected_accept_length,
    independence_error,
    independence_expected_accept_length,
)
from ._bundle import Bundle, bundle_from_json, bundle_to_json, load_bundle, save_bundle
from ._estimator import EntropyEstimator, EstimatorState
from ._exports import EXPORT_FORMATS, export, export_bundle
from ._greedy import best_tree, best_trees
from ._latency import (
    MAX_TREE_NODES,
    LatencyModel,
    LatencyPoint,
    padding_summary,
    runtime_padding,
    with_padding,
)
from ._pareto import TreeCandidate, build_front, fronts_by_bucket, pareto_front, score_tree
from ._profile import Profile, ProfileMeta, Trace, merge_profiles, values_problem
from ._readers import (
    check_regular_file,
    parse_jsonl,
    read_bytes,
    read_json,
    read_jsonl,
    read_text,
    require,
    short,
)
from ._replay import Replayer, ReplayResult, best_static, oracle_replay, replay
from ._run import (
    SearchOutcome,
    SearchSettings,
    make_bundle,
    outcome_to_json,
    reference_tree,
    report_markdown,
    search,
)
from ._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule
from ._schedule_search import ScheduleSearchResult, Validation, calibrate_schedule
from ._storage import open_storage
from ._synthetic import synthetic_profile
from ._tree import Tree, TreeBuffers

__all__ = [
    "BASE_ENTROPY",
    "DRAFT_ENTROPY",
    "EXPORT_FORMATS",
    "MAX_TREE_NODES",
    "AcceptanceTable",
    "Bundle",
    "EntmtpError",
    "EntropyEstimator",
    "EstimatorState",
    "LatencyModel",
    "LatencyPoint",
    "Profile",
    "ProfileMeta",
    "ReplayResult",
    "Replayer",
    "Schedule",
    "ScheduleSearchResult",
    "SearchOutcome",
    "SearchSettings",
    "Trace",
    "Tree",
    "TreeBuffers",
    "TreeCandidate",
    "Validation",
    "accept_lengths",
    "acceptance_table",
    "best_static",
    "best_tree",
    "best_trees",
    "bucket_of",
    "build_front",
    "bundle_from_json",
    "bundle_to_json",
    "calibrate_schedule",
    "check_regular_file",
    "entropy_bucket_edges",
    "expected_accept_length",
    "export",
    "export_bundle",
    "fronts_by_bucket",
    "independence_error",
    "independence_expected_accept_length",
    "load_bundle",
    "make_bundle",
    "merge_profiles",
    "open_storage",
    "oracle_replay",
    "outcome_to_json",
    "padding_summary",
    "pareto_front",
    "parse_jsonl",
    "read_bytes",
    "read_json",
    "read_jsonl",
    "read_text",
    "reference_tree",
    "replay",
    "report_markdown",
    "require",
    "runtime_padding",
    "save_bundle",
    "score_tree",
    "search",
    "short",
    "synthetic_profile",
    "values_problem",
    "with_padding",
]
