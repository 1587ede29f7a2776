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
from ._exports import EXPORT_FORMATS, export
from ._greedy import best_tree, best_trees
from ._latency import LatencyModel
from ._pareto import TreeCandidate, build_front, fronts_by_bucket, pareto_front, score_tree
from ._profile import Profile, ProfileMeta, Trace, merge_profiles
from ._replay import Replayer, ReplayResult, best_static, oracle_replay, replay
from ._run import SearchOutcome, SearchSettings, make_bundle, reference_tree, search
from ._schedule import Schedule
from ._schedule_search import ScheduleSearchResult, Validation, calibrate_schedule
from ._synthetic import synthetic_profile
from ._tree import Tree, TreeBuffers

__all__ = [
    "EXPORT_FORMATS",
    "AcceptanceTable",
    "Bundle",
    "EntmtpError",
    "EntropyEstimator",
    "EstimatorState",
    "LatencyModel",
    "Profile",
    "ProfileMeta",
    "Replayer",
    "ReplayResult",
    "Schedule",
    "ScheduleSearchResult",
    "Validation",
    "SearchOutcome",
    "SearchSettings",
    "Trace",
    "Tree",
    "TreeBuffers",
    "TreeCandidate",
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
    "entropy_bucket_edges",
    "expected_accept_length",
    "export",
    "fronts_by_bucket",
    "independence_error",
    "independence_expected_accept_length",
    "load_bundle",
    "make_bundle",
    "merge_profiles",
    "oracle_replay",
    "pareto_front",
    "reference_tree",
    "replay",
    "save_bundle",
    "score_tree",
    "search",
    "synthetic_profile",
]
