"""`entmtp bundles`, and the shipped bundle that `--task` picks for decode, validate and bench:
the bundles under trees/bundles matched against this machine (``entmtp.core``'s
``rank_bundles`` and ``pick_bundle``, which say why)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from entmtp.core import (
    EntmtpError,
    Machine,
    Pick,
    cpu_info,
    device_name,
    pick_bundle,
    picks_by_head_type,
    rank_bundles,
    read_json,
)
from entmtp.model import check_device, check_device_name, resolve_dtype_name

from ._errors import user_errors
from ._model_setup import DEVICE_OPTION, DTYPE_OPTION
from ._progress import output_console, warn
from ._typer_app import app

EXACT_MARK, CLOSEST_MARK = "*", "~"


def shipped_bundles_dir() -> Path:
    return Path(str(resources.files("entmtp.trees").joinpath("bundles")))


def shown_path(path: Path) -> str:
    """The path as a user would type it here: relative to the working folder when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_shipped() -> dict[str, dict[str, Any]]:
    """Every shipped bundle's JSON object by its shown path."""
    folder = shipped_bundles_dir()
    found = {shown_path(path): read_json(path, source=f"shipped bundle {path.name}",
                                         fix="reinstall entmtp")
             for path in sorted(folder.glob("*.json"))}
    if not found:
        raise EntmtpError(f"no shipped bundles in {folder}: reinstall entmtp, or pass a bundle "
                          "file or run folder")
    return found


def this_machine(device: str, dtype: str) -> Machine:
    """The machine that decodes with ``--device`` and ``--dtype`` (one-line errors for bad
    values; a GPU's name through torch)."""
    device = check_device_name(device)
    dtype_name = resolve_dtype_name(dtype)
    gpu = None
    if device != "cpu":
        gpu = device_name(check_device(device))
    return Machine(device=device, dtype=dtype_name, cpu=cpu_info(), gpu_name=gpu)


def announce(pick: Pick, machine: Machine) -> Path:
    """One stderr line: the bundle picked and why; a warning where it was timed on another
    machine or dtype than this run's. Returns its path."""
    fit = pick.fit
    line = f"picked {fit.name}: {pick.describe()}"
    if fit.exact:
        typer.echo(line, err=True)
    else:
        what = "GPU" if machine.device != "cpu" else "CPU model"
        profile = shown_path(shipped_bundles_dir().parent / "profiles" /
                             f"{fit.task}-{fit.head_type}")
        warn(f"{line}. No shipped {fit.task} bundle was timed on this {what} in "
             f"{machine.dtype}, so its trees were chosen for other step costs: measure this "
             f"machine with `entmtp latency` and `entmtp retarget` {profile} to it "
             "(trees/bundles/README.md)")
    return Path(fit.name)


def pick_shipped(task: str, head_type: str | None, *, device: str, dtype: str) -> Path:
    """The shipped bundle of ``task`` (and ``head_type``; None: the best fit) for this machine,
    announced on stderr."""
    machine = this_machine(device, dtype)
    return announce(pick_bundle(read_shipped(), machine, task=task, head_type=head_type),
                    machine)


def pick_shipped_per_head_type(task: str, head_type: str | None, *, device: str,
                               dtype: str) -> list[Path]:
    """``pick_shipped`` for ``head_type``, else one bundle per head type of ``task``."""
    if head_type is not None:
        return [pick_shipped(task, head_type, device=device, dtype=dtype)]
    machine = this_machine(device, dtype)
    return [announce(pick, machine)
            for pick in picks_by_head_type(read_shipped(), machine, task=task)]


def _table(bundles: dict[str, dict[str, Any]], machine: Machine) -> Table:
    fits = rank_bundles(bundles, machine)
    picked: dict[str, str] = {}
    for task in sorted({f.task for f in fits}):
        for pick in picks_by_head_type(bundles, machine, task=task):
            picked[pick.fit.name] = EXACT_MARK if pick.fit.exact else CLOSEST_MARK
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
    for name, right in (("", False), ("bundle", False), ("task", False), ("heads", False),
                        ("timed on", False), ("dtype", False), ("pred. tok/s", True),
                        ("vs AR", True)):
        table.add_column(name, justify="right" if right else "left", no_wrap=True)
    for fit in sorted(fits, key=lambda f: (f.task, f.head_type, f.name)):
        table.add_row(picked.get(fit.name, ""), escape(os.path.basename(fit.name)), fit.task,
                      fit.head_type, escape(fit.timed_on), fit.dtype,
                      "-" if fit.tokens_per_second is None else f"{fit.tokens_per_second:.1f}",
                      "-" if fit.speedup is None else f"{fit.speedup:.2f}x")
    return table


@app.command("bundles")
@user_errors
def bundles_command(
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
) -> None:
    """List the shipped bundles, marking the ones `--task` picks for this machine.

    Example: entmtp bundles --dtype bf16
    """
    machine = this_machine(device, dtype)
    shipped = read_shipped()
    console = output_console()
    folder = shown_path(shipped_bundles_dir())
    console.print(f"shipped bundles in {escape(folder)}; this machine: {escape(machine.label())}",
                  highlight=False)
    console.print(_table(shipped, machine))
    what = "GPU" if machine.device != "cpu" else "CPU model"
    console.print(f"{EXACT_MARK}: `--task TASK` picks it here (for its head type), timed on this "
                  f"{what} in {machine.dtype}; {CLOSEST_MARK}: `--task TASK` picks it here, the "
                  "closest of the task's bundles. pred. tok/s and vs AR: predicted on the "
                  "machine it was timed on.", highlight=False, markup=False)
    console.print('Decode with one: entmtp decode --task code --prompt "..." (--head-type '
                  "medusa or hydra; default: the best fit here)", highlight=False, markup=False)
