"""Every "Example" of every command's --help works: each parses against the command it names,
reads only files the repository holds or another example makes, writes nowhere entmtp ships,
and the ones that need no model (demo, pareto, show-tree, export, bundles, plot-latency,
latency --import) run for real on fixtures standing in for what the other examples make."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from entmtp.calibrate import demo_run
from entmtp.cli.app import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = re.compile(r"Example[^:]*:\s*(entmtp\s.*)")
OUTPUT_OPTIONS = {"--out", "--plot", "--acceptance-plot", "--json"}
PATH_TEXT_OPTIONS = {"--model", "--heads", "--data"}  # text options that may name a path
# Files an example takes from the user, not from the repository or another example: the
# examples that run here get a stand-in.
USER_FILES = {Path("vllm.csv")}  # step times measured in another runtime
# Commands whose examples run here for real: no model, no GPU, seconds at most.
RUNS_HERE = {("demo",), ("pareto",), ("show-tree",), ("export",), ("bundles",),
             ("plot-latency",)}


def commands(command=None, path=()):
    command = command if command is not None else typer.main.get_command(app)
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def example_paragraphs() -> list[tuple[tuple[str, ...], str]]:
    """(command path, paragraph) of every help paragraph that starts with "Example"."""
    return [(path, paragraph) for path, command in commands()
            for paragraph in (command.help or "").split("\n\n")
            if paragraph.startswith("Example")]


def examples() -> list[tuple[tuple[str, ...], list[list[str]]]]:
    """(command path, its example's command lines, each argv without "entmtp")."""
    found = []
    for path, paragraph in example_paragraphs():
        match = EXAMPLE.fullmatch(paragraph)
        assert match is not None, (path, paragraph)
        found.append((path, [shlex.split(part)[1:] for part in match.group(1).split(" && ")]))
    return found


EXAMPLES = examples()


def ids(found) -> list[str]:
    return [f"{' '.join(path)}-{i}" for i, (path, _) in enumerate(found)]


def parse(argv: list[str]):
    """(command path, {option: value}) of an example, parsed by the command it names."""
    command, words, path = typer.main.get_command(app), list(argv), []
    while hasattr(command, "commands"):
        path.append(words.pop(0))
        command = command.commands[path[-1]]
    ctx = command.make_context(" ".join(["entmtp", *path]), words)
    named = {}
    for param in command.params:
        value = ctx.params.get(param.name)
        if value in (None, (), []):
            continue
        named[max(param.opts, key=len)] = list(value) if isinstance(value, (list, tuple)) \
            else [value]
    return tuple(path), named


def files(named: dict) -> tuple[list[Path], list[Path]]:
    """(inputs, outputs) an example names."""
    inputs, outputs = [], []
    for option, values in named.items():
        for value in values:
            if option in OUTPUT_OPTIONS:
                outputs.append(Path(value))
            elif isinstance(value, Path):
                inputs.append(value)
            elif option in PATH_TEXT_OPTIONS and isinstance(value, str) and (
                    "/" in value or Path(value).suffix):
                inputs.append(Path(value))
    return inputs, outputs


ALL_OUTPUTS = [out for _, lines in EXAMPLES for argv in lines for out in files(parse(argv)[1])[1]]


def made_by_an_example(path: Path) -> bool:
    return any(path == out or out in path.parents for out in ALL_OUTPUTS)


def available(path: Path) -> bool:
    return (REPO / path).exists() or made_by_an_example(path) or path in USER_FILES


def test_every_command_with_options_has_an_example_and_each_is_found():
    assert len(example_paragraphs()) == len(EXAMPLES) >= 15
    with_examples = {path for path, _ in EXAMPLES}
    assert {("calibrate",), ("pareto",), ("show-tree",), ("export",), ("retarget",),
            ("heads", "train"), ("heads", "data")} <= with_examples


@pytest.mark.parametrize("path, lines", EXAMPLES, ids=ids(EXAMPLES))
def test_each_example_parses_against_its_command(path, lines):
    parsed = [parse(argv)[0] for argv in lines]
    assert parsed[0] == path  # an example of this command, not another's


@pytest.mark.parametrize("path, lines", EXAMPLES, ids=ids(EXAMPLES))
def test_each_example_reads_what_the_repository_or_another_example_has(path, lines):
    for argv in lines:
        inputs, outputs = files(parse(argv)[1])
        for name in inputs:
            assert available(name), (argv, name)
        for name in outputs:  # never into the data entmtp ships
            assert name.parts[0] != "trees", (argv, name)



# -- the ones that run here -------------------------------------------------------------------
STEP_TIMES_CSV = """batch_size,nodes,context,ms
1,0,128,10.0
1,0,512,14.0
1,3,128,13.0
1,3,512,15.0
8,0,128,20.0
8,0,512,22.0
8,3,128,30.0
8,3,512,33.0
"""


TRIALS = 20  # schedule trials of the demo runs here (the demo's default takes many seconds)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished run folder (the demo's: no model needed) standing in for runs/code."""
    return demo_run(tmp_path_factory.mktemp("run") / "code", schedule_trials=TRIALS).root


def runs_here(path: tuple[str, ...], lines: list[list[str]]) -> bool:
    return path in RUNS_HERE or (path == ("latency",) and "--import" in lines[0])


RUNNABLE = [(path, lines) for path, lines in EXAMPLES if runs_here(path, lines)]


def test_the_examples_that_run_here_are_the_offline_ones():
    assert {path for path, _ in RUNNABLE} == {*RUNS_HERE, ("latency",)}


@pytest.mark.parametrize("path, lines", RUNNABLE, ids=ids(RUNNABLE))
def test_the_offline_examples_run(path, lines, tmp_path, monkeypatch, finished_run):
    """In a working folder with the repository's trees/ and bench/, runs/code (a finished run)
    and vllm.csv (step times): each command line exits 0 and writes what it names."""
    for name in ("trees", "bench"):
        (tmp_path / name).symlink_to(REPO / name)
    shutil.copytree(finished_run, tmp_path / "runs" / "code")
    (tmp_path / "vllm.csv").write_text(STEP_TIMES_CSV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("entmtp.cli._demo.demo_run", lambda out, **options: demo_run(
        out, **{**options, "schedule_trials": TRIALS}))
    for argv in lines:
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, (argv, result.output)
        for out in files(parse(argv)[1])[1]:
            assert out.exists(), (argv, out)
