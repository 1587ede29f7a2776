"""The project's own error type: one line that names the problem and the fix."""

from __future__ import annotations


class EntmtpError(ValueError):
    """A user-facing error. The CLI prints ``str(err)`` on one line and exits non-zero.

    Messages name the offending field or file and, where there is one, the fix.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
