"""`entmtp bundles` and the shipped bundle that `--task` picks for decode, validate and bench,
on a machine made up for the test (its CPU is monkeypatched): the line that says which bundle
and why, and the one-line refusals. Decoding a picked bundle needs the default model: that run
is an integration test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entmtp.cli import _bundles
from entmtp.cli.app import app
from entmtp.core import CpuInfo

runner = CliRunner()
SHIPPED = sorted((Path(__file__).resolve().parents[2] / "trees" / "bundles").glob("*.json"))
ZEN4 = CpuInfo("AMD EPYC", "AuthenticAMD family 25 model 17 stepping 1")
SAPPHIRE_RAPIDS = CpuInfo("Intel(R) Xeon(R) Platinum 8480+",
                          "GenuineIntel family 6 model 143 stepping 8")


def invoke(args: list) -> object:
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def on_cpu(monkeypatch):
    """Make this machine's CPU the one given."""
    def use(info: CpuInfo) -> None:
        monkeypatch.setattr(_bundles, "cpu_info", lambda: info)
    return use


def marked(output: str) -> dict[str, str]:
    """bundle file name -> its mark, for the listing's bundle rows."""
    rows = {}
    for line in output.splitlines():
        words = line.split()
        names = [w for w in words if w.endswith(".json")]
        if names:
            rows[names[0]] = words[0] if words[0] in ("*", "~") else ""
    return rows


def test_bundles_lists_each_shipped_bundle_on_one_line_and_marks_this_cpus(on_cpu):
    on_cpu(ZEN4)
    result = invoke(["bundles"])
    assert result.exit_code == 0, result.output
    rows = marked(result.stdout)
    assert sorted(rows) == [p.name for p in SHIPPED]
    exact = sorted(name for name, mark in rows.items() if mark == "*")
    tasks = sorted({json.loads(p.read_text())["task"] for p in SHIPPED})
    assert exact == sorted(f"{t}-{h}-cpu2-zen4.json" for t in tasks for h in ("hydra", "medusa"))
    line = next(line for line in result.stdout.splitlines() if "code-hydra-cpu2-zen4" in line)
    bundle = json.loads(next(p for p in SHIPPED if p.name == "code-hydra-cpu2-zen4.json")
                        .read_text())
    for word in ("code", "hydra", "AMD EPYC family 25 model 17", "float32",
                 f"{bundle['predicted']['tokens_per_second']:.1f}",
                 f"{bundle['predicted']['speedup_vs_autoregressive']:.2f}x"):
        assert word in line  # one line each, even piped (no wrap at 80 columns)
    assert "this machine: cpu, float32, AMD EPYC family 25 model 17" in result.stdout
    assert result.stderr == ""


def test_bundles_marks_the_closest_where_none_was_timed_here(on_cpu):
    on_cpu(SAPPHIRE_RAPIDS)
    rows = marked(invoke(["bundles"]).stdout)
    assert {name for name, mark in rows.items() if mark} == {
        name for name in rows if name.endswith("-cpu2-xeon.json")}
    assert set(rows.values()) == {"~", ""}
    rows = marked(invoke(["bundles", "--dtype", "bf16"]).stdout)
    assert {name for name, mark in rows.items() if mark} == {
        name for name in rows if name.endswith("-cpu2-xeon-bf16.json")}


def test_task_picks_the_bundle_timed_on_this_cpu_and_says_why(on_cpu, capsys):
    on_cpu(ZEN4)
    path = _bundles.pick_shipped("code", "medusa", device="cpu", dtype="fp32")
    assert path.name == "code-medusa-cpu2-zen4.json" and path.is_file()
    err = capsys.readouterr().err
    assert err == (f"picked {path}: timed on this CPU model (AMD EPYC family 25 model 17)\n")
    path = _bundles.pick_shipped("code", None, device="cpu", dtype="fp32")
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"picked {path}: timed on this CPU model")
    assert f"{path.name.split('-')[1]} heads" in err and "--head-type" in err


