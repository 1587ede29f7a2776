"""entmtp.core: what every package shares, without torch.

The error type, the atomic file writers, the head types, dtype names, the one description of the
machine a latency model was measured on, and the line that names a missing optional extra.
Importing it imports neither torch nor transformers.
"""

from ._atomic import atomic_write, atomic_write_json, atomic_write_text, check_writable_target
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
from ._names import DTYPE_ALIASES, DTYPE_NAMES, HEAD_TYPES, dtype_name

__all__ = [
    "DTYPE_ALIASES",
    "DTYPE_NAMES",
    "EXTRA_OF_MODULE",
    "HEAD_TYPES",
    "MACHINE_KEYS",
    "SYNTHETIC_LABEL",
    "CpuInfo",
    "EntmtpError",
    "atomic_write",
    "atomic_write_json",
    "atomic_write_text",
    "check_writable_target",
    "cpu_info",
    "cpu_name",
    "describe_machine",
    "device_name",
    "dtype_name",
    "hardware_label",
    "hardware_slug",
    "missing_extra",
    "parse_cpuinfo",
]
