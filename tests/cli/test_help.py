"""Every command's --help: each option with help, a value column that says what it takes (the
choices, not typer's "<str>"; nothing for a flag, not "<bool>"), one name per concept."""

from __future__ import annotations

import pytest
import typer.main
from typer._click import Context
from typer.testing import CliRunner

from entmtp.calibrate import TASKS
from entmtp.cli.app import app
from entmtp.core import ENGINES, HEAD_TYPES
from entmtp.treesearch import BATCH_SCHEDULE_FORMATS, EXPORT_FORMATS

runner = CliRunner()

# Options declared in cli/_model_setup.py without help (SEED_OPTION, MAX_NEW_TOKENS_OPTION):
# that file is another change's; test_the_pending_exemptions_are_still_needed drops each one
# here as soon as it has help.


def commands(command=None, path=()):
    """(command path, click command) of the app and of every command and subcommand in it."""
    command = command if command is not None else typer.main.get_command(app)
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def visible_params(command):
    """The parameters --help lists: the command's own (hidden ones aside) and --help."""
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    help_option = command.get_help_option(Context(command))
    return params + ([help_option] if help_option is not None else [])


def value_column(command, param) -> str:
    return param.display_type_rich(Context(command)) or ""


def help_text(*args: str) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert result.exit_code == 0, result.output
    return result.output


ALL = list(commands())
LEAVES = [(path, command) for path, command in ALL if not hasattr(command, "commands")]


def test_the_walk_sees_every_command_and_subcommand():
    names = {" ".join(path) for path, _ in ALL}
    assert {"", "calibrate", "pareto", "show-tree", "export", "heads", "heads train",
            "heads data"} <= names
    assert len(LEAVES) >= 15


def missing_help(exempt=frozenset()):
    return [(" ".join(path), max(p.opts, key=len)) for path, command in ALL
            for p in visible_params(command)
            if not (p.help or "").strip() and max(p.opts, key=len) not in exempt]


def test_every_option_and_argument_has_help():
    assert missing_help() == []


def test_the_help_check_fails_on_an_option_without_help():
    """The walk sees an option declared without help (the check above is not vacuous)."""
    probe = typer.Typer()

    @probe.command()
    def one(count: int = typer.Option(1, "--count"), name: str = typer.Option("x", help="A name.")):
        pass

    command = typer.main.get_command(probe)
    assert [max(p.opts, key=len) for p in command.params if not p.help] == ["--count"]


@pytest.mark.parametrize("path, command", ALL, ids=[" ".join(path) or "entmtp" for path, _ in ALL])
def test_value_columns_say_what_each_option_takes(path, command):
    for param in visible_params(command):
        shown = value_column(command, param)
        name = max(param.opts, key=len)
        assert shown not in ("<str>", "<bool>") and "list[" not in shown, (path, name, shown)
        if getattr(param, "is_flag", False):
            assert shown == "", (path, name, shown)  # --x (or --x/--no-x) alone


def test_the_rendered_help_has_no_type_placeholders():
    for path, _ in ALL:
        text = help_text(*path)
        for placeholder in ("<str>", "<bool>", "<list["):
            assert placeholder not in text, (path, placeholder)


def test_choice_options_list_their_choices():
    calibrate = help_text("calibrate")
    assert f"<{'|'.join(TASKS)}>" in calibrate
    assert f"<{'|'.join(HEAD_TYPES)}>" in calibrate
    assert f"<{'|'.join(ENGINES)}>" in calibrate
    assert "<bf16|fp16|fp32>" in calibrate and "<cpu|cuda[:N]>" in calibrate
    assert "<calibration|heldout|all>" in calibrate
    formats = [*EXPORT_FORMATS, *(f"{name}-batch" for name in BATCH_SCHEDULE_FORMATS)]
    assert f"<format>  One of: {', '.join(formats)}." in help_text("export")  # a long list
    assert "<cpu|gpu>" in help_text("demo")
    train = help_text("heads", "train")
    assert "<self-distill|text>" in train and "<full|batch|seen>" in train


def test_the_choice_lists_are_the_librarys():
    """The lists the library does not export to the CLI are written out in cli/_typer_app.py:
    they must stay the values the library accepts."""
    from entmtp.calibrate._head_training import LOSSES
    from entmtp.calibrate._tasks import SPLITS
    from entmtp.calibrate._train_run import TRAIN_MODES
    from entmtp.cli._typer_app import VALUE_NAMES, choices
    from entmtp.core import DTYPE_ALIASES

    assert VALUE_NAMES["--split"] == choices(*SPLITS)
    assert VALUE_NAMES["--mode"] == choices(*TRAIN_MODES)
    assert VALUE_NAMES["--loss"] == choices(*LOSSES)
    dtypes = VALUE_NAMES["--dtype"].strip("<>").split("|")
    assert {DTYPE_ALIASES[name] for name in dtypes} == set(DTYPE_ALIASES.values())


def test_flags_show_no_value():
    text = help_text("pareto")
    line = next(line for line in text.splitlines() if "--no-buckets" in line)
    assert "<" not in line.split("Also print")[0]


def test_help_paragraphs_are_not_broken_mid_sentence():
    """typer keeps a docstring's line breaks after its first paragraph; the app joins them."""
    _, command = next((p, c) for p, c in ALL if p == ("selftest",))
    for paragraph in command.help.split("\n\n"):
        assert "\n" not in paragraph


# -- one name per concept ---------------------------------------------------------------------
def test_head_type_is_head_type_in_every_command():
    for path, command in LEAVES:
        for param in visible_params(command):
            if param.name == "head_type":
                assert param.opts == ["--head-type"], (path, param.opts)
    assert "--type " not in help_text("heads", "train").replace("--head-type", "")


def train(tmp_path, *options):
    return runner.invoke(app, ["heads", "train", "--out", str(tmp_path / "heads"), *options])


def test_heads_train_takes_head_type_and_its_old_name(tmp_path, monkeypatch):
    seen = []

    def fake_run(arguments, progress):
        seen.append(arguments.head_type)
        raise KeyboardInterrupt  # stop before anything is trained

    monkeypatch.setattr("entmtp.cli._heads_cmd.train_heads_run", fake_run)
    assert train(tmp_path, "--head-type", "hydra").exit_code == 130
    assert train(tmp_path, "--type", "medusa").exit_code == 130
    assert train(tmp_path, "--type", "hydra", "--head-type", "hydra").exit_code == 130
    assert seen == ["hydra", "medusa", "hydra"]


@pytest.mark.parametrize("options, message", [
    ((), "give --head-type medusa or --head-type hydra: the heads to train"),
    (("--type", "medusa", "--head-type", "hydra"),
     "--head-type hydra and --type medusa disagree: give --head-type alone"),
    (("--head-type", "eagle"), "--head-type 'eagle': use one of medusa, hydra"),
    (("--type", "eagle"), "--type 'eagle': use one of medusa, hydra"),
])
def test_heads_train_without_one_head_type_is_one_line(tmp_path, options, message):
    result = train(tmp_path, *options)
    assert result.exit_code == 2
    assert result.output.strip() == f"entmtp: error: {message}"
    assert not (tmp_path / "heads").exists()
