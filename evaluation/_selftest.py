"""The self-test: does this machine run entmtp's runtime, and if not, which part fails first.

``run_selftest`` runs every check of ``selftest_checks`` on a tiny random Llama-shaped model it
builds from a config (no files, no downloads), each check wrapped so that one failure does not
hide the next: a check passes, fails with the first line of its error, or is skipped where it
does not apply (the CUDA-only parts on the CPU). On the CPU the whole run takes a few seconds;
on a GPU under a minute, most of it capturing graphs. The checks live in
evaluation/_selftest_checks.py and _selftest_attention.py, what they share in
_selftest_setup.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from entmtp.core import atomic_write_json
from entmtp.model import check_device_name, resolve_dtype_name

from ._benchmark import torch_threads
from ._selftest_checks import selftest_checks
from ._selftest_setup import Found, SelftestSetup, SkipCheck, first_error_line

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
MAX_EXIT_CODE = 125  # exit statuses above it mean a signal or a shell error
# The tiny model's steps are a few microseconds of work per op: on the CPU more torch threads
# only wait on each other (20x slower on a busy two-core machine).
CPU_THREADS = 1


@dataclass(frozen=True)
class SelftestCheck:
    """One check: ``run(setup)`` returns what it found, raises ``SkipCheck`` where it does not
    apply, and raises anything else when it fails."""

    name: str
    run: Callable[[SelftestSetup], Found]


@dataclass(frozen=True)
class CheckRecord:
    """The outcome of one check."""

    name: str
    status: str  # PASS, FAIL or SKIP
    error: str  # FAIL: the first line of the error; SKIP: why; PASS: ""
    summary: str  # what it found, in one short line ("" unless it passed)
    details: dict[str, Any] = field(default_factory=dict)  # JSON-ready
    seconds: float = 0.0

    def line(self) -> str:
        """``PASS name: summary``, ``FAIL name: first error line`` or ``SKIP name: why``."""
        text = self.summary if self.status == PASS else self.error
        return f"{self.status} {self.name}" + (f": {text}" if text else "")


@dataclass(frozen=True)
class SelftestReport:
    """Every check's record, in the order they ran."""

    device: str
    dtype: str
    records: list[CheckRecord]
    seconds: float

    @property
    def failures(self) -> int:
        return sum(record.status == FAIL for record in self.records)

    @property
    def exit_code(self) -> int:
        """The number of failed checks, at most ``MAX_EXIT_CODE``."""
        return min(self.failures, MAX_EXIT_CODE)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "seconds": round(self.seconds, 3),
            "failures": self.failures,
            "passed": sum(record.status == PASS for record in self.records),
            "skipped": sum(record.status == SKIP for record in self.records),
            "checks": [_json_ready(asdict(record)) for record in self.records],
        }

    def save(self, path: str | os.PathLike) -> None:
        """The report as JSON at ``path``, written atomically."""
        atomic_write_json(path, self.to_json())


def run_check(check: SelftestCheck, setup: SelftestSetup) -> CheckRecord:
    """``check`` on ``setup`` as a record; no exception (but an interrupt) escapes."""
    start = time.perf_counter()
    try:
        found = check.run(setup)
    except SkipCheck as skip:
        return CheckRecord(check.name, SKIP, str(skip), "", {}, time.perf_counter() - start)
    except Exception as err:  # noqa: BLE001 - every failure becomes the check's record
        details = getattr(err, "details", None) or {}
        return CheckRecord(check.name, FAIL, first_error_line(err), "", _json_ready(details),
                           time.perf_counter() - start)
    return CheckRecord(check.name, PASS, "", found.summary, _json_ready(found.details),
                       time.perf_counter() - start)


def run_selftest(
    device: str = "cpu", dtype: str = "fp32", *,
    checks: Sequence[SelftestCheck] | None = None,
    on_record: Callable[[CheckRecord], None] | None = None,
) -> SelftestReport:
    """Run ``checks`` (default: ``selftest_checks()``) on ``device`` in ``dtype``, each to its
    record, ``on_record`` called after each. Raises ``EntmtpError`` only for a device or dtype
    that is not a name; a named GPU this machine lacks fails the checks that need it."""
    device = check_device_name(device)  # whether this machine has it is the checks' to say
    dtype = resolve_dtype_name(dtype)
    setup = SelftestSetup(device, dtype)
    chosen = [SelftestCheck(name, run) for name, run in selftest_checks()] \
        if checks is None else list(checks)
    start = time.perf_counter()
    records = []
    with torch_threads(CPU_THREADS if device == "cpu" else None):
        for check in chosen:
            record = run_check(check, setup)
            records.append(record)
            if on_record is not None:
                on_record(record)
    return SelftestReport(device, dtype, records, time.perf_counter() - start)


def _json_ready(value: Any) -> Any:
    """``value`` with tuples as lists, non-finite floats as None and other objects as text, so
    that the JSON writer (which refuses NaN) takes any check's details."""
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
