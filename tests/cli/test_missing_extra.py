"""Without the `[model]` extra (torch, transformers, gguf, safetensors): every model command is
one line naming the pip install and exit code 2; the offline commands work.

Each command runs in a fresh interpreter whose imports of those modules fail, as they would
where the extra is not installed.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from entmtp.core import HEAD_TYPES

BLOCKED = ("torch", "transformers", "gguf", "safetensors")
WITHOUT_MODEL_EXTRA = f"""
import sys

class BlockModelExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, BlockModelExtra())
sys.argv = ["entmtp", *sys.argv[1:]]
from entmtp.cli.app import main
main()
"""
EXPECTED = ("entmtp: error: this command needs the model extra (torch is not installed): "
            "pip install 'entmtp[model]'")
TREES = Path(str(resources.files("entmtp.trees")))
BUNDLE = TREES / "bundles" / f"code-{HEAD_TYPES[0]}-cpu2.json"
LATENCY = TREES / "latency" / "cpu2-medusa-smollm2-135m.json"


def entmtp_without_model_extra(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_MODEL_EXTRA, *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_the_shipped_files_used_here_exist():
    assert BUNDLE.is_file() and LATENCY.is_file()


MODEL_COMMANDS = {
    "calibrate": lambda t: ["calibrate", "--out", t / "out"],
    "latency": lambda t: ["latency", "--out", t / "out" / "latency.json"],
    "validate": lambda t: ["validate", BUNDLE, "--json", t / "out" / "validate.json"],
    "bench": lambda t: ["bench", "--json", t / "out" / "bench.json"],
    "decode": lambda t: ["decode", BUNDLE, "--prompt", "hello"],
    "heads train": lambda t: ["heads", "train", "--type", "medusa", "--out", t / "out"],
    "heads data": lambda t: ["heads", "data", "--out", t / "out"],
    "heads eval": lambda t: ["heads", "eval", "--from-data", t, "--heads", t],
}


@pytest.mark.parametrize("command", sorted(MODEL_COMMANDS))
def test_a_model_command_names_the_extra_to_install(command, tmp_path):
    result = entmtp_without_model_extra(*MODEL_COMMANDS[command](tmp_path))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == EXPECTED, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_debug_shows_the_import_error(tmp_path):
    result = entmtp_without_model_extra("--debug", "calibrate", "--out", tmp_path / "out")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ModuleNotFoundError" in result.stderr


def test_offline_commands_run_without_the_model_extra(tmp_path):
    def ok(*args: object) -> str:
        result = entmtp_without_model_extra(*args)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    run = tmp_path / "demo"
    ok("demo", "--out", run, "--schedule-trials", 4)
    assert (run / "bundle.json").is_file()
    assert "chosen schedule" in ok("pareto", run)
    ok("retarget", run, "--latency", LATENCY, "--out", tmp_path / "retargeted")
    assert (tmp_path / "retargeted" / "bundle.json").is_file()
    ok("show-tree", TREES / "mc_sim_7b_63.json", "--out", tmp_path / "tree.png")
    ok("export", BUNDLE, "--format", "medusa", "--out", tmp_path / "tree.json")
    ok("plot-latency", LATENCY, "--out", tmp_path / "latency.png")
    for name in ("tree.png", "tree.json", "latency.png"):
        assert (tmp_path / name).is_file()
