"""bench/gpu_check.sh's `first` and `run` as they run on the device, every entmtp command stood
in for by a fake `timeout` that records it and writes what it would write: the self-test comes
first, the curves need no model file, `run` redoes exactly what `first` left missing (the
bundles too), stops before anything needs a model it does not have, and the heads folders that
travel with the first call only are put back for the later ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAIRS = ("code-medusa", "code-hydra", "math-medusa", "math-hydra")

FAKE_TIMEOUT = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[2:]  # after the limit: PY -c SCRIPT [COMMAND ...] or PY SCRIPT.py ...
if args[1] != "-c":
    name, rest = Path(args[1]).stem, args[2:]
elif len(args) > 3:
    name, rest = args[3], args[4:]
else:
    name, rest = ("model-cache" if "load_base_model" in args[2] else "python -c"), []
with open(os.environ["CALL_LOG"], "a") as log:
    log.write(json.dumps([name] + rest) + "\\n")
def option(flag):
    return rest[rest.index(flag) + 1]
def write(path, text):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
outputs = {{
    "selftest": lambda: write(option("--json"), "{{}}"),
    "latency": lambda: write(option("--out"), "{{}}"),
    "plot-latency": lambda: write(option("--out"), "png"),
    "retarget": lambda: write(Path(option("--out")) / "bundle.json", "{{}}"),
    "gpu_static_check": lambda: write(Path(option("--out")) / "static_check.json", "{{}}"),
    "bench": lambda: (write(option("--json"), json.dumps({{"prompts": int(option("--prompts"))}})),
                      "--plot" in rest and write(option("--plot"), "png")),
    "bench_low_precision": lambda: write(option("--json"), "{{}}"),
}}
code = int(os.environ.get("FAKE_EXIT_" + name.replace("-", "_"), "0"))
if code == 0 and name in outputs:
    outputs[name]()
print(f"fake {{name}}: exit {{code}}")
sys.exit(code)
"""


@pytest.fixture
def device(tmp_path) -> dict:
    """A checkout as a device call has it (the script, its plan, the profiles' folders, the
    default model's config), a $STAGE, an $OUT and the fake `timeout` first on PATH."""
    if shutil.which("sha256sum") is None or shutil.which("tar") is None:
        pytest.skip("needs coreutils and tar")
    checkout = tmp_path / "checkout"
    (checkout / "bench").mkdir(parents=True)
    for script in ("gpu_check.sh", "gpu_plan.py"):
        shutil.copy(ROOT / "bench" / script, checkout / "bench" / script)
    for pair in PAIRS:
        (checkout / "trees" / "profiles" / pair).mkdir(parents=True)
    config = "trees/latency/SmolLM2-135M-Instruct.Q4_1/config.json"
    (checkout / config).parent.mkdir(parents=True)
    shutil.copy(ROOT / config, checkout / config)
    fake = tmp_path / "bin" / "timeout"
    fake.parent.mkdir()
    fake.write_text(FAKE_TIMEOUT.format(python=sys.executable))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}",
           "PYTHON": sys.executable, "STAGE": str(tmp_path / "stage"),
           "OUT": str(tmp_path / "out"), "CALL_LOG": str(tmp_path / "calls.jsonl"),
           "DEVICE": "cpu", "TASKS": "code math", "HEAD_TYPES": "medusa hydra"}
    return {"checkout": checkout, "env": env, "tmp": tmp_path}


def phase(device: dict, name: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "bench/gpu_check.sh", name], cwd=device["checkout"],
                          env={**device["env"], **env}, capture_output=True, text=True,
                          timeout=300)


def commands(device: dict) -> list[list[str]]:
    log = device["tmp"] / "calls.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return [json.loads(line) for line in lines]


