"""Scale-out of the Optuna searches: worker processes sharing one study.

- a worker SIGKILLed mid-study leaves a journal that the next worker continues;
- two workers running at once on one journal study both finish, the study holds the trials of
  both (told apart by a ``worker`` user attribute that ``_journal_worker.py`` sets), and the last
  one to finish built its result from all of them;
- an SQLite URL works for a single host; storages that cannot be opened are one ``EntmtpError``.

Kill points are states, never delays: the test waits until the study holds some completed
trials, stops the worker, and kills it only while it holds no journal lock.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._acceptance import expected_accept_length
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._pareto import pareto_front
from entmtp.treesearch._replay import best_static, oracle_replay, replay
from entmtp.treesearch._schedule import Schedule
from entmtp.treesearch._schedule_search import calibrate_schedule
from entmtp.treesearch._shape_search import search_tree_shapes
from entmtp.treesearch._tree import Tree

optuna = pytest.importorskip("optuna")

WORKER_SCRIPT = Path(__file__).with_name("_journal_worker.py")
PROCESS_LIMIT_S = 300  # a safety net against a hung worker, never an assertion on speed
POLL_S = 0.05


def _load_worker_module():
    spec = importlib.util.spec_from_file_location("_journal_worker", WORKER_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


worker = _load_worker_module()


# -- processes ------------------------------------------------------------------------------
def start_worker(tmp: Path, mode: str, storage: str, study: str, *, seed: int, trials: int,
                 name: str) -> tuple[subprocess.Popen, Path]:
    out = tmp / f"{name}.json"
    log = open(tmp / f"{name}.log", "wb")  # a file, not a pipe: a full pipe would block
    proc = subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT), mode, storage, study, str(seed), str(trials),
         str(out), name],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
    )
    log.close()
    return proc, out


def finish(proc: subprocess.Popen, tmp: Path, name: str) -> dict:
    rc = proc.wait(timeout=PROCESS_LIMIT_S)
    log = (tmp / f"{name}.log").read_text(errors="replace")
    assert rc == 0, f"worker {name} exited {rc}:\n{log}"
    return json.loads((tmp / f"{name}.json").read_text())


def _is_stopped(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: SIGSTOP has no observable state; proceed
    return state in ("T", "t")


def kill_outside_journal_lock(proc: subprocess.Popen, journal: Path) -> None:
    """SIGKILL ``proc`` at a moment it holds no journal lock (else the next worker would wait
    out Optuna's stale-lock grace period): stop it, look, and let it run on if it holds one."""
    lock = Path(f"{journal}.lock")
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        while not _is_stopped(proc.pid):
            time.sleep(0.001)
        if not os.path.lexists(lock):
            break
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=PROCESS_LIMIT_S)


def journal_study(journal: Path, study: str):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    storage = JournalStorage(JournalFileBackend(str(journal)))
    return optuna.load_study(study_name=study, storage=storage)


def completed(trials) -> list:
    return [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]


def wait_for_completed_trials(proc: subprocess.Popen, journal: Path, study: str, count: int,
                              tmp: Path, name: str) -> None:
    deadline = time.monotonic() + PROCESS_LIMIT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp / f"{name}.log").read_text(errors="replace")
        try:
            if len(completed(journal_study(journal, study).get_trials(deepcopy=False))) >= count:
                return
        except KeyError:  # the study is not created yet
            pass
        time.sleep(POLL_S)
    pytest.fail(f"worker {name} did not complete {count} trials")


# -- checks ---------------------------------------------------------------------------------
def check_trial_numbers(trials) -> None:
    """One study, one numbering: every trial of every process has its own number."""
    assert sorted(t.number for t in trials) == list(range(len(trials)))


