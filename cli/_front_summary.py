"""What `entmtp pareto` shows of a run's front.json: the front summarized in a few rows with the
chosen trees marked, the schedule in words, the replayed comparison, and the data of its plot.

The terminal gets the summary; ``--full`` every row of every front. The plot puts each chosen
tree on the all-positions front's scale (scored on every calibration position, as the front's
trees are), so a chosen tree on that front sits on its curve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table

from entmtp.calibrate import RunDir
from entmtp.core import EntmtpError, hardware_label
from entmtp.treesearch import (
    Bundle,
    EntropyEstimator,
    LatencyModel,
    Profile,
    Schedule,
    Tree,
    expected_accept_length,
    load_bundle,
)

# Tree sizes the summary shows besides the first, last, fastest and chosen trees.
SUMMARY_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)
STATIC_NOTE = ("One static tree: switching trees by entropy did not beat it beyond the "
               "noise (report.md says which check).")


def tokens_per_second(candidate: dict) -> float:
    latency = candidate["latency_ms"]
    return 1000.0 * candidate["expected_accept_length"] / latency if latency else 0.0


def bucket_label(edges: Sequence[float], index: int) -> str:
    """Entropy bucket ``index`` of ``edges`` in words: ``entropy < 0.37 nats``."""
    low = edges[index - 1] if index > 0 else None
    high = edges[index] if index < len(edges) else None
    if low is None and high is None:
        return "every entropy"
    if low is None:
        return f"entropy < {high:.2f} nats"
    if high is None:
        return f"entropy >= {low:.2f} nats"
    return f"entropy {low:.2f}-{high:.2f} nats"


def entropy_range(schedule: Schedule, index: int) -> str:
    """The estimates tree ``index`` of ``schedule`` serves, in words: ``[low, high)`` nats of
    its signal, or every step for a one-tree schedule."""
    if len(schedule.trees) == 1:
        return "every step"
    signal = schedule.signal.replace("_", " ")
    low = schedule.thresholds[index - 1] if index > 0 else None
    high = schedule.thresholds[index] if index < len(schedule.thresholds) else None
    if low is not None and high is not None and low >= high:
        return f"never chosen ({signal} thresholds {low:.2f} = {high:.2f} nats)"
    if low is None:
        return f"{signal} < {high:.2f} nats"
    if high is None:
        return f"{signal} >= {low:.2f} nats"
    return f"{low:.2f} <= {signal} < {high:.2f} nats"


def front_schedule(front: dict) -> Schedule:
    """The chosen schedule recorded in front.json."""
    part = front["schedule"]
    trees = tuple(Tree.from_json(paths) for paths in part["trees"])
    estimator = EntropyEstimator.from_json(part.get("estimator", {"kind": "last"}))
    return Schedule(trees, tuple(part["thresholds"]), estimator,
                    part.get("signal", "base_entropy"))


def _table(title: str) -> Table:
    """A table without borders: a title line, a header line, its rows."""
    return Table(title=title, title_justify="left", box=None, pad_edge=False,
                 header_style="bold")


def _nodes(count: int) -> str:
    return f"{count} node{'' if count == 1 else 's'}"


def _paths(candidate: dict) -> tuple | None:
    try:
        return Tree.from_json(candidate["paths"]).paths
    except (KeyError, EntmtpError):  # a front written without paths (or bad ones): no match
        return None


@dataclass
class ChosenTree:
    index: int
    tree: Tree
    serves: str  # the estimates it serves, in words
    latency_ms: float | None = None  # scored on all calibration positions (None: not scored)
    accept_length: float | None = None
    own_latency_ms: float | None = None  # the bundle's figures on the positions it serves
    own_accept_length: float | None = None
    front_row: int | None = None  # its row on the all-positions front, if on it


@dataclass
class FrontView:
    """A run's front.json (and bundle, profile, latency model where present), ready to show."""

    front: dict
    schedule: Schedule
    chosen: list[ChosenTree]
    bundle: Bundle | None
    latency: LatencyModel | None

    @property
    def task(self) -> str:
        return str(self.front.get("task", "?"))

    @property
    def static(self) -> bool:
        """The bundle's schedule is its best static tree (``Bundle.schedule_is_best_static``)."""
        return self.bundle is not None and self.bundle.schedule_is_best_static

    def plain_ms(self) -> float | None:
        """The plain (autoregressive) step's ms: the replay's, else the latency model's."""
        rate = self.front["schedule"]["replayed"].get("autoregressive_tokens_per_second")
        if isinstance(rate, (int, float)) and rate > 0:
            return 1000.0 / rate
        if self.latency is not None and self.latency.autoregressive_ms > 0:
            return self.latency.autoregressive_ms
        return None

    def marks(self) -> dict[int, list[str]]:
        """Notes per row of the all-positions front: chosen trees, best static, fastest."""
        rows = self.front["front"]
        marks: dict[int, list[str]] = {}
        static = _paths(self.front["best_static"])
        for i, candidate in enumerate(rows):
            for tree in self.chosen:
                if tree.front_row == i:
                    marks.setdefault(i, []).append(f"tree {tree.index}")
            if static is not None and _paths(candidate) == static:
                marks.setdefault(i, []).append("best static")
        if rows:
            fastest = max(range(len(rows)), key=lambda i: tokens_per_second(rows[i]))
            marks.setdefault(fastest, []).append("fastest")
        return marks


