"""The README's results table, rendered from `entmtp bench --json` reports (no hand-typed number).

    .venv/bin/python bench/results_table.py bench/results/*-cpu2.json

One row per task and bundle (head type): measured tokens/s of autoregressive decoding, the
bundle's head set with Medusa's `mc_sim_7b_63`, the bundle's best static tree and the bundle's
schedule; the schedule's ratios to each (against the best static tree with its 95% paired
bootstrap interval over prompts, and the same ratio replayed with the latency model, the
noise-free prediction on these trajectories); the fraction of the oracle (replayed); measured
over replayed accept length and tokens/s; measured autoregressive tokens/s over the latency
model's (above 1: the machine ran faster than when that model was measured); lossless; the
targets missed. Under the table: date, machine and command of each report.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("task", "heads", "AR tok/s", "mc_sim_7b_63 tok/s", "best static tok/s (nodes)",
           "entmtp tok/s", "vs Hydra+mc_sim", "vs Medusa+mc_sim", "vs best static [95% CI]",
           "replayed vs best static", "vs AR", "% of oracle", "accept meas/replay",
           "tok/s meas/replay", "AR meas/model", "lossless", "targets missed")


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def _ratio(value: float | None) -> str:
    return _fmt(value, ".2f", "x")


def ratio_with_interval(value: float | None, interval: list[float] | None) -> str:
    """``0.98x [0.95-1.01]``: a measured ratio and its paired bootstrap interval, if any."""
    if interval is None:
        return _ratio(value)
    return f"{_ratio(value)} [{interval[0]:.2f}-{interval[1]:.2f}]"


def missed_targets(prediction: dict[str, Any]) -> str:
    """The targets (``bench/targets.py``, given to ``entmtp bench --targets``) this bundle
    missed on the report's task, by name (``Target.name``; n/a ones are not missed); "not
    checked" for a report made without targets."""
    if not prediction["targets"]:
        return "not checked"
    missed = [key for key, check in prediction["targets"].items() if check["pass"] is False]
    return ", ".join(missed) or "none"


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """One markdown row per bundle of a bench report."""
    rows = {row["name"]: row for row in report["rows"]}
    autoregressive = next(r for r in report["rows"] if r["role"] == "autoregressive")
    out = []
    for kind, prediction in report["predictions"].items():
        entmtp = rows[prediction["row"]]
        reference = next((r for r in report["rows"]
                          if r["role"] == "reference" and r["heads"] == kind), None)
        static = rows.get(prediction.get("best_static", {}).get("row", ""))
        static_cell = ("-" if static is None else
                       f"{static['tokens_per_second']:.2f} ({static.get('num_nodes', '?')})")
        out.append([
            report["task"], kind, f"{autoregressive['tokens_per_second']:.2f}",
            _fmt(reference and reference["tokens_per_second"], ".2f"), static_cell,
            f"{entmtp['tokens_per_second']:.2f}",
            _ratio(prediction.get("speedup_vs_hydra-mc_sim_7b_63")),
            _ratio(prediction.get("speedup_vs_medusa-mc_sim_7b_63")),
            ratio_with_interval(prediction.get("speedup_vs_best_static"),
                                prediction.get("speedup_vs_best_static_ci95")),
            _fmt(prediction.get("replayed_speedup_vs_best_static"), ".3f"),
            _ratio(prediction.get("speedup_vs_autoregressive")),
            _fmt(None if prediction.get("fraction_of_oracle") is None
                 else 100 * prediction["fraction_of_oracle"], ".1f", "%"),
            _fmt(prediction.get("accept_length_ratio"), ".3f"),
            _fmt(prediction.get("tokens_per_second_ratio"), ".3f"),
            _fmt(prediction.get("autoregressive_measured_over_modelled"), ".3f"),
            "yes" if all(r["lossless"] for r in report["rows"]) else "NO",
            missed_targets(prediction),
        ])
    return out


def markdown(reports: Sequence[tuple[str, dict[str, Any]]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(COLUMNS))) + "|"]
    for _, report in reports:
        lines += ["| " + " | ".join(row) + " |" for row in table_rows(report)]
    lines.append("")
    for path, report in reports:
        machine = report.get("machine")
        where = "machine not recorded" if not machine else (
            f"{machine['cpu_name']}, {machine['cpu_count']} cores, torch {machine['torch']}, "
            f"{machine['torch_threads']} torch threads, {machine['dtype']}, {machine['date']}")
        command = report.get("command", "command not recorded")
        heads = report.get("heads_sha256")
        which = "heads not recorded" if not heads else "heads " + ", ".join(
            f"{kind} {sha[:12]}" for kind, sha in heads.items())
        lines.append(f"- `{path}`: {report['prompts']} {report['split']} prompts x "
                     f"{report['max_new_tokens']} new tokens; {where}; {which}; `{command}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="entmtp bench --json files")
    args = parser.parse_args()
    reports = [(str(path), json.loads(path.read_text())) for path in args.reports]
    print(markdown(reports), end="")


if __name__ == "__main__":
    main()
