"""entmtp.core: what every package shares, without torch.

The error type, the atomic file writers, the head types, dtype names, the one description of the
machine a latency model was measured on, and the line that names a missing optional extra.
Importing it imports neither torch nor transformers.
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
    make_folder,
    may_replace_read_only,
    own_status,
    remove_folders,
    replacing_read_only,
)
from ._deadline import deadline_after
from ._errors import EntmtpError
from ._extras import EXTRA_OF_MODULE, missing_extra
from ._hardware import (
    MACHINE_KEYS,
    SYNTHETIC_LABEL,
    CpuInfo,
    cpu_info,
    cpu_name,
    describe_machine,
    device_name,
    hardware_label,
    hardware_slug,
    parse_cpuinfo,
)
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

__all__ = [
    "deadline_after",
    "user_cache_dir",
    "DTYPE_ALIASES",
    "DTYPE_NAMES",
    "EXTRA_OF_MODULE",
    "HEAD_TYPES",
    "ENGINES",
    "STATIC_ENGINE",
    "EAGER_ENGINE",
    "MACHINE_KEYS",
    "SYNTHETIC_LABEL",
    "CpuInfo",
    "EntmtpError",
    "all_or_none",
    "atomic_write",
    "atomic_write_folder",
    "atomic_write_json",
    "atomic_write_text",
    "check_output_folder",
    "check_writable_target",
    "cpu_info",
    "cpu_name",
    "describe_machine",
    "device_name",
    "dtype_name",
    "hardware_label",
    "hardware_slug",
    "link_refusal",
    "make_folder",
    "may_replace_read_only",
    "missing_extra",
    "own_status",
    "parse_cpuinfo",
    "remove_folders",
    "replacing_read_only",
]
