"""entmtp.treesearch: pure numpy trees, acceptance, search, replay, schedules and bundles.

Imports neither torch nor transformers.
"""

from ._errors import EntmtpError
from ._latency import LatencyModel
from ._profile import Profile, ProfileMeta, Trace, merge_profiles
from ._tree import Tree, TreeBuffers

__all__ = [
    "EntmtpError",
    "LatencyModel",
    "Profile",
    "ProfileMeta",
    "Trace",
    "Tree",
    "TreeBuffers",
    "merge_profiles",
]
