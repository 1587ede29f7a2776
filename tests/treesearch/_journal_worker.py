"""One search worker process for tests/treesearch/test_parallel_workers.py.

    python _journal_worker.py {schedule|shapes} STORAGE STUDY SEED TRIALS OUT_JSON WORKER

Runs ``calibrate_schedule`` or ``search_tree_shapes`` on a fixed synthetic profile (``inputs``)
against a shared Optuna storage and writes what it found to OUT_JSON (atomically). Test-side
instrumentation: every trial this process runs gets the user attribute ``worker = WORKER`` (by
wrapping ``optuna.Study.optimize``'s objective), so a test can tell the processes' trials apart.
"""

from __future__ import annotations

import functools
import sys

from entmtp.core import atomic_write_json
from entmtp.treesearch._greedy import best_tree
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._profile import Profile
from entmtp.treesearch._synthetic import synthetic_profile
from entmtp.treesearch._tree import Tree

WORKER_ATTR = "worker"
CANDIDATE_SIZES = (1, 3, 7, 15, 31, 63)
SHAPE_MAX_NODES = 48


def inputs() -> tuple[Profile, list[Tree], LatencyModel]:
    """The profile, candidate trees and latency model every worker (and the test) uses."""
    profile = synthetic_profile(num_traces=8, positions=192, num_heads=4, topk=6, seed=5)
    candidates = [best_tree(profile.ranks(), n) for n in CANDIDATE_SIZES]
    return profile, candidates, LatencyModel.cpu_like(depth_ms=1.5)


def tag_trials(worker: str) -> None:
    """Make every ``Study.optimize`` in this process label its trials with ``worker``."""
    import optuna

    original = optuna.Study.optimize

    @functools.wraps(original)
    def optimize(self, func, *args, **kwargs):
        def tagged(trial):
            trial.set_user_attr(WORKER_ATTR, worker)
            return func(trial)

        return original(self, tagged, *args, **kwargs)

    optuna.Study.optimize = optimize


def run_schedule(storage: str, study: str, seed: int, trials: int) -> dict:
    from entmtp.treesearch._schedule_search import calibrate_schedule

    profile, candidates, latency = inputs()
    found = calibrate_schedule(profile, candidates, latency, n_trials=trials, seed=seed,
                               storage=storage, study_name=study)
    return {
        "trees": [list(map(list, tree.paths)) for tree in found.schedule.trees],
        "thresholds": list(found.schedule.thresholds),
        "estimator": found.schedule.estimator.to_json(),
        "tokens_per_second": found.result.tokens_per_second,
        "n_trials": found.study.n_trials,
        "best_trial": found.study.best_trial,
        "best_value": found.study.best_value,
    }


def run_shapes(storage: str, study: str, seed: int, trials: int) -> dict:
    from entmtp.treesearch._shape_search import search_tree_shapes

    profile, _, latency = inputs()
    found = search_tree_shapes(profile.ranks(), latency, max_nodes=SHAPE_MAX_NODES,
                               n_trials=trials, seed=seed, storage=storage, study_name=study)
    return {
        "candidates": [
            {"paths": list(map(list, c.tree.paths)),
             "expected_accept_length": float(c.expected_accept_length),
             "latency_ms": float(c.latency_ms)}
            for c in found
        ],
    }


def main(argv: list[str]) -> None:
    mode, storage, study, seed, trials, out, worker = argv
    tag_trials(worker)
    run = {"schedule": run_schedule, "shapes": run_shapes}[mode]
    result = run(storage, study, int(seed), int(trials))
    result["worker"] = worker
    atomic_write_json(out, result)


if __name__ == "__main__":
    main(sys.argv[1:])
