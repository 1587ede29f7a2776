"""entmtp.treesearch: pure numpy trees, acceptance, search, replay, schedules and bundles.

Imports neither torch nor transformers.

Layer 2 of 7. Depends on core.
"""

from ._acceptance import AcceptanceTable as AcceptanceTable
from ._acceptance import expected_accept_length
from ._bundle import Bundle, load_bundle, save_bundle
from ._estimator import EntropyEstimator as EntropyEstimator
from ._exports import EXPORT_FORMATS as EXPORT_FORMATS
from ._exports import export_bundle
from ._greedy import best_tree
from ._latency import (
    MAX_TREE_NODES as MAX_TREE_NODES,
)
from ._latency import (
    LatencyModel,
    LatencyPoint,
)
from ._latency import (
    padding_summary as padding_summary,
)
from ._latency import (
    runtime_padding as runtime_padding,
)
from ._latency import (
    with_padding as with_padding,
)
from ._pareto import TreeCandidate, build_front, pareto_front
from ._profile import Profile, ProfileMeta, Trace, merge_profiles
from ._profile import values_problem as values_problem
from ._replay import Replayer as Replayer
from ._replay import ReplayResult, oracle_replay, replay
from ._run import (
    SearchSettings,
    make_bundle,
    reference_tree,
    search,
)
from ._run import (
    outcome_to_json as outcome_to_json,
)
from ._run import (
    report_markdown as report_markdown,
)
from ._schedule import BASE_ENTROPY as BASE_ENTROPY
from ._schedule import DRAFT_ENTROPY as DRAFT_ENTROPY
from ._schedule import Schedule
from ._storage import open_storage as open_storage
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
    "LatencyPoint",
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
    "AcceptanceTable",
    "BASE_ENTROPY",
    "DRAFT_ENTROPY",
    "EXPORT_FORMATS",
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
