"""Results tables rendered from `entmtp bench --json` reports (no hand-typed number).

    .venv/bin/python bench/results_table.py bench/results/*-cpu2-xeon.json     # print one table
    .venv/bin/python bench/results_table.py --update README.md docs/results/*.md
    .venv/bin/python bench/results_table.py --check README.md docs/results/*.md  # exit 1: stale

One row per task and bundle (head type): measured tokens/s of autoregressive decoding, the
bundle's head set with Medusa's `mc_sim_7b_63`, the bundle's best static tree and the bundle's
schedule; the schedule's ratios to each (against the best static tree with its 95% paired
bootstrap interval over prompts, and the same ratio replayed with the latency model, the
noise-free prediction on these trajectories); the fraction of the oracle (replayed); measured
over replayed accept length and tokens/s; measured autoregressive tokens/s over the latency
model's (above 1: the machine ran faster than when that model was measured); lossless; the
targets missed. Under the table: date, machine and command of each report.

`--update` rewrites every block of a markdown file between

    <!-- results_table: SOURCE ... -->
    <!-- end results_table -->

with the table of those reports, in that order (`<!-- results_table summary: ... -->` renders
the short table the top-level README shows). A SOURCE is a report's path from the repository
root, or `COMMIT:PATH` for a report that a later run has replaced (read with `git show`), so
the history keeps its tables as measured. Everything outside the blocks is left as written.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

COLUMNS = ("task", "heads", "AR tok/s", "mc_sim_7b_63 tok/s", "best static tok/s (nodes)",
           "entmtp tok/s", "vs Hydra+mc_sim", "vs Medusa+mc_sim", "vs best static [95% CI]",
           "replayed vs best static", "vs AR", "% of oracle", "accept meas/replay",
           "tok/s meas/replay", "AR meas/model", "lossless", "targets missed")

# The README's short table: the same cells, the reference row being the bundle's own head type.
SUMMARY_COLUMNS = ("task", "heads", "AR tok/s", "entmtp tok/s", "vs AR",
                   "vs mc_sim_7b_63 (same heads)", "vs best static [95% CI]", "lossless")

BLOCK = re.compile(r"<!-- results_table(?P<style> summary)?: (?P<sources>[^>]*?) -->\n"
                   r".*?<!-- end results_table -->", re.S)
END = "<!-- end results_table -->"


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


def summary_rows(report: dict[str, Any]) -> list[list[str]]:
    """The short rows: `table_rows` cut to `SUMMARY_COLUMNS`."""
    out = []
    for cells in table_rows(report):
        cell = dict(zip(COLUMNS, cells, strict=True))
        cell["vs mc_sim_7b_63 (same heads)"] = cell[f"vs {cell['heads'].capitalize()}+mc_sim"]
        out.append([cell[name] for name in SUMMARY_COLUMNS])
    return out


def _header(columns: Sequence[str]) -> list[str]:
    return ["| " + " | ".join(columns) + " |",
            "|" + "|".join("---" if i < 2 else "---:" for i in range(len(columns))) + "|"]


def _machine(report: dict[str, Any]) -> str:
    machine = report.get("machine")
    if not machine:
        return "machine not recorded"
    return (f"{machine['cpu_name']}, {machine['cpu_count']} cores, torch {machine['torch']}, "
            f"{machine['torch_threads']} torch threads, {machine['dtype']}, {machine['date']}")


def markdown(reports: Sequence[tuple[str, dict[str, Any]]]) -> str:
    lines = _header(COLUMNS)
    for _, report in reports:
        lines += ["| " + " | ".join(row) + " |" for row in table_rows(report)]
    lines.append("")
    for path, report in reports:
        command = report.get("command", "command not recorded")
        heads = report.get("heads_sha256")
        which = "heads not recorded" if not heads else "heads " + ", ".join(
            f"{kind} {sha[:12]}" for kind, sha in heads.items())
        lines.append(f"- `{path}`: {report['prompts']} {report['split']} prompts x "
                     f"{report['max_new_tokens']} new tokens; {_machine(report)}; {which}; "
                     f"`{command}`")
    return "\n".join(lines) + "\n"


def summary_markdown(reports: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The short table, then one line: where, when, how many prompts, and the reports."""
    lines = _header(SUMMARY_COLUMNS)
    for _, report in reports:
        lines += ["| " + " | ".join(row) + " |" for row in summary_rows(report)]
    first, last = reports[0][1], reports[-1][1]
    machine = first.get("machine") or {}
    dates = sorted(str((r.get("machine") or {}).get("date", "")) for _, r in reports)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    signature = f" ({machine['cpu_signature']})" if machine.get("cpu_signature") else ""
    where = "machine not recorded" if not machine else (
        f"{machine['cpu_name']}{signature}, {machine['cpu_count']} cores, "
        f"{machine['torch_threads']} torch threads, torch {machine['torch']}, {machine['dtype']}")
    lines += ["", f"{where}; {when}; {last['prompts']} {last['split']} prompts x "
              f"{last['max_new_tokens']} new tokens per task; "
              + ", ".join(f"`{path}`" for path, _ in reports) + "."]
    return "\n".join(lines) + "\n"


def read_report(source: str, root: Path = ROOT) -> dict[str, Any]:
    """A report named by its path from `root`, or by ``COMMIT:PATH`` (read with `git show`)."""
    commit, sep, path = source.rpartition(":")
    if not sep:
        return json.loads((root / source).read_text())
    shown = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{path}"],
                           capture_output=True, text=True, check=False)
    if shown.returncode != 0:
        raise FileNotFoundError(f"{source}: not in this checkout's git history "
                                f"({shown.stderr.strip() or 'git show failed'})")
    return json.loads(shown.stdout)


def render_blocks(text: str, root: Path = ROOT) -> str:
    """`text` with every results_table block rendered again from its sources."""
    def render(match: re.Match[str]) -> str:
        sources = match["sources"].split()
        reports = [(source, read_report(source, root)) for source in sources]
        body = summary_markdown(reports) if match["style"] else markdown(reports)
        opening = match.group(0).split("\n", 1)[0]
        return f"{opening}\n{body}{END}"
    return BLOCK.sub(render, text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path,
                        help="entmtp bench --json files; with --update or --check, markdown files")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true",
                      help="rewrite the results_table blocks of the given markdown files")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 naming each markdown file whose blocks are not up to date")
    args = parser.parse_args(argv)
    if not (args.update or args.check):
        reports = [(str(path), json.loads(path.read_text())) for path in args.files]
        print(markdown(reports), end="")
        return 0
    stale = []
    for path in args.files:
        text = path.read_text()
        rendered = render_blocks(text)
        if rendered != text:
            stale.append(path)
            if args.update:
                from entmtp.core import atomic_write_text  # a whole file or none
                atomic_write_text(path, rendered)
    for path in stale:
        print(f"{path}: {'updated' if args.update else 'out of date; run with --update'}",
              file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
