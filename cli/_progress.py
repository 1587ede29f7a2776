"""How the commands show progress: a pipeline ``Event`` as a rich progress bar, a spinner, a
dim note or a warning on stderr."""

from __future__ import annotations

from types import TracebackType

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


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def warn(text: str) -> None:
    typer.echo(f"entmtp: warning: {text}", err=True)


class ConsoleReporter:
    """A ``progress`` callback for the pipeline; use it as a context manager, so that a bar or
    spinner left running by a failed stage is stopped."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bar: Progress | None = None
        self._job: TaskID | None = None
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