def load_view(run: RunDir, front: dict, *, score: bool) -> FrontView:
    """``score``: put each chosen tree off the all-positions front on its scale, from the
    run's profile and latency model (a plot needs it; the terminal does not)."""
    schedule = front_schedule(front)
    bundle = load_bundle(run.bundle) if run.bundle.exists() else None
    # the latency model: for scoring, or for the plain step where the replay lacks its rate
    needed = score or "autoregressive_tokens_per_second" not in front["schedule"]["replayed"]
    latency = LatencyModel.load(run.latency) if needed and run.latency.exists() else None
    rows = {_paths(c): i for i, c in reversed(list(enumerate(front["front"])))}
    chosen = []
    for i, tree in enumerate(schedule.trees):
        item = ChosenTree(i, tree, entropy_range(schedule, i), front_row=rows.get(tree.paths))
        if item.front_row is not None:
            on_front = front["front"][item.front_row]
            item.latency_ms = on_front["latency_ms"]
            item.accept_length = on_front["expected_accept_length"]
        if bundle is not None and i < len(bundle.tree_stats) and bundle.trees[i] == tree:
            item.own_latency_ms = bundle.tree_stats[i].latency_ms
            item.own_accept_length = bundle.tree_stats[i].expected_accept_length
        chosen.append(item)
    if score and any(c.front_row is None for c in chosen) and latency is not None \
            and run.profile.exists():
        ranks = Profile.load(run.profile).ranks()
        for item in chosen:
            if item.front_row is None:
                item.latency_ms = float(latency.tree_ms(item.tree))
                item.accept_length = expected_accept_length(item.tree, ranks)
    return FrontView(front, schedule, chosen, bundle, latency)


# -- the terminal -----------------------------------------------------------------------------
def summary_rows(front: Sequence[dict], marks: dict[int, list[str]]) -> list[int]:
    """The rows of a front shown by default: the first and last, the marked ones, and the one
    nearest each of ``SUMMARY_SIZES`` nodes (within a factor 1.5; a front may skip sizes), in
    front order."""
    if not front:
        return []
    keep = {0, len(front) - 1, *marks}
    for size in SUMMARY_SIZES:
        nearest = min(range(len(front)),
                      key=lambda i: abs(math.log(max(front[i]["num_nodes"], 1) / size)))
        if size / 1.5 <= front[nearest]["num_nodes"] <= size * 1.5:
            keep.add(nearest)
    return sorted(keep)


def front_table(title: str, front: Sequence[dict], *, rows: Sequence[int] | None = None,
                marks: dict[int, list[str]] | None = None) -> Table:
    """The front's rows (``rows``: which; None: all) with their notes."""
    marks = marks or {}
    table = _table(title)
    for name in ("nodes", "depth", "accepted/step", "step ms", "tokens/s"):
        table.add_column(name, justify="right")
    table.add_column("source" if rows is None else "note", justify="left")
    for i in range(len(front)) if rows is None else rows:
        c = front[i]
        note = ", ".join(marks.get(i, []))
        if rows is None:
            note = ", ".join(part for part in (c.get("source", ""), note) if part)
        table.add_row(str(c["num_nodes"]), str(c["depth"]), f"{c['expected_accept_length']:.3f}",
                      f"{c['latency_ms']:.2f}", f"{tokens_per_second(c):.1f}", note)
    return table


def bucket_table(front: dict) -> Table:
    """One row per entropy bucket: its front's size and its fastest tree."""
    edges = front.get("bucket_edges", [])
    table = _table("fronts of the entropy buckets (--full: their rows)")
    table.add_column("positions")
    for name in ("trees", "fastest", "accepted/step", "tokens/s"):
        table.add_column(name, justify="right")
    for i, bucket in enumerate(front.get("bucket_fronts", [])):
        if not bucket:
            table.add_row(bucket_label(edges, i), "0", "", "", "")
            continue
        best = max(bucket, key=tokens_per_second)
        table.add_row(bucket_label(edges, i), str(len(bucket)), _nodes(best["num_nodes"]),
                      f"{best['expected_accept_length']:.2f}", f"{tokens_per_second(best):.1f}")
    return table


def schedule_heading(view: FrontView) -> str:
    schedule = view.schedule
    if len(schedule.trees) == 1:
        tree = schedule.trees[0]
        return (f"chosen schedule: tree 0 ({_nodes(tree.num_nodes)}, depth {tree.depth}) at "
                "every step")
    return (f"chosen schedule: {len(schedule.trees)} trees by "
            f"{schedule.signal.replace('_', ' ')}; estimate: {schedule.estimator.describe()}")


