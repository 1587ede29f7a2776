"""The deadline of a ``--max-seconds`` budget, as a ``time.monotonic()`` value."""

from __future__ import annotations

import math
import time

from ._errors import EntmtpError


def deadline_after(max_seconds: float | None, *, started: float | None = None) -> float | None:
    """The ``time.monotonic()`` value ``max_seconds`` after ``started`` (default: now); None
    without a budget. Refuses a value that is not a positive finite number of seconds."""
    started = time.monotonic() if started is None else started
    if max_seconds is None:
        return None
    if not (math.isfinite(max_seconds) and max_seconds > 0):
        raise EntmtpError(f"--max-seconds {max_seconds}: give a positive number of seconds")
    return started + max_seconds