def archived(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return {member.name for member in tar.getmembers() if member.isfile()}


def option(command: list[str], flag: str) -> list[str]:
    return [command[k + 1] for k, word in enumerate(command) if word == flag]


def test_first_runs_the_selftest_first_then_the_model_free_stages(device):
    run = phase(device, "first")
    assert run.returncode == 0, run.stderr
    done = commands(device)
    assert [c[0] for c in done] == (["selftest", "latency", "latency", "plot-latency"]
                                    + ["retarget"] * 4 + ["gpu_static_check"])
    assert option(done[0], "--device") == ["cpu"] and option(done[0], "--json")
    for command in done[1:3]:
        # the default model's config: the GPU machine has no default-model package yet
        assert option(command, "--model") == ["trees/latency/SmolLM2-135M-Instruct.Q4_1"]
    assert sorted(c[1].removeprefix("trees/profiles/") for c in done[4:8]) == sorted(PAIRS)
    packed = archived(device["tmp"] / "out" / "gpu-check-first.tgz")
    assert {"results/selftest.json", "results/latency/medusa.json", "results/latency/curves.png",
            "results/runs/math-hydra/bundle.json", "results/static_check.json"} <= packed


def test_run_keeps_what_first_did_and_redoes_only_what_is_missing(device):
    assert phase(device, "first").returncode == 0
    commands(device)
    results = device["tmp"] / "stage" / "results"
    (results / "runs" / "math-hydra" / "bundle.json").unlink()  # a search cut short
    run = phase(device, "run")
    assert run.returncode == 0, run.stderr
    done = commands(device)
    # then (e), the batch sweep, with the time the planned stages left
    assert [c[0] for c in done] == ["retarget", "model-cache", "bench", "bench",
                                    "bench_low_precision", "latency", "retarget", "bench"]
    assert done[0][1] == "trees/profiles/math-hydra"
    sweep_latency, sweep_search, sweep = done[5:]
    assert option(sweep_latency, "--batch-sizes") == ["1,2,4,8,16,32"]
    assert option(sweep_search, "--latency") == [f"{results}/batch/latency-medusa.json"]
    assert option(sweep, "--batch-sizes") == ["1,2,4,8,16,32"]
    assert option(sweep, "--bundle") == [f"{results}/batch/code-medusa"]
    bundles = [option(c, "--bundle") for c in done[2:5]]
    assert bundles[0] == [f"{results}/runs/code-{t}/bundle.json" for t in ("medusa", "hydra")]
    assert bundles[1] == [f"{results}/runs/math-{t}/bundle.json" for t in ("medusa", "hydra")]
    assert len(bundles[2]) == 4
    packed = archived(device["tmp"] / "out" / "gpu-check.tgz")
    assert {"results/bench/code.json", "results/bench/math.png", "results/bench/summary.txt",
            "results/low-precision.json", "results/selftest.json"} <= packed

    # with everything in place, nothing is redone
    assert phase(device, "run").returncode == 0
    assert [c[0] for c in commands(device)] == ["model-cache", "bench", "bench",
                                                "bench_low_precision", "latency", "retarget",
                                                "bench"]


def test_run_without_the_model_parts_stops_before_anything_needs_them(device):
    run = phase(device, "run", DEVICE="cuda")
    assert run.returncode == 2
    assert "model.sha256" in run.stderr and "from the first" in run.stderr
    assert "Traceback" not in run.stderr
    assert commands(device) == []


def test_a_failing_selftest_or_search_is_said_and_the_other_stages_still_run(device):
    run = phase(device, "first", FAKE_EXIT_selftest="3", FAKE_EXIT_retarget="1")
    assert run.returncode == 1
    assert "selftest: failed (exit 3" in run.stderr
    for pair in PAIRS:
        assert f"retarget {pair}: failed (exit 1)" in run.stderr
    assert "fake retarget: exit 1" in run.stderr  # the end of its log
    assert [c[0] for c in commands(device)][-1] == "gpu_static_check"


def test_a_lease_with_less_left_cuts_the_budget_and_what_is_there_is_packed(device):
    # 520 s left on the lease, 500 of them for what the plan spends outside this command:
    # 20 s, all of it for packing
    run = phase(device, "first", FIRST_BUDGET="300", LEASE_RESERVE_S="500", LEASE_LEFT_S="520")
    assert "first: 20 s" in run.stdout
    assert run.returncode == 124
    assert "skipped, out of time" in run.stderr
    assert (device["tmp"] / "out" / "gpu-check-first.tgz").is_file()


def receive(device: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", "source bench/gpu_check.sh functions && receive",
                           "bench/test"], cwd=device["checkout"], env=device["env"],
                          capture_output=True, text=True, timeout=60)


def test_the_heads_travel_with_the_first_call_and_are_put_back_for_the_later_ones(device):
    checkout, stage = device["checkout"], device["tmp"] / "stage"
    heads = checkout / "trees" / "heads" / "smollm2-135m-medusa"
    heads.mkdir(parents=True)
    (heads / "heads.safetensors").write_bytes(b"weights")
    (checkout / ".gpu" / "part1").mkdir(parents=True)
    listing = subprocess.run(["sha256sum", "trees/heads/smollm2-135m-medusa/heads.safetensors"],
                             cwd=checkout, capture_output=True, text=True, check=True).stdout
    (checkout / ".gpu" / "part1" / "heads.sha256").write_text(listing)
    assert receive(device).returncode == 0  # the first call: kept in $STAGE
    kept = stage / "heads" / "smollm2-135m-medusa" / "heads.safetensors"
    assert kept.read_bytes() == b"weights"

    (heads / "heads.safetensors").write_bytes(b"retrained")  # a later plan, other heads
    listing = subprocess.run(["sha256sum", "trees/heads/smollm2-135m-medusa/heads.safetensors"],
                             cwd=checkout, capture_output=True, text=True, check=True).stdout
    (checkout / ".gpu" / "part1" / "heads.sha256").write_text(listing)
    assert receive(device).returncode == 0
    assert kept.read_bytes() == b"retrained"

    shutil.rmtree(checkout / ".gpu")
    shutil.rmtree(checkout / "trees" / "heads")  # a later call's lean checkout
    run = receive(device)
    assert run.returncode == 0 and "put back" in run.stdout
    assert (heads / "heads.safetensors").read_bytes() == b"retrained"

    shutil.rmtree(checkout / "trees" / "heads")
    shutil.rmtree(stage / "heads")  # a machine that did not run the first call
    run = receive(device)
    assert run.returncode == 2
    assert "carry trees/heads in the first call" in run.stderr
