"""entmtp.core: what every package shares, without torch.

The error type, the atomic file writers, the head types, dtype names and the one description of
the machine a latency model was measured on. Importing it imports neither torch nor transformers.
"""

from ._atomic import atomic_write, atomic_write_json, atomic_write_text, check_writable_target
from ._errors import EntmtpError

__all__ = [
    "EntmtpError",
    "atomic_write",
    "atomic_write_json",
    "atomic_write_text",
    "check_writable_target",
]
