"""entmtp.core: what every package shares, without torch.

The error type, the atomic file writers and the file readers (one discipline for every file
entmtp writes or is given), the head types, engine and dtype names, the one description of the
machine a latency model was measured on (and which bundle's timing machine is closest to this
one), the user cache folder, and the line that names a missing optional extra. Importing it
imports neither torch nor transformers.

Layer 1 of 7. Depends on nothing (the standard library only).
"""

from ._atomic import (
    all_or_none,
    atomic_write,
    atomic_write_folder,
    atomic_write_json,
    atomic_write_text,
    check_output_folder,
    check_writable_target,
    link_refusal,
    may_replace_read_only,
    own_status,
    replacing_read_only,
)
from ._bundle_choice import (
    Machine,
    Pick,
    cpu_model,
    pick_bundle,
    picks_by_head_type,
    rank_bundles,
    timing_machine,
)
from ._deadline import deadline_after
from ._errors import EntmtpError
from ._extras import missing_extra
from ._hardware import (
    SYNTHETIC_LABEL,
    CpuInfo,
    cpu_info,
    cpu_name,
    describe_machine,
    device_name,
    hardware_label,
    hardware_slug,
)
from ._lazy import lazy_attributes
from ._names import (
    DTYPE_ALIASES,
    DTYPE_NAMES,
    EAGER_ENGINE,
    ENGINES,
    HEAD_TYPES,
    STATIC_ENGINE,
    dtype_name,
)
from ._paths import user_cache_dir
from ._readers import (
    check_regular_file,
    check_values,
    field_name,
    parse_json,
    parse_jsonl,
    read_bytes,
    read_json,
    read_jsonl,
    read_text,
    require,
    short,
)

__all__ = [
    "EntmtpError",
    "HEAD_TYPES",
    "ENGINES",
    "STATIC_ENGINE",
    "EAGER_ENGINE",
    "DTYPE_NAMES",
    "dtype_name",
    "atomic_write",
    "atomic_write_text",
    "atomic_write_json",
    "check_output_folder",
    "check_writable_target",
    "read_json",
    "read_text",
    "read_jsonl",
    "describe_machine",
    "hardware_label",
    "cpu_info",
    "user_cache_dir",
    "missing_extra",
    "deadline_after",
    "atomic_write_folder",
    "lazy_attributes",
]

# What entmtp's upper layers and bench scripts import from this package besides __all__: not a
# stable API.
_LAYER_API = [
    "CpuInfo",
    "Machine",
    "Pick",
    "cpu_model",
    "pick_bundle",
    "picks_by_head_type",
    "rank_bundles",
    "timing_machine",
    "DTYPE_ALIASES",
    "SYNTHETIC_LABEL",
    "all_or_none",
    "check_regular_file",
    "check_values",
    "cpu_name",
    "device_name",
    "field_name",
    "hardware_slug",
    "link_refusal",
    "may_replace_read_only",
    "own_status",
    "parse_json",
    "parse_jsonl",
    "read_bytes",
    "replacing_read_only",
    "require",
    "short",
]
