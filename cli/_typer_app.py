"""The `entmtp` Typer app object, its one-line usage errors and how its help shows option
values; each command module registers its command on ``app``."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator

import typer
from typer.core import TyperArgument, TyperGroup

from entmtp.calibrate import TASKS
from entmtp.core import ENGINES, HEAD_TYPES

try:  # newer typer carries its own copy of click, whose exceptions its parser raises
    from typer._click import Context
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - typer versions that use click itself
    from click import Context
    from click import exceptions as _click_errors


@contextlib.contextmanager
def _usage_errors_on_one_line() -> Iterator[None]:
    """A mistyped command line (an unknown option, a value of the wrong type, a missing option)
    becomes one ``entmtp: error:`` line and exit code 2, like every other user mistake, instead of
    click's usage panel; ``entmtp`` alone still prints the help."""
    try:
        yield
    except _click_errors.NoArgsIsHelpError:
        raise
    except _click_errors.ClickException as err:
        from ._errors import debug_enabled

        if debug_enabled():
            raise
        command = err.ctx.command_path if getattr(err, "ctx", None) is not None else "entmtp"
        message = " ".join(err.format_message().split()).rstrip(".")
        typer.echo(f"entmtp: error: {message}: see `{command} --help`", err=True)
        raise typer.Exit(2) from None


def choices(*values: str) -> str:
    """The help's value column for an option that takes one of ``values``: ``<a|b|c>``."""
    return "<" + "|".join(values) + ">"


# The value column of --help for text options, by option name, the same in every command:
# typer would print "<str>" (and "<bool>" for flags), which says nothing. An option declared
# with its own metavar keeps it (demo --latency, export --format, heads eval --tree).
VALUE_NAMES = {
    "--task": choices(*TASKS),
    "--head-type": choices(*HEAD_TYPES),
    "--type": choices(*HEAD_TYPES),
    "--engine": choices(*ENGINES),
    "--dtype": choices("bf16", "fp16", "fp32"),
    "--device": choices("cpu", "cuda[:N]"),
    "--split": choices("calibration", "heldout", "all"),
    "--mode": choices("self-distill", "text"),
    "--loss": choices("full", "batch", "seen"),
    "--model": "<hub-id|folder|.gguf>",
    "--heads": "<folder>",
    "--data": "<file.jsonl>",
    "--storage": "<journal:PATH|URL>",
    "--node-counts": "<n,n,...>",
    "--depths": "<n,n,...>",
    "--context-lengths": "<n,n,...>",
    "--batch-sizes": "<n,n,...>",
}
TEXT = "<text>"  # any other text option (a prompt, a device's name)


def _value_name(param) -> str | None:  # noqa: ANN001 - a click parameter
    """The value column of a parameter's type (one value's, for a repeatable one: ``<path>``,
    not ``<list[Path]>``), or None for text, which ``VALUE_NAMES`` names."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None:  # pragma: no cover - typer versions whose help shows click's types
        name = param.type.name
        return None if name == "text" else f"<{name}>"
    annotation = descriptor.annotation
    if getattr(annotation, "__origin__", None) is list:
        (annotation,) = annotation.__args__
    if annotation is str:
        return None
    return f"<{getattr(annotation, '__name__', str(annotation)).lower()}>"


def unwrapped(text: str) -> str:
    """A docstring's paragraphs, each on one line: the help wraps them to the terminal (typer
    keeps the source's line breaks after the first paragraph, mid-sentence)."""
    return "\n\n".join(" ".join(paragraph.split())
                       for paragraph in inspect.cleandoc(text).split("\n\n"))


def tidy_help(command) -> None:  # noqa: ANN001 - a click command or group
    """Give every option of ``command`` and its subcommands a value column that says what it
    takes (nothing for a flag, ``--x/--no-x``; the choices; or what the text names), and its
    help text paragraphs that wrap to the terminal."""
    if command.help:
        command.help = unwrapped(command.help)
    params = list(command.params)
    help_option = command.get_help_option(Context(command))  # made on first use: make it now
    if help_option is not None:
        params.append(help_option)
    for param in params:
        if isinstance(param, TyperArgument):
            if param.nargs != 1:  # FILES...: each one a path, not "<list[Path]>"
                label = _value_name(param) or TEXT
                param.display_type_rich = lambda ctx, label=label: label
            continue
        if param.metavar is not None:
            continue
        if param.is_flag:
            param.metavar = ""
            continue
        label = _value_name(param)
        long_name = max(param.opts, key=len)
        param.metavar = label if label is not None else VALUE_NAMES.get(long_name, TEXT)
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)


class _Commands(TyperGroup):
    """The command group; parsing errors of it and of every subcommand are one line, and every
    option's help says what value it takes (``tidy_help``)."""

    def __init__(self, **attrs) -> None:  # noqa: ANN003
        super().__init__(**attrs)
        tidy_help(self)

    def make_context(self, info_name, args, parent=None, **extra):  # noqa: ANN001, ANN201
        with _usage_errors_on_one_line():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):  # noqa: ANN001, ANN201
        with _usage_errors_on_one_line():
            return super().invoke(ctx)


app = typer.Typer(
    cls=_Commands,
    no_args_is_help=True,
    add_completion=False,
    help="entmtp: entropy-adaptive draft trees for Medusa / Hydra speculative decoding.",
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"entmtp {version('entmtp')}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    if debug:
        os.environ["ENTMTP_DEBUG"] = "1"
