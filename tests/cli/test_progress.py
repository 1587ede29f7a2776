"""Progress on a console that is no terminal (a log file under nohup): plain lines, throttled,
never a bar that only shows at the end; and a command's two consoles, stderr for what it says
about the run and stdout for its output, never wrapped at 80 columns when piped."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from entmtp.calibrate import Event
from entmtp.cli._progress import (
    ConsoleReporter,
    LineProgress,
    output_console,
    progress_bar,
    status_console,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_log_gets_a_line_at_the_start_at_most_one_per_interval_and_one_at_the_end():
    console, out = log_console()
    clock = FakeClock()
    bar = LineProgress(console, interval_s=30.0, clock=clock)
    job = bar.add_task("training", total=200, rate="")
    for done in range(1, 201):
        clock.now = done * 1.0  # one update a second
        bar.update(job, completed=done, rate=f"{done / 10:.1f} tok/s")
    bar.stop()
    assert lines(out) == [
        "training: 0/200 (0%) 0:00",
        "training: 30/200 (15%) 3.0 tok/s 0:30",
        "training: 60/200 (30%) 6.0 tok/s 1:00",
        "training: 90/200 (45%) 9.0 tok/s 1:30",
        "training: 120/200 (60%) 12.0 tok/s 2:00",
        "training: 150/200 (75%) 15.0 tok/s 2:30",
        "training: 180/200 (90%) 18.0 tok/s 3:00",
        "training: 200/200 (100%) 20.0 tok/s 3:20",
    ]


def test_advance_counts_up_and_a_stopped_unfinished_task_prints_where_it_stopped():
    console, out = log_console()
    clock = FakeClock()
    with LineProgress(console, interval_s=60.0, clock=clock) as bar:
        job = bar.add_task("bench", total=10)
        for _ in range(4):
            clock.now += 5.0
            bar.update(job, advance=1)
        idle = bar.add_task("never advanced", total=3)
    assert lines(out) == ["bench: 0/10 (0%) 0:00", "never advanced: 0/3 (0%) 0:00",
                          "bench: 4/10 (40%) 0:20"]
    assert idle == 1


def test_a_task_whose_total_grows_finishes_once_at_the_new_total_and_hours_show():
    console, out = log_console()
    clock = FakeClock()
    bar = LineProgress(console, interval_s=1e9, clock=clock)
    job = bar.add_task("forward", total=0)
    clock.now = 3600.0 * 2 + 61
    bar.update(job, completed=5, total=5)
    bar.update(job, completed=5, total=5)
    bar.stop()
    assert lines(out) == ["forward: 0/0 0:00", "forward: 5/5 (100%) 2:01:01"]


def test_a_resumed_task_starts_at_its_count_and_nothing_repeats_a_line():
    console, out = log_console()
    clock = FakeClock()
    bar = LineProgress(console, interval_s=30.0, clock=clock)
    resumed = bar.add_task("generating trajectories", total=32, completed=23)
    done = bar.add_task("forward", total=4, completed=4)
    clock.now = 1.0
    bar.update(resumed, completed=23, total=32)
    bar.update(done, completed=4, total=4)
    bar.stop()
    assert lines(out) == ["generating trajectories: 23/32 (71%) 0:00", "forward: 4/4 (100%) 0:00"]


def test_a_terminal_gets_rich_bars_and_anything_else_gets_lines():
    assert isinstance(progress_bar(Console(file=io.StringIO(), force_terminal=True)), Progress)
    assert isinstance(progress_bar(log_console()[0]), LineProgress)
    assert isinstance(progress_bar(log_console()[0], rate=False), LineProgress)


def test_the_pipeline_reporter_writes_its_stages_as_lines_to_a_log():
    console, out = log_console()
    with ConsoleReporter(console) as reporter:
        reporter(Event("profile", "begin", "profiling code", total=3))
        for done in (1, 2, 3):
            reporter(Event("profile", "advance", done=done, total=3, tokens_per_second=50.0))
        reporter(Event("profile", "end"))
        reporter(Event("search", "begin", "searching trees"))
        reporter(Event("search", "end"))
    text = lines(out)
    # the reporter's clock is the real one: a fast run prints no line between start and end
    assert [line.rsplit(" ", 1)[0] for line in text[:2]] == [
        "profiling code: 0/3 (0%)", "profiling code: 3/3 (100%) 50.0 tok/s"]
    assert text[2:] == ["searching trees"]
    assert "\x1b[" not in out.getvalue()  # no terminal codes in a log


def test_a_commands_consoles_go_to_their_streams_unwrapped_when_piped(capsys):
    long = " ".join(f"word{i}" for i in range(60))  # 400 characters
    table = Table("name", "value")
    table.add_row("a-long-cell-" * 12, "42")
    status_console().print(long)
    output_console().print(long)
    output_console().print(table)
    out, err = capsys.readouterr()
    assert err == long + "\n"
    assert out.splitlines()[0] == long
    row = next(line for line in out.splitlines() if "a-long-cell" in line)
    assert "a-long-cell-" * 12 in row and "42" in row  # the row on one line
