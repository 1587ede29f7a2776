"""Options shared by several commands are declared once (``cli/_model_setup.py``): every command
that takes one of them takes that one declaration, so their defaults and help never drift."""

from __future__ import annotations

import inspect

import typer.main
from typer.models import OptionInfo

from entmtp.cli import _model_setup
from entmtp.cli.app import app

# option name -> its one declaration, for the options every command must share
SHARED = {
    "--model": _model_setup.MODEL_OPTION,
    "--device": _model_setup.DEVICE_OPTION,
    "--dtype": _model_setup.DTYPE_OPTION,
    "--engine": _model_setup.ENGINE_OPTION,
    "--graphs": _model_setup.GRAPHS_OPTION,
    "--strict": _model_setup.STRICT_OPTION,
}


def _commands(group) -> dict[str, object]:
    """Every command's callback by its full name (``heads train``)."""
    found = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found.update({f"{name} {sub}": callback
                          for sub, callback in _commands(command).items()})
        else:
            found[name] = command.callback
    return found


def _declared(info: OptionInfo) -> set[str]:
    names = [info.default] if isinstance(info.default, str) else []
    return {part for name in [*names, *info.param_decls] for part in str(name).split("/")}


def test_each_shared_option_is_one_declaration():
    seen: dict[str, list[str]] = {name: [] for name in SHARED}
    for command, callback in _commands(typer.main.get_command(app)).items():
        for parameter in inspect.signature(callback).parameters.values():
            info = parameter.default
            if not isinstance(info, OptionInfo):
                continue
            for name in _declared(info) & SHARED.keys():
                assert info is SHARED[name], f"`entmtp {command}` declares its own {name}"
                seen[name].append(command)
    # the check above covers something: each shared option is taken by several commands
    assert all(len(commands) >= 2 for commands in seen.values()), seen
