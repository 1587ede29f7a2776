"""Multi-objective Optuna search over tree shapes, for latency where size alone does not decide.

A trial picks a maximum depth ``D``, a width cap ``w_d`` per depth and a node budget ``n``, then
builds the most probable prefixes under those caps level by level (a depth-``d`` prefix may join
only if its parent did and fewer than ``w_d`` depth-``d`` prefixes joined before it; the first
``n`` of the result in greedy order are kept, which stays prefix-closed). Objectives: expected
accept length (maximize) and modelled step latency (minimize); sampler: seeded NSGA-II.

``storage`` may be an Optuna storage URL (``sqlite:///x.db``) or ``journal:PATH`` for a
``JournalStorage`` on a ``JournalFileBackend``, which lets several worker processes share one
study (the study is opened with ``load_if_exists=True``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from entmtp.core import EntmtpError

from ._acceptance import PrefixTable, prefix_table
from ._candidate import DEFAULT_STUDY_NAME, TreeCandidate
from ._greedy import _tree_from_rows
from ._latency import LatencyModel
from ._storage import import_optuna, open_storage


@contextlib.contextmanager
def _quiet_optuna(optuna) -> Iterator[None]:
    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(previous)


class ShapeBuilder:
    """Builds the capped tree of a trial from one ``PrefixTable``, vectorized over prefixes."""

    def __init__(self, table: PrefixTable) -> None:
        self.table = table
        self.levels = [
            np.flatnonzero(table.depths == d) for d in range(1, table.max_depth + 1)
        ]  # rows of each depth, in greedy order

    def rows(self, depth: int, widths: Sequence[int], num_nodes: int) -> np.ndarray:
        """Table rows of the tree: depth <= ``depth``, at most ``widths[d-1]`` nodes at depth d,
        the first ``num_nodes`` of those in greedy order."""
        chosen = np.zeros(self.table.num_prefixes, dtype=bool)
        for d in range(min(depth, len(self.levels))):
            level = self.levels[d]
            if d:
                level = level[chosen[self.table.parents[level]]]
            chosen[level[: max(int(widths[d]), 0)]] = True
        return np.flatnonzero(chosen)[: max(int(num_nodes), 0)]


def _suggest_shape(trial, *, max_depth: int, max_nodes: int) -> tuple[int, list[int], int]:
    depth = trial.suggest_int("depth", 1, max_depth)
    # Every width is suggested (a fixed search space suits NSGA-II); the ones past ``depth``
    # are simply unused.
    widths = [
        trial.suggest_int(f"width_{d}", 1, max_nodes, log=True) for d in range(1, max_depth + 1)
    ]
    nodes = trial.suggest_int("nodes", 1, max_nodes, log=True)
    return depth, widths, nodes


def _shape_of(params: dict[str, Any], max_depth: int) -> tuple[int, list[int], int] | None:
    try:
        depth = int(params["depth"])
        widths = [int(params.get(f"width_{d}", 0)) for d in range(1, max_depth + 1)]
        nodes = int(params["nodes"])
    except (KeyError, TypeError, ValueError):
        return None
    return depth, widths, nodes


def search_tree_shapes(
    ranks: np.ndarray,
    latency: LatencyModel,
    *,
    max_nodes: int,
    n_trials: int,
    seed: int = 0,
    storage: str | None = None,
    study_name: str | None = None,
    topk: int | Sequence[int] | None = None,
    max_depth: int | None = None,
    show_progress: bool = False,
) -> list[TreeCandidate]:
    """Run ``n_trials`` NSGA-II trials over tree shapes; return one candidate per distinct tree
    over all completed trials of the study (earlier runs and other workers included), each
    rebuilt and scored on ``ranks`` and ``latency``."""
    table = prefix_table(ranks, max_depth=max_depth, topk=topk)
    return search_tree_shapes_on_table(
        table,
        latency,
        max_nodes=max_nodes,
        n_trials=n_trials,
        seed=seed,
        storage=storage,
        study_name=study_name,
        show_progress=show_progress,
    )


def search_tree_shapes_on_table(
    table: PrefixTable,
    latency: LatencyModel,
    *,
    max_nodes: int,
    n_trials: int,
    seed: int = 0,
    storage: str | None = None,
    study_name: str | None = None,
    show_progress: bool = False,
) -> list[TreeCandidate]:
    """``search_tree_shapes`` on a precomputed ``PrefixTable``."""
    if int(max_nodes) < 1:
        raise EntmtpError(f"max_nodes must be >= 1, got {max_nodes}")
    if int(n_trials) < 0:
        raise EntmtpError(f"n_trials must be >= 0, got {n_trials}")
    max_depth = table.max_depth
    if max_depth == 0 or table.num_prefixes == 0:
        return []
    if n_trials == 0 and storage is None:
        return []
    optuna = import_optuna()
    builder = ShapeBuilder(table)

    def evaluate(shape: tuple[int, list[int], int]) -> tuple[np.ndarray, float, float]:
        rows = builder.rows(*shape)
        depth = int(table.depths[rows].max(initial=0))
        ms = float(latency.step_ms(len(rows), depth))
        return rows, table.expected_accept_length(rows), ms

    def objective(trial) -> tuple[float, float]:
        _, accept, ms = evaluate(_suggest_shape(trial, max_depth=max_depth, max_nodes=max_nodes))
        return accept, ms

    with _quiet_optuna(optuna):
        population = int(min(50, max(8, n_trials // 5)))
        sampler = optuna.samplers.NSGAIISampler(population_size=population, seed=seed)
        opened = open_storage(storage)
        try:
            study = optuna.create_study(
                storage=opened,
                sampler=sampler,
                study_name=study_name or (DEFAULT_STUDY_NAME if opened is not None else None),
                directions=["maximize", "minimize"],
                load_if_exists=True,
            )
        except EntmtpError:
            raise
        except Exception as err:
            raise EntmtpError(
                f"cannot open Optuna storage {storage!r} ({type(err).__name__}: {err}); use "
                "journal:PATH or a valid database URL"
            ) from err
        if n_trials:
            study.optimize(objective, n_trials=int(n_trials), show_progress_bar=show_progress)
        trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))

    candidates: list[TreeCandidate] = []
    seen: set[tuple] = set()
    for trial in trials:
        shape = _shape_of(trial.params, max_depth)
        if shape is None:
            continue
        rows, accept, ms = evaluate(shape)
        if len(rows) == 0:
            continue
        tree = _tree_from_rows(table, rows)
        if tree.paths in seen:
            continue
        seen.add(tree.paths)
        candidates.append(TreeCandidate(tree, accept, ms, "optuna"))
    return candidates