def check_schedule(result: dict, study_trials) -> None:
    """The worker's schedule is a valid schedule over the candidates, replays to what it
    reported, sits between the best static tree and the oracle, and comes from the best trial
    of everything in the study it saw."""
    profile, candidates, latency = worker.inputs()
    trees = tuple(Tree.from_paths(paths) for paths in result["trees"])
    assert all(tree in candidates for tree in trees)
    thresholds = tuple(result["thresholds"])
    assert all(b > a for a, b in zip(thresholds, thresholds[1:], strict=False))
    schedule = Schedule(trees, thresholds, EntropyEstimator.from_json(result["estimator"]))
    replayed = replay(profile, schedule, latency)
    assert replayed.tokens_per_second == pytest.approx(result["tokens_per_second"], rel=1e-12)
    _, static = best_static(profile, candidates, latency)
    oracle = oracle_replay(profile, candidates, latency)
    assert static.tokens_per_second <= replayed.tokens_per_second
    assert replayed.tokens_per_second <= oracle.tokens_per_second * (1 + 1e-12)
    seen = completed(study_trials)
    if result["best_trial"] is not None:
        best = max(seen, key=lambda t: t.value)
        by_number = {t.number: t for t in seen}
        assert result["best_value"] == pytest.approx(by_number[result["best_trial"]].value)
        if result["n_trials"] == len(seen):  # it saw the whole study: its best is the best
            assert result["best_value"] == pytest.approx(best.value)


def check_shape_candidates(result: dict) -> set[tuple]:
    """Each candidate is a valid tree scored exactly as a brute-force rescoring says."""
    profile, _, latency = worker.inputs()
    ranks = profile.ranks()
    seen: set[tuple] = set()
    for item in result["candidates"]:
        tree = Tree.from_paths(item["paths"])
        assert 1 <= tree.num_nodes <= worker.SHAPE_MAX_NODES
        assert item["expected_accept_length"] == pytest.approx(
            expected_accept_length(tree, ranks), rel=1e-9)
        assert item["latency_ms"] == pytest.approx(latency.tree_ms(tree), rel=1e-12)
        assert tree.paths not in seen, "a tree is listed twice"
        seen.add(tree.paths)
    return seen


# -- tests ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_killed_schedule_worker_leaves_a_study_the_next_worker_continues(tmp_path):
    journal = tmp_path / "study.log"
    storage, study = f"journal:{journal}", "entmtp-schedule-kill"
    first, first_out = start_worker(tmp_path, "schedule", storage, study, seed=0,
                                    trials=100_000, name="first")
    wait_for_completed_trials(first, journal, study, 4, tmp_path, "first")
    kill_outside_journal_lock(first, journal)
    assert first.returncode == -signal.SIGKILL
    assert not first_out.exists()

    before = journal_study(journal, study).get_trials(deepcopy=False)
    done_before = len(completed(before))
    assert done_before >= 4

    second, _ = start_worker(tmp_path, "schedule", storage, study, seed=1, trials=6,
                             name="second")
    result = finish(second, tmp_path, "second")

    after = journal_study(journal, study).get_trials(deepcopy=False)
    check_trial_numbers(after)
    assert len(after) == len(before) + 6  # a trial cut short by the kill stays, not COMPLETE
    done = completed(after)
    assert result["n_trials"] == len(done) == done_before + 6
    assert Counter(t.user_attrs["worker"] for t in done) == {"first": done_before, "second": 6}
    check_schedule(result, after)


@pytest.mark.slow
def test_two_schedule_workers_share_one_journal_study(tmp_path):
    journal = tmp_path / "study.log"
    storage, study = f"journal:{journal}", "entmtp-schedule-pair"
    procs = [start_worker(tmp_path, "schedule", storage, study, seed=seed, trials=8, name=name)
             for seed, name in ((1, "a"), (2, "b"))]
    results = [finish(proc, tmp_path, name) for (proc, _), name in zip(procs, "ab", strict=True)]

    trials = journal_study(journal, study).get_trials(deepcopy=False)
    check_trial_numbers(trials)
    done = completed(trials)
    assert len(done) == 16
    assert Counter(t.user_attrs["worker"] for t in done) == {"a": 8, "b": 8}
    # Each saw at least its own trials; the one that finished last saw every trial of both.
    assert min(r["n_trials"] for r in results) >= 8
    assert max(r["n_trials"] for r in results) == 16
    for result in results:
        check_schedule(result, trials)


