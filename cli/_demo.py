"""`entmtp demo`: the whole offline search on a synthetic profile, no model needed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from entmtp.treesearch import LatencyModel, SearchSettings, synthetic_profile

from ._errors import user_errors
from ._runs import RunDir, search_stage
from .app import app


@app.command()
@user_errors
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Run folder to write."),
    seed: int = typer.Option(0, "--seed"),
    schedule_trials: int = typer.Option(100, "--schedule-trials"),
    latency: str = typer.Option("cpu", "--latency", help="Synthetic latency: cpu or gpu."),
) -> None:
    """Search trees and an entropy schedule on a synthetic regime-switching profile.

    Example: entmtp demo --out runs/demo && entmtp pareto runs/demo --plot runs/demo/pareto.png
    """
    from entmtp.treesearch import EntmtpError

    if latency not in ("cpu", "gpu"):
        raise EntmtpError(f"--latency {latency!r}: use cpu or gpu")
    console = Console()
    run = RunDir(out)
    run.root.mkdir(parents=True, exist_ok=True)
    if not run.profile.exists():
        profile = synthetic_profile(seed=seed)
        # A synthetic profile has no model: mark it so the bundle cannot pass for a real one.
        profile.meta.model, profile.meta.vocab_size, profile.meta.hidden_size = "synthetic", 1, 1
        profile.save(run.profile)
    model = LatencyModel.cpu_like() if latency == "cpu" else LatencyModel.gpu_like()
    model.save(run.latency)
    settings = SearchSettings(schedule_trials=schedule_trials, seed=seed)
    search_stage(run, settings, console=console, task="synthetic")
    console.print(f"wrote {run.bundle} and {run.report}")
