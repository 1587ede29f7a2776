"""`entmtp demo`: the whole offline search on a synthetic profile, no model needed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from entmtp.calibrate import DEMO_LATENCIES, DEMO_SCHEDULE_TRIALS, demo_run

from ._errors import user_errors
from ._model_setup import FORCE_OPTION, SEED_OPTION
from ._progress import ConsoleReporter
from ._typer_app import app, choices


@app.command()
@user_errors
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Run folder to write."),
    seed: int = SEED_OPTION,
    schedule_trials: int = typer.Option(DEMO_SCHEDULE_TRIALS, "--schedule-trials",
                                        help="Optuna trials of the entropy-schedule search."),
    latency: str = typer.Option(DEMO_LATENCIES[0], "--latency", metavar=choices(*DEMO_LATENCIES),
                                help="Which synthetic latency model prices the trees: a CPU-like "
                                "one (step time grows with the tree) or a GPU-like one (flat "
                                "up to a width)."),
    force: bool = FORCE_OPTION,
) -> None:
    """Search trees and an entropy schedule on a synthetic regime-switching profile.

    Example: entmtp demo --out runs/demo && entmtp pareto runs/demo --plot runs/demo/pareto.png
    """
    console = Console()
    with ConsoleReporter(console) as reporter:
        run = demo_run(out, seed=seed, schedule_trials=schedule_trials, latency=latency,
                       progress=reporter)
    console.print(f"wrote {run.bundle} and {run.report}")
