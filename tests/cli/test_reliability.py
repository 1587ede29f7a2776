"""`entmtp calibrate` under interruption and sharding, on the tiny model and heads.

The reference is one uninterrupted run. Every other run must end with the same profile (trace
arrays bit for bit) and the same bundle (all of it but ``created_by``, which records the
command line):

- a real ``entmtp`` process SIGKILLed once the first per-prompt resume file exists, then the
  same command again: the prompts finished before the kill are reused, not redone;
- a process SIGKILLed inside the search stage, held there deterministically: the test holds the
  Optuna journal's lock, so the process waits at its first journal write until it is killed;
- two shard processes at once (``--num-shards 2 --shard-index i``), or torchrun's
  ``WORLD_SIZE`` / ``RANK``, then the command without shard options merges.

Kill points are files that appear, never delays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._profile import Profile

runner = CliRunner()
ENTMTP = [sys.executable, "-c", "from entmtp.cli.app import main; main()"]
PROCESS_LIMIT_S = 600  # a safety net against a hung process, never an assertion on speed
PROMPTS = [
    "def add(a, b):",
    "Once upon a time",
    "The capital of France is",
    "import numpy as np\n",
    "hello world",
    "x = 1 + 2",
]


@dataclass(frozen=True)
class Calibration:
    model: Path
    heads: Path
    data: Path
    latency: Path
    reference: Path  # a finished, uninterrupted run folder

    def args(self, out: Path, *extra: str) -> list[str]:
        return [
            "calibrate", "--model", str(self.model), "--heads", str(self.heads),
            "--data", str(self.data), "--split", "all", "--prompts", "4",
            "--max-new-tokens", "12", "--batch-size", "1", "--latency", str(self.latency),
            "--schedule-trials", "5", "--out", str(out), *extra,
        ]


@pytest.fixture(scope="module")
def calib(tiny_model_dir, tiny_medusa_dir, tmp_path_factory) -> Calibration:
    root = tmp_path_factory.mktemp("calibrate-inputs")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    latency = LatencyModel.cpu_like().save(root / "latency.json")
    setup = Calibration(tiny_model_dir, tiny_medusa_dir, data, latency, root / "reference")
    invoke(setup.args(setup.reference))
    return setup


# -- running the command --------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def one_thread_for_the_module():
    """The reference run (a module fixture) and every comparison run use one torch thread."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def invoke(args: list[str], *, env: dict[str, str | None] | None = None):
    result = runner.invoke(app, args, env={"WORLD_SIZE": None, "RANK": None, **(env or {})})
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def start(args: list[str], log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    # Same thread count as the in-process runs: float reductions depend on it, and the tests
    # compare profiles bit for bit.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    with open(log, "wb") as sink:  # a file, not a pipe: a full pipe would block the process
        return subprocess.Popen([*ENTMTP, *args], stdout=sink, stderr=subprocess.STDOUT,
                                env=env)


def kill_when(proc: subprocess.Popen, ready, log: Path) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds; fail if it exits before that."""
    deadline = time.monotonic() + PROCESS_LIMIT_S
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before the kill point:\n{log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("never reached the kill point")
        time.sleep(0.01)
    proc.kill()
    proc.wait(timeout=PROCESS_LIMIT_S)


def finish(proc: subprocess.Popen, log: Path) -> None:
    assert proc.wait(timeout=PROCESS_LIMIT_S) == 0, log.read_text(errors="replace")


# -- comparing runs -------------------------------------------------------------------------
def temp_files(run: Path) -> set[Path]:
    return set(run.rglob(".*.tmp"))


def stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_ino, info.st_mtime_ns


def assert_same_profile(path: Path, reference: Path) -> None:
    got, want = Profile.load(path), Profile.load(reference)
    assert asdict(got.meta) == asdict(want.meta)
    assert [t.prompt_index for t in got.traces] == [t.prompt_index for t in want.traces]
    for a, b in zip(got.traces, want.traces, strict=True):
        assert (a.prompt_id, a.prompt_length) == (b.prompt_id, b.prompt_length)
        assert a.entropy.dtype == b.entropy.dtype and a.ranks.dtype == b.ranks.dtype
        assert np.array_equal(a.entropy, b.entropy)
        assert np.array_equal(a.ranks, b.ranks)


def bundle_json(run: Path) -> dict:
    obj = json.loads((run / "bundle.json").read_text())
    del obj["created_by"]  # the command line and version that wrote it
    return obj


def assert_same_run(run: Path, reference: Path) -> None:
    assert_same_profile(run / "profile.npz", reference / "profile.npz")
    assert bundle_json(run) == bundle_json(reference)


# -- tests ----------------------------------------------------------------------------------
def test_reference_run_is_complete(calib):
    ref = calib.reference
    for name in ("profile.npz", "latency.json", "front.json", "bundle.json", "report.md"):
        assert (ref / name).is_file(), name
    assert len(list((ref / "shards" / "0-of-1").glob("prompt-*.npz"))) == 4
    assert Profile.load(ref / "profile.npz").num_positions > 0
    assert not temp_files(ref)


@pytest.mark.slow
def test_killed_while_profiling_resumes_to_the_same_bundle(calib, tmp_path):
    run, log = tmp_path / "run", tmp_path / "killed.log"
    prompt_files = run / "shards" / "0-of-1"
    proc = start(calib.args(run), log)
    kill_when(proc, lambda: any(prompt_files.glob("prompt-*.npz")), log)
    before_kill = {p.name: stamp(p) for p in prompt_files.glob("prompt-*.npz")}
    assert before_kill
    leftovers = temp_files(run)  # a kill inside an atomic write may leave its temp file

    invoke(calib.args(run))

    assert {p.name: stamp(p) for p in prompt_files.glob("prompt-*.npz")
            if p.name in before_kill} == before_kill, "finished prompts were profiled again"
    assert len(list(prompt_files.glob("prompt-*.npz"))) == 4
    assert_same_run(run, calib.reference)
    assert temp_files(run) <= leftovers


@pytest.mark.slow
def test_killed_in_the_search_stage_reuses_the_profile(calib, tmp_path):
    run, log = tmp_path / "run", tmp_path / "killed.log"
    run.mkdir()
    # The profile stage is done (as the reference run left it), so this process goes straight
    # to the search stage without loading the model.
    (run / "profile.npz").write_bytes((calib.reference / "profile.npz").read_bytes())
    journal = run / "study.log"
    lock = Path(f"{journal}.lock")  # Optuna's JournalFileSymlinkLock: held while it exists
    os.symlink(journal, lock)
    args = calib.args(run, "--storage", f"journal:{journal}")
    proc = start(args, log)
    # Once the storage is opened (the journal file exists) and the latency stage is done, the
    # search's first journal write waits for the lock: the process cannot get past it, so it is
    # inside the search stage when killed.
    kill_when(proc, lambda: journal.exists() and (run / "latency.json").exists(), log)
    assert not (run / "front.json").exists() and not (run / "bundle.json").exists()
    profile_stamp = stamp(run / "profile.npz")
    leftovers = temp_files(run)
    lock.unlink()

    result = invoke(args)

    assert "profile: reusing" in result.output
    assert stamp(run / "profile.npz") == profile_stamp
    assert_same_run(run, calib.reference)
    assert temp_files(run) <= leftovers


def test_sqlite_storage_gives_the_in_memory_bundle(calib, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "profile.npz").write_bytes((calib.reference / "profile.npz").read_bytes())
    database = tmp_path / "studies.db"
    invoke(calib.args(run, "--storage", f"sqlite:///{database}"))
    assert_same_run(run, calib.reference)
    import optuna

    summaries = optuna.get_all_study_summaries(f"sqlite:///{database}")
    schedule = [s for s in summaries if s.study_name.endswith("schedule")]
    assert [s.n_trials for s in schedule] == [5], [(s.study_name, s.n_trials) for s in summaries]


def test_rerun_removes_temp_files_a_killed_write_left(calib, tmp_path):
    run = tmp_path / "run"
    shards = run / "shards" / "0-of-1"
    shards.mkdir(parents=True)
    (run / "profile.npz").write_bytes((calib.reference / "profile.npz").read_bytes())
    stale = [run / ".bundle.json.k1ll3d.tmp", run / ".front.json.k1ll3d.tmp",
             shards / ".prompt-0000001.npz.k1ll3d.tmp"]
    for path in stale:
        path.write_bytes(b"partial")
    invoke(calib.args(run))
    assert_same_run(run, calib.reference)
    assert not temp_files(run)


@pytest.mark.slow
def test_two_shards_at_once_merge_to_the_single_process_profile(calib, tmp_path):
    """Shard 0 in its own process while shard 1 runs in this one, into one run folder."""
    run, log = tmp_path / "run", tmp_path / "shard0.log"
    proc = start(calib.args(run, "--num-shards", "2", "--shard-index", "0"), log)
    invoke(calib.args(run, "--num-shards", "2", "--shard-index", "1"))
    finish(proc, log)
    shard_traces = [Profile.load(run / f"profile-shard{i}-of-2.npz").traces for i in (0, 1)]
    indices = [{t.prompt_index for t in traces} for traces in shard_traces]
    assert indices[0] and indices[1] and not indices[0] & indices[1]

    # Without shard options the command merges (unless the shard that finished last already
    # did), then runs the latency and search stages.
    invoke(calib.args(run))

    assert_same_run(run, calib.reference)
    assert not temp_files(run)


def test_torchrun_environment_shards_merge_to_the_single_process_profile(calib, tmp_path):
    run = tmp_path / "run"
    result = invoke(calib.args(run), env={"WORLD_SIZE": "2", "RANK": "0"})
    assert (run / "profile-shard0-of-2.npz").is_file()
    assert not (run / "profile.npz").exists(), result.output  # waits for shard 1
    invoke(calib.args(run), env={"WORLD_SIZE": "2", "RANK": "1"})
    assert (run / "profile-shard1-of-2.npz").is_file()
    invoke(calib.args(run))
    assert_same_run(run, calib.reference)
