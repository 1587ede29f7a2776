"""How the commands show progress: a pipeline ``Event`` as a rich progress bar, a spinner, a
dim note or a warning on stderr. Where the console is no terminal (a log file, a pipe) a bar
would only show at its end, so progress comes as plain lines instead, at most one per bar
every ``LINE_INTERVAL_S`` seconds: what a job of an hour run under ``nohup`` needs.

A command has two consoles: ``status_console`` for what it says about the run (stderr) and
``output_console`` for its output (stdout), neither hard-wrapped where it is no terminal."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.status import Status

from entmtp.calibrate import Event

LINE_INTERVAL_S = 30.0
# Where the console is no terminal (a pipe, a file), rich would wrap lines at 80 columns: text
# is soft-wrapped instead (a line stays whole), and tables get this width to lay out in.
UNWRAPPED_WIDTH = 1000


def status_console() -> Console:
    """The console of what a command says about its run (statistics, progress, notes): stderr,
    so that stdout holds only the command's output, and never hard-wrapped."""
    return _unwrapped(Console(stderr=True, soft_wrap=True))


def output_console() -> Console:
    """The console of a command's output (its text, tables and results): stdout, never
    hard-wrapped."""
    return _unwrapped(Console(soft_wrap=True))


def _unwrapped(console: Console) -> Console:
    if not console.is_terminal:
        console.width = UNWRAPPED_WIDTH
    return console


def progress_bar(console: Console, *, rate: bool = True) -> Progress | LineProgress:
    """A bar per task (``add_task``, ``update``); with ``rate`` a text field ``rate`` beside it.
    On a console that is no terminal, a ``LineProgress`` with the same calls."""
    if not console.is_terminal:
        return LineProgress(console)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *([TextColumn("{task.fields[rate]}")] if rate else []),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@dataclass
class _LineTask:
    description: str
    total: int
    completed: int
    fields: dict[str, Any]
    started: float  # clock seconds
    printed: float = 0.0  # clock seconds of the last line (one is printed when it is added)
    shown: int = -1  # completed as of the last line
    finished: bool = False  # its line at completed == total is out


class LineProgress:
    """``rich.progress.Progress``'s ``add_task`` / ``update`` / ``start`` / ``stop`` as plain
    lines ("training: 120/7569 (2%) 41.0 tok/s 1:05"): one when a task is added, then at most one
    per ``interval_s`` while it is updated, one when it completes, and one at stop if its count
    moved since its last line."""

    def __init__(self, console: Console, *, interval_s: float = LINE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.interval_s = interval_s
        self.clock = clock
        self.tasks: list[_LineTask] = []

    def add_task(self, description: str, total: int, completed: int = 0, **fields: Any) -> int:
        task = _LineTask(description, int(total), int(completed), dict(fields), self.clock())
        task.finished = bool(task.total) and task.completed >= task.total
        self.tasks.append(task)
        self._line(task)
        return len(self.tasks) - 1

    def update(self, task_id: int, *, completed: int | None = None, advance: int = 0,
               total: int | None = None, **fields: Any) -> None:
        task = self.tasks[task_id]
        task.completed = int(completed) if completed is not None else task.completed + advance
        task.total = int(total) if total is not None else task.total
        task.fields.update(fields)
        if task.total and task.completed >= task.total:
            if not task.finished:
                task.finished = True
                self._line(task)
        elif self.clock() - task.printed >= self.interval_s:
            self._line(task)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        """The last state of every unfinished task that advanced since its last line."""
        for task in self.tasks:
            if not task.finished and task.completed != task.shown:
                task.finished = True
                self._line(task)

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _line(self, task: _LineTask) -> None:
        now = self.clock()
        task.printed, task.shown = now, task.completed
        share = f" ({100 * task.completed // task.total}%)" if task.total else ""
        rate = str(task.fields.get("rate") or "")
        parts = [f"{task.description}: {task.completed}/{task.total}{share}", rate,
                 _elapsed(now - task.started)]
        self.console.print(" ".join(part for part in parts if part), markup=False,
                           highlight=False)


def _elapsed(seconds: float) -> str:
    """h:mm:ss or m:ss, as rich's elapsed column writes it."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def warn(text: str) -> None:
    typer.echo(f"entmtp: warning: {text}", err=True)


class ConsoleReporter:
    """A ``progress`` callback for the pipeline; use it as a context manager, so that a bar or
    spinner left running by a failed stage is stopped."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bar: Progress | LineProgress | None = None
        self._job: TaskID | int | None = None
        self._status: Status | None = None

    def __call__(self, event: Event) -> None:
        if event.kind == "note":
            self.console.print(f"[dim]{event.text}[/dim]")
        elif event.kind == "wait":
            self.console.print(event.text)
        elif event.kind == "warning":
            warn(event.text)
        elif event.kind == "begin" and event.total > 0:
            self._bar = progress_bar(self.console)
            self._bar.start()
            self._job = self._bar.add_task(event.text, total=event.total, rate="")
        elif event.kind == "begin" and not self.console.is_terminal:
            self.console.print(event.text, markup=False, highlight=False)
        elif event.kind == "begin":
            self._status = self.console.status(event.text)
            self._status.start()
        elif event.kind == "advance" and self._bar is not None and self._job is not None:
            self._bar.update(self._job, completed=event.done,
                             rate=f"{event.tokens_per_second:.1f} tok/s")
        elif event.kind == "end":
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._job = None
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __enter__(self) -> ConsoleReporter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