def test_task_warns_in_one_line_when_no_bundle_was_timed_on_this_cpu(on_cpu, capsys):
    on_cpu(SAPPHIRE_RAPIDS)
    path = _bundles.pick_shipped("math", "hydra", device="cpu", dtype="fp32")
    assert path.name == "math-hydra-cpu2-xeon.json"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"entmtp: warning: picked {path}: ")
    assert "another model of this CPU family" in lines[0] and "entmtp latency" in lines[0]
    paths = _bundles.pick_shipped_per_head_type("math", None, device="cpu", dtype="fp32")
    assert [p.name for p in paths] == ["math-hydra-cpu2-xeon.json", "math-medusa-cpu2-xeon.json"]
    assert len(capsys.readouterr().err.splitlines()) == 2


@pytest.mark.parametrize("args,words", [
    (["decode", "--task", "poetry", "--prompt", "hi"],
     ("no shipped bundle for task 'poetry'", "chat, code, lit, math")),
    (["validate", "--task", "poetry"], ("no shipped bundle for task 'poetry'", "code")),
    (["bench", "--task", "poetry"], ("no shipped bundle for task 'poetry'", "code")),
    (["decode", "trees/bundles/code-medusa-cpu2.json", "--task", "code", "--prompt", "hi"],
     ("both a bundle", "not both")),
    (["decode", "--prompt", "hi"], ("--task TASK", "entmtp bundles")),
    (["validate"], ("--task TASK",)),
    (["decode", "--task", "code", "--prompt", "hi", "--model", "some/model"],
     ("--model", "default model")),
    (["decode", "--task", "code", "--head-type", "eagle", "--prompt", "hi"], ("--head-type",)),
    (["bundles", "--dtype", "int8"], ("--dtype",)),
    (["bundles", "--device", "tpu"], ("--device",)),
])
def test_bad_bundle_choices_are_one_line_errors_before_any_model_loads(args, words):
    result = invoke(args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("entmtp: error:"), result.output
    for word in words:
        assert word in lines[0], lines[0]
    assert "loading model" not in result.output


@pytest.mark.parametrize("args,picked", [
    (["bench", "--task", "code"], ["code-hydra-cpu2-zen4.json", "code-medusa-cpu2-zen4.json"]),
    (["bench", "--task", "code", "--head-type", "medusa"], ["code-medusa-cpu2-zen4.json"]),
    (["bench", "--task", "code", "--model", "some/model"], []),  # shipped bundles: default model
    (["bench", "--task", "code", "--bundle", "trees/bundles/code-hydra-cpu2.json"], []),
    (["validate", "--task", "code"], ["code-hydra-cpu2-zen4.json"]),
    (["validate", "trees/bundles/code-hydra-cpu2.json", "--task", "chat"], []),  # the prompts
])
def test_task_picks_bundles_for_bench_and_validate_unless_given(on_cpu, monkeypatch, args,
                                                                picked):
    """Each command stops at the model load: what it picked is said by then."""
    from entmtp.cli import _bench, _validate
    from entmtp.core import EntmtpError

    def stop(*_args, **_kwargs):
        raise EntmtpError("stopped at the load")

    on_cpu(ZEN4)
    for module in (_bench, _validate):
        monkeypatch.setattr(module, "load_base", stop)
    result = invoke([*args, "--prompts", 1])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert lines[-1] == "entmtp: error: stopped at the load"
    assert [line.split(":")[0].rsplit("/", 1)[-1] for line in lines[:-1]] == picked


def test_bundles_help_gives_an_example():
    result = invoke(["bundles", "--help"])
    assert result.exit_code == 0 and "Example: entmtp bundles" in result.output


@pytest.mark.integration
def test_decode_with_task_writes_the_text_alone_to_stdout(on_cpu):
    on_cpu(ZEN4)
    result = invoke(["decode", "--task", "code", "--head-type", "medusa", "--prompt",
                     "Write a function that adds two numbers.", "--max-new-tokens", 12])
    assert result.exit_code == 0, result.output
    err = result.stderr.splitlines()
    assert err[0].startswith("picked ") and "code-medusa-cpu2-zen4.json" in err[0]
    assert err[1].startswith("loading model SmolLM2-135M-Instruct")
    assert any(line.startswith("speed: ") and "predicted" in line and "autoregressive" in line
               for line in err)
    assert result.stdout.strip() and "tokens/s" not in result.stdout
    assert "picked" not in result.stdout and "loading" not in result.stdout