@pytest.mark.slow
def test_two_shape_workers_share_one_journal_study(tmp_path):
    journal = tmp_path / "study.log"
    storage, study = f"journal:{journal}", "entmtp-shapes-pair"
    procs = [start_worker(tmp_path, "shapes", storage, study, seed=seed, trials=10, name=name)
             for seed, name in ((1, "a"), (2, "b"))]
    results = [finish(proc, tmp_path, name) for (proc, _), name in zip(procs, "ab", strict=True)]

    trials = journal_study(journal, study).get_trials(deepcopy=False)
    check_trial_numbers(trials)
    done = completed(trials)
    assert Counter(t.user_attrs["worker"] for t in done) == {"a": 10, "b": 10}

    # Reading the study without new trials gives the candidates of all 20 trials.
    profile, _, latency = worker.inputs()
    everything = search_tree_shapes(profile.ranks(), latency, max_nodes=worker.SHAPE_MAX_NODES,
                                    n_trials=0, storage=storage, study_name=study)
    all_trees = {c.tree.paths for c in everything}
    found = [check_shape_candidates(result) for result in results]
    assert all(trees <= all_trees for trees in found)
    assert max(found, key=len) == all_trees  # the last to finish saw the other's trials
    assert len(journal_study(journal, study).get_trials(deepcopy=False)) == 20
    front = pareto_front(everything)
    assert front
    for kept in front:
        assert not any(
            c.expected_accept_length >= kept.expected_accept_length
            and c.latency_ms <= kept.latency_ms
            and (c.expected_accept_length, c.latency_ms)
            != (kept.expected_accept_length, kept.latency_ms)
            for c in everything
        )


@pytest.mark.slow
def test_sqlite_url_serves_both_searches_and_runs_continue(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    profile, candidates, latency = worker.inputs()
    first = calibrate_schedule(profile, candidates, latency, n_trials=3, seed=0, storage=url,
                               study_name="schedule")
    second = calibrate_schedule(profile, candidates, latency, n_trials=3, seed=1, storage=url,
                                study_name="schedule")
    assert (first.study.n_trials, second.study.n_trials) == (3, 6)
    trials = optuna.load_study(study_name="schedule", storage=url).get_trials(deepcopy=False)
    assert len(completed(trials)) == 6
    result = {
        "trees": [list(map(list, t.paths)) for t in second.schedule.trees],
        "thresholds": list(second.schedule.thresholds),
        "estimator": second.schedule.estimator.to_json(),
        "tokens_per_second": second.result.tokens_per_second,
        "n_trials": second.study.n_trials,
        "best_trial": second.study.best_trial,
        "best_value": second.study.best_value,
    }
    check_schedule(result, trials)

    kwargs = {"max_nodes": worker.SHAPE_MAX_NODES, "storage": url, "study_name": "shapes"}
    search_tree_shapes(profile.ranks(), latency, n_trials=4, seed=0, **kwargs)
    both = search_tree_shapes(profile.ranks(), latency, n_trials=4, seed=1, **kwargs)
    shape_trials = optuna.load_study(study_name="shapes", storage=url).get_trials()
    assert len(completed(shape_trials)) == 8
    check_shape_candidates({"candidates": [
        {"paths": list(map(list, c.tree.paths)),
         "expected_accept_length": c.expected_accept_length, "latency_ms": c.latency_ms}
        for c in both
    ]})


@pytest.mark.parametrize("storage", [
    "bogus://x",
    "postgresql://nobody@127.0.0.1:1/x",  # loopback only: no driver, or nobody listening
    "sqlite:////nonexistent-entmtp-folder/sub/x.db",
    "journal:",
    "   ",
    "journal:{file}/x.log",  # a folder that is a regular file
])
@pytest.mark.parametrize("search", ["schedule", "shapes"])
def test_unopenable_storage_is_one_line_error(tmp_path, storage, search):
    a_file = tmp_path / "plain-file"
    a_file.write_text("not a folder")
    storage = storage.replace("{file}", str(a_file))
    profile, candidates, latency = worker.inputs()
    with pytest.raises(EntmtpError) as err:
        if search == "schedule":
            calibrate_schedule(profile, candidates, latency, n_trials=1, storage=storage)
        else:
            search_tree_shapes(profile.ranks(), latency, max_nodes=8, n_trials=1,
                               storage=storage)
    message = str(err.value)
    assert message and "\n" not in message
    assert a_file.read_text() == "not a folder"