def schedule_table(view: FrontView) -> Table | None:
    """The trees of a switching schedule, each with the estimates it serves and its figures on
    the positions it serves; None for a one-tree schedule (its heading says it all)."""
    if len(view.schedule.trees) == 1:
        return None
    table = _table(schedule_heading(view))
    table.add_column("tree", justify="right")
    table.add_column("serves")
    for name in ("nodes", "depth", "accepted/step", "step ms"):
        table.add_column(name, justify="right")
    for item in view.chosen:
        own = item.own_accept_length is not None
        table.add_row(str(item.index), item.serves, str(item.tree.num_nodes),
                      str(item.tree.depth), f"{item.own_accept_length:.2f}" if own else "",
                      f"{item.own_latency_ms:.1f}" if own else "")
    return table


def replay_table(view: FrontView) -> Table:
    """The replayed tokens/s of the schedule beside the best static tree, the references,
    the oracle and plain decoding."""
    front = view.front
    rows = [("entmtp schedule", front["schedule"]["replayed"]["tokens_per_second"]),
            ("best static tree", front["best_static"]["replayed"]["tokens_per_second"])]
    rows += [(f"{r['name']} (static)", r["replayed_tokens_per_second"])
             for r in front.get("references", []) if "replayed_tokens_per_second" in r]
    rows.append(("oracle (hindsight bound)", front["oracle"]["replayed"]["tokens_per_second"]))
    plain_ms = view.plain_ms()
    plain = 1000.0 / plain_ms if plain_ms else None
    if plain is not None:
        rows.append(("plain decoding", plain))
    table = _table("replayed on the calibration traces")
    table.add_column("decoding")
    table.add_column("tokens/s", justify="right")
    if plain is not None:
        table.add_column("vs plain", justify="right")
    for label, rate in rows:
        cells = [label, f"{rate:.2f}"] + ([f"{rate / plain:.2f}x"] if plain is not None else [])
        table.add_row(*cells)
    return table


# -- the plot ---------------------------------------------------------------------------------
def plot_title(view: FrontView) -> str:
    """Two lines: what was searched, on what; what the schedule replays at."""
    first = f"Pareto fronts of draft trees, task {view.task}"
    hardware = (view.bundle.hardware if view.bundle is not None else
                view.latency.hardware if view.latency is not None else {})
    if view.bundle is not None:
        heads = view.bundle.heads
        first += f": {view.bundle.model.name}, {heads.num_heads} {heads.type} heads"
    if hardware:  # the model is named above
        machine = hardware_label({**hardware, "model": None}, "unnamed hardware")
        first += f"\nstep times of {machine}"
    count = len(view.schedule.trees)
    rate = view.front["schedule"]["replayed"]["tokens_per_second"]
    second = (f"chosen schedule: {count} tree{'s' if count != 1 else ''}, {rate:.1f} tokens/s "
              f"replayed (best static tree "
              f"{view.front['best_static']['replayed']['tokens_per_second']:.1f})")
    plain_ms = view.plain_ms()
    if plain_ms:
        second += f", plain decoding {1000.0 / plain_ms:.1f} tokens/s"
    return f"{first}\n{second}"


def plot_inputs(view: FrontView) -> dict:
    """The keyword arguments of ``plot_fronts`` for this run (all but the path)."""
    front = view.front
    edges = front.get("bucket_edges", [])
    series = [{"label": "front, all positions",
               "points": [(c["latency_ms"], c["expected_accept_length"]) for c in front["front"]]}]
    for i, bucket in enumerate(front.get("bucket_fronts", [])):
        series.append({"label": f"front, {bucket_label(edges, i)}",
                       "points": [(c["latency_ms"], c["expected_accept_length"]) for c in bucket]})
    references = [{"label": f"{r['name']} (Medusa's tree)", "latency_ms": r["latency_ms"],
                   "expected_accept_length": r["expected_accept_length"]}
                  for r in front.get("references", [])]
    chosen = []
    for item in view.chosen:
        label = f"chosen tree {item.index}: {_nodes(item.tree.num_nodes)}, {item.serves}"
        if item.accept_length is not None:
            point = (item.latency_ms, item.accept_length)
        elif item.own_accept_length is not None:  # no profile to score it on all positions
            point = (item.own_latency_ms, item.own_accept_length)
            label += " (on the positions it serves)"
        else:
            continue
        if view.static:
            label += " = best static tree"
        chosen.append({"label": label, "tag": item.index, "latency_ms": point[0],
                       "expected_accept_length": point[1]})
    plain_ms = view.plain_ms()
    plain = None if plain_ms is None else {
        "label": f"plain decoding (1 token/step): {1000.0 / plain_ms:.1f} tokens/s",
        "latency_ms": plain_ms}
    notes = []
    if view.static:
        notes.append(STATIC_NOTE)
    if len(view.chosen) > 1 and any(item.accept_length is not None for item in view.chosen):
        notes.append("Chosen trees are drawn scored on all calibration positions, as the black "
                     "front's trees are (the table of `entmtp pareto` gives each on the "
                     "positions it serves).")
    note = "\n".join(notes) or None
    return {"series": series, "references": references, "chosen": chosen, "plain": plain,
            "title": plot_title(view), "note": note}
