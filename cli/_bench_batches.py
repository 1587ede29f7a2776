"""`entmtp bench --batch-sizes` and `validate --batch-size`: the live batch sweep
(``entmtp.evaluation.run_batch_sweep``) of one bundle, printed as a table per batch size and
written as JSON."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from entmtp.calibrate import command_line
from entmtp.core import EntmtpError
from entmtp.evaluation import SweepAtSize, run_batch_sweep, sweep_measured_runs, torch_threads
from entmtp.treesearch import Bundle

from ._live import run_progress, write_json

ACCEPT_TOLERANCE = 0.01  # live accept length against the batched replay's (the target)
RATE_TOLERANCE = 0.10  # live tokens/s against the replay's on the bundle's step times


def parse_batch_sizes(text: str | None, option: str = "--batch-sizes") -> tuple[int, ...] | None:
    """``"1,2,4"`` -> (1, 2, 4); None stays None."""
    if text is None:
        return None
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise EntmtpError(f"{option} {text!r}: give comma-separated batch sizes, e.g. "
                          "1,2,4,8,16") from None
    if not sizes or sizes[0] < 1:
        raise EntmtpError(f"{option} {text!r}: give batch sizes of 1 or more")
    return tuple(sizes)


def _ratio_cell(row: dict[str, Any], baseline: str) -> str:
    value = row["speedup"].get(baseline)
    if value is None or not math.isfinite(value):
        return ""
    interval = row["speedup_ci95"].get(baseline)
    spread = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""
    return f"{value:.3f}x{spread}"


def sweep_table(at: SweepAtSize, title: str) -> Table:
    batches = f"{at.batches} batch{'es' if at.batches != 1 else ''}"
    table = Table(title=f"{title}: batch size {at.batch_size} ({batches})",
                  box=box.SIMPLE_HEAD)
    for header in ("method", "trees", "tokens/s", "vs plain [95%]", "vs batch-1 [95%]",
                   "accept (pred.)", "tok/s / pred.", "lossless"):
        table.add_column(header, justify="left" if header in ("method", "trees") else "right")
    for row in at.rows:
        trees = row["schedule_trees"]
        pred_rate = row["tokens_per_second_over_predicted"]
        table.add_row(
            row["name"] + (" (same runs)" if row["same_runs_as"] else ""),
            "plain" if trees is None else ", ".join(map(str, trees)),
            f"{row['tokens_per_second']:.2f}",
            _ratio_cell(row, "autoregressive"),
            _ratio_cell(row, "batch-1 bundle"),
            f"{row['mean_accept_length']:.3f} ({row['predicted_mean_accept_length']:.3f})",
            "" if pred_rate is None else f"{pred_rate:.3f}",
            "yes" if row["lossless"] else "NO",
        )
    return table


def sweep_findings(sizes: Sequence[SweepAtSize]) -> list[str]:
    """One line per row that is not lossless or departs from its replay beyond the targets."""
    lines = []
    for at in sizes:
        for row in at.rows:
            where = f"batch size {at.batch_size}, {row['name']}"
            if not row["lossless"]:
                lines.append(f"{where}: output differs from plain decoding (not lossless)")
            accept = row["accept_over_predicted"]
            if math.isfinite(accept) and abs(accept - 1.0) > ACCEPT_TOLERANCE:
                lines.append(f"{where}: live accept length {accept:.3f}x the replay's, beyond "
                             f"{ACCEPT_TOLERANCE:.0%}")
            rate = row["tokens_per_second_over_predicted"]
            if rate is not None and abs(rate - 1.0) > RATE_TOLERANCE:
                lines.append(f"{where}: live tokens/s {rate:.3f}x the replay's on the bundle's "
                             f"step times, beyond {RATE_TOLERANCE:.0%} (a busy machine, or step "
                             "times from another one)")
    return lines


def run_sweep_command(
    console: Console, *, base, heads, bundle_path: Path, bundle: Bundle, encoded: Sequence[Any],
    batch_sizes: Sequence[int], max_new_tokens: int, engine: str, graphs: bool, pad: bool,
    threads: int | None, thread_source: str, json_path: Path | None, title: str,
    report: dict[str, Any],
) -> list[SweepAtSize]:
    """Run the sweep, print its tables and findings, write ``report`` + the sweep as JSON."""
    on_cpu = next(base.model.parameters()).device.type == "cpu"
    total = sweep_measured_runs(len(encoded), batch_sizes, bundle)
    with torch_threads(threads if on_cpu else None) as used_threads:
        with run_progress(console, f"batch sweep ({len(batch_sizes)} sizes)", total) as progress:
            sizes = run_batch_sweep(base, heads, bundle, encoded, batch_sizes,
                                    max_new_tokens=max_new_tokens, engine=engine, graphs=graphs,
                                    pad=pad, progress=lambda: progress(math.nan))
    for at in sizes:
        console.print(sweep_table(at, title))
    findings = sweep_findings(sizes)
    for line in findings:
        console.print(f"entmtp: warning: {line}", markup=False, highlight=False)
    console.print(f"torch threads: {used_threads} ({thread_source})" if on_cpu else
                  "device: not the CPU (torch threads unchanged)")
    write_json(json_path, {
        **report, "bundle": str(bundle_path), "command": command_line(),
        "batch_sizes": list(batch_sizes), "bundle_batch_sizes": list(bundle.batch_sizes),
        "threads": {"torch_threads": used_threads, "source": thread_source, "cpu": on_cpu},
        "rate_definition": ("every row's decode tokens (each output less the prefill's first "
                            "token) over the batch steps' time; accept length: decode tokens "
                            "per live row-step (as in the batched replay)"),
        "findings": findings,
        "sweep": [at.to_json() for at in sizes],
    }, console)
    return sizes
