"""Verification latency as a function of a tree's size and depth.

``step_ms(num_nodes, depth) = verify(num_nodes) + depth_ms * depth``: ``verify`` is piecewise
linear through the measured node counts (a forward over ``num_nodes + 1`` tokens plus the
per-step drafting and bookkeeping that every tree pays), and ``depth_ms`` is the extra cost of
each tree level (Hydra drafts level by level; Medusa's is near zero). ``num_nodes == 0`` is a
step that drafts nothing (one token through the decoding step); ``autoregressive_ms`` is one plain
decode step without heads, the baseline for speedups. ``prepare_ms`` is what a draft-entropy
schedule adds to a step whose tree is empty: it runs the heads (Medusa: all of them in one
projection; Hydra: head 1) to read head 1's entropy before choosing, and an empty tree does not
reuse them (any other tree drafts from those results, so pays nothing extra).

``fused_empty_ms`` (``None``: the heads cannot be fused) is an empty-tree step whose one
vocabulary projection also computes the draft heads' logits for the next step (Medusa heads
sharing the base lm_head: rows ``[hidden; head 1..D features]`` through that one matrix, then
head 1's entropy for the next choice). A draft-entropy schedule then pays, for an empty-tree
step, ``fused_empty_ms`` plus ``prepare_ms`` unless the previous step of the trajectory was an
empty-tree step too (whose fused projection already prepared this one); see the replay.

Both depend on how many heads a schedule prepares: Medusa heads project one row per level of
the schedule's deepest tree, and on a CPU each extra row of a vocabulary projection costs (a
depth-1 schedule's fused step is almost a plain step; a depth-4 one pays three more rows).
``prepare_ms_by_depth`` / ``fused_empty_ms_by_depth`` (entry ``d - 1``: trees of depth <= ``d``)
hold those measurements; ``prepare_cost(d)`` / ``fused_empty_cost(d)`` read them. Without them
the scalar ``prepare_ms`` / ``fused_empty_ms`` serves every depth; with them the scalar is their
last entry (the deepest schedule's), set from them, and a file holds the list alone.

A draft-entropy schedule prepares for its deepest tree ``D`` on every step, so its drafted step
of a depth-``d`` tree projects ``D - d`` Medusa rows more than the step the curve prices (which
drafts ``d``): ``head_row_ms``, the per-row slope of those lists, prices them (the replay adds
``(D - d) * head_row_ms``). A one-tree schedule reads no entropies, so its step skips the base
entropies the curve's steps compute (``entropy_readout_ms``, measured on the static engine).

**Noise.** A measured model keeps every point it was fitted from (``points``: a step of one
kind at one context length, over interleaved rounds) with its spread: ``iqr_ms``, the
interquartile range of the point's rounds. A point's figure is the trimmed mean of ``rounds``
steps, so its standard error is ``se = iqr_ms / 1.349 / sqrt(rounds)`` (1.349 interquartile
ranges per standard deviation of a normal spread). A fitted figure (a knot of ``verify_ms``,
``autoregressive_ms``, a fused empty step) averages the points of its kind, so its standard
error is that of their mean. Two figures differ **beyond noise** when they differ by more than
``NOISE_SIGMAS`` (3) standard errors of their difference, ``3 * sqrt(se_a**2 + se_b**2)``.

``findings`` (the checks, ``warnings`` their messages, written into every file) hold on any
machine: a fused empty step is not cheaper than the plain empty-tree step; the empty-tree step
is not cheaper than an autoregressive step and costs at most ``DECODER_OVERHEAD`` (15%) more
(the speculative decoder's bookkeeping; the eager H200 step showed 10%), each beyond noise; the
step time does not fall below that of any smaller tree beyond noise; a point's rounds spread by
at most ``MAX_RELATIVE_SPREAD`` (a quarter) of its time, median over the points; every point has
at least ``MIN_SPREAD_ROUNDS`` (4) rounds, or its spread means nothing. A model with
no measured spread (``points`` empty: files measured before the profiler kept it) is checked
with zero noise and says so.

**Padded widths.** A step's time need not grow with the tree: a CPU matmul's time may depend on
the row count's alignment, so on a CPU a 15-node tree (16 rows) could verify faster than an
11-node one. The runtime can verify an ``n``-node tree at the width of a larger one (padding rows
that change no result, runtime/_static_step.py), so ``padded_nodes`` (optional; node count ->
the measured node count it is verified at, only counts that pad) makes such a dip unreachable.
``padding_table`` derives it from the measured curve: ``n`` pads to the cheapest measured count
``m >= n`` whose step is cheaper than ``n``'s beyond noise (``NOISE_SIGMAS`` standard errors of
the difference; a strict saving when no spread was measured), the smallest such ``m`` on ties.
Past the last measured count the curve extrapolates upward, so nothing pads there. ``step_ms``
prices a tree at its padded count plus its own depth term (the effective curve), and the
monotonicity check runs on that effective curve; ``verify_ms`` stays the raw measured curve.
The profiler also times the padded steps themselves (points with ``padded_to``, never fitted),
in the same rounds as the steps of their width: a check flags a padded step that costs more,
beyond noise, than the unpadded step of its width and depth measured at the same contexts (than
its price where none was), i.e. padding that does not deliver the wider step's time.

``noise_gain_bound`` is the gain over the best static tree that the noise alone could produce:
``1 + NOISE_SIGMAS * sqrt(2) * eps`` with ``eps`` the median relative standard error of the
``verify_ms`` knots (two step costs, each off by its noise). The schedule search ships a
switching schedule only above it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from entmtp.core import (
    STATIC_ENGINE,
    EntmtpError,
    atomic_write_json,
    check_values,
    read_json,
    require,
    short,
)

LATENCY_FORMAT = "entmtp-latency"
NOISE_SIGMAS = 3.0  # "beyond noise": more than this many standard errors of a difference
IQR_PER_SIGMA = 1.349  # interquartile ranges per standard deviation of a normal spread
DECODER_OVERHEAD = 0.15  # the empty-tree step's bookkeeping allowed over a plain step
MAX_RELATIVE_SPREAD = 0.25  # median over the points of iqr_ms / ms before "too noisy"
MIN_SPREAD_ROUNDS = 4  # fewer rounds than this give no interquartile range worth the name
STEP_KINDS = ("tree", "autoregressive", "prepare", "fused_empty")
MAX_STEP_MS = 600_000.0  # ten minutes: no decoding step of any model takes longer
MIN_STEP_MS = 1e-3  # a microsecond: no decoding step is faster (and 1/ms must stay finite)
MAX_TREE_NODES = 65_536  # no draft tree verifies more tokens than this in one step
LATENCY_FIX = "measure it again with `entmtp latency`"


@dataclass(frozen=True)
class LatencyPoint:
    """One measured point: ``rounds`` interleaved steps of one kind at one context length."""

    step: str  # one of STEP_KINDS
    context: int  # KV-cache length the step ran at
    ms: float  # trimmed mean of the rounds: the figure the model is fitted to
    median_ms: float
    iqr_ms: float  # interquartile range of the rounds: the spread of one step
    rounds: int
    nodes: int = 0  # tree steps: the tree's node count
    depth: int = 0  # tree steps: the tree's depth; prepare / fused_empty: the draft depth
    padded_to: int = 0  # tree steps verified at a padded width: that node count (0: unpadded)

    def __post_init__(self) -> None:
        if self.step not in STEP_KINDS:
            raise EntmtpError(f"latency point step {self.step!r}: use one of "
                              f"{', '.join(STEP_KINDS)}")
        values = (self.ms, self.median_ms, self.iqr_ms)
        if not all(math.isfinite(float(v)) and float(v) >= 0 for v in values) or self.rounds < 1:
            raise EntmtpError("latency point times must be finite and non-negative, rounds >= 1")

    @property
    def standard_error_ms(self) -> float:
        """Standard error of ``ms`` (see the module doc)."""
        return self.iqr_ms / IQR_PER_SIGMA / math.sqrt(self.rounds)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.padded_to:  # optional: absent means the tree's own width
            del out["padded_to"]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LatencyPoint:
        return cls(step=str(obj["step"]), context=int(obj["context"]), ms=float(obj["ms"]),
                   median_ms=float(obj["median_ms"]), iqr_ms=float(obj["iqr_ms"]),
                   rounds=int(obj["rounds"]), nodes=int(obj.get("nodes", 0)),
                   depth=int(obj.get("depth", 0)), padded_to=int(obj.get("padded_to", 0)))


@dataclass(frozen=True)
class LatencyFinding:
    """A failed check: its message and the points a re-measurement should time again."""

    message: str
    nodes: tuple[int, ...] = ()  # tree points with these node counts
    steps: tuple[tuple[str, int], ...] = ()  # (step, depth) of other points; depth -1: any
    everything: bool = False  # every point (the whole measurement was too noisy)

    def involves(self, point: LatencyPoint) -> bool:
        if self.everything:
            return True
        if point.step == "tree":
            return point.nodes in self.nodes
        return any(point.step == step and depth in (-1, point.depth)
                   for step, depth in self.steps)


@dataclass(frozen=True)
class LatencyModel:
    nodes: tuple[int, ...]  # measured node counts (excluding the root), ascending, first is 0
    verify_ms: tuple[float, ...]  # step time at each node count (depth-independent part)
    autoregressive_ms: float  # one plain decode step without heads
    depth_ms: float = 0.0  # extra time per tree level
    prepare_ms: float = 0.0  # draft-entropy schedules: heads run before an empty tree's step
    fused_empty_ms: float | None = None  # empty step that also prepares the next (None: no fusion)
    prepare_ms_by_depth: tuple[float, ...] = ()  # [d - 1]: prepare for trees of depth <= d
    fused_empty_ms_by_depth: tuple[float, ...] = ()  # [d - 1]: fused empty step, depth <= d
    hardware: dict[str, Any] = field(default_factory=dict)
    measurements: tuple[tuple[int, int, float], ...] = ()  # raw (nodes, depth, ms) fitted
    points: tuple[LatencyPoint, ...] = ()  # every measured point with its spread (): none kept
    padded_nodes: tuple[tuple[int, int], ...] = ()  # (n, m): n-node trees verified at m > n nodes

    def __post_init__(self) -> None:
        nodes = tuple(int(n) for n in self.nodes)
        verify = tuple(float(v) for v in self.verify_ms)
        if not nodes or len(nodes) != len(verify):
            raise EntmtpError("latency model needs one verify_ms per node count")
        if nodes[0] != 0 or any(b <= a for a, b in zip(nodes, nodes[1:], strict=False)):
            raise EntmtpError("latency model node counts must start at 0 and ascend strictly")
        fused = None if self.fused_empty_ms is None else float(self.fused_empty_ms)
        prepare_by_depth = tuple(float(v) for v in self.prepare_ms_by_depth)
        fused_by_depth = tuple(float(v) for v in self.fused_empty_ms_by_depth)
        values = (*verify, float(self.autoregressive_ms), float(self.depth_ms),
                  float(self.prepare_ms), *(() if fused is None else (fused,)),
                  *prepare_by_depth, *fused_by_depth)
        if not all(np.isfinite(values)) or min(values) < 0:
            raise EntmtpError("latency model times must be finite and non-negative")
        prepare = float(self.prepare_ms)
        if prepare_by_depth:  # the scalar is the deepest entry: given once, in the list
            if prepare not in (0.0, prepare_by_depth[-1]):
                raise EntmtpError("latency model: prepare_ms is prepare_ms_by_depth's last "
                                  "entry: give the list alone")
            prepare = prepare_by_depth[-1]
        if fused_by_depth:
            if fused not in (None, fused_by_depth[-1]):
                raise EntmtpError("latency model: fused_empty_ms is fused_empty_ms_by_depth's "
                                  "last entry: give the list alone")
            fused = fused_by_depth[-1]
        object.__setattr__(self, "prepare_ms", prepare)
        object.__setattr__(self, "fused_empty_ms", fused)
        object.__setattr__(self, "points", tuple(self.points))
        object.__setattr__(self, "prepare_ms_by_depth", prepare_by_depth)
        object.__setattr__(self, "fused_empty_ms_by_depth", fused_by_depth)
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "verify_ms", verify)
        padded = tuple(sorted((int(n), int(m)) for n, m in dict(self.padded_nodes).items()))
        for n, m in padded:
            if not 1 <= n < m or m not in nodes:
                raise EntmtpError(f"latency model pads {n} nodes to {m}: padded_nodes maps a "
                                  "node count n >= 1 to a larger measured node count")
        object.__setattr__(self, "padded_nodes", padded)

    def step_ms(self, num_nodes: int | np.ndarray, depth: int | np.ndarray) -> float | np.ndarray:
        """Modelled ms of one draft+verify step: the raw curve at the tree's padded node count
        (``padded_count``) plus the tree's own depth term."""
        verify = raw_verify_ms(self, self.padded_count(num_nodes))
        out = verify + self.depth_ms * np.asarray(depth, dtype=np.float64)
        return float(out) if np.ndim(out) == 0 else out

    @property
    def padding(self) -> dict[int, int]:
        """``padded_nodes`` as a dict: node count -> node count it is verified at."""
        return dict(self.padded_nodes)

    @property
    def padding_summary(self) -> str:
        """The table in words ("11-14->15 nodes"; "" when nothing pads)."""
        return padding_summary(self.padding)

    def padded_count(self, num_nodes: int | np.ndarray) -> np.ndarray:
        """The node count a tree of ``num_nodes`` nodes is verified at (float array)."""
        n = np.asarray(num_nodes, dtype=np.float64)
        out = n.copy()
        for count, padded in self.padded_nodes:
            out = np.where(n == count, float(padded), out)
        return out

    def tree_ms(self, tree) -> float:
        return float(self.step_ms(tree.num_nodes, tree.depth))

    def prepare_cost(self, draft_depth: int) -> float:
        """ms to run the heads before a choice, for a schedule whose deepest tree has
        ``draft_depth`` levels (at least head 1 always runs)."""
        return _by_depth(self.prepare_ms_by_depth, draft_depth, self.prepare_ms)

    def fused_empty_cost(self, draft_depth: int) -> float | None:
        """ms of a fused empty-tree step preparing trees of depth <= ``draft_depth``; None when
        the heads cannot be fused."""
        if self.fused_empty_ms is None:
            return None
        return _by_depth(self.fused_empty_ms_by_depth, draft_depth, self.fused_empty_ms)

    @property
    def head_row_ms(self) -> float:
        """ms per head row a preparation projects: the least-squares slope over draft depth of
        ``prepare_ms_by_depth`` (of ``fused_empty_ms_by_depth`` where no preparation was timed,
        all zeros), at least 0; 0 without figures at two depths or more (Hydra prepares head 1
        whatever the depth). A slope, not a difference of neighbours, so that one noisy depth
        does not set it."""
        rows = (self.prepare_ms_by_depth if any(self.prepare_ms_by_depth)
                else self.fused_empty_ms_by_depth)
        if len(rows) < 2:
            return 0.0
        depths = np.arange(1, len(rows) + 1, dtype=np.float64)
        centred = depths - depths.mean()
        slope = float(centred @ (np.asarray(rows) - np.mean(rows)) / (centred @ centred))
        return max(slope, 0.0)

    @property
    def entropy_readout_ms(self) -> float:
        """ms a step saves when its schedule reads no entropies (a one-tree schedule): on the
        static engine (``hardware["engine"]``) the empty-tree step's figure (``verify_ms[0]``,
        profiled with its base entropy) less the autoregressive step's (the same step without
        it, timed in the same rounds), at least 0. A depth-``d`` tree's step reads ``d + 1``
        rows' entropies, so this one row's figure is a lower bound on its saving. 0 on other
        engines, whose empty-tree step also pays the eager decoder's bookkeeping."""
        if self.hardware.get("engine") != STATIC_ENGINE:
            return 0.0
        return max(self.verify_ms[0] - self.autoregressive_ms, 0.0)

    # -- noise -----------------------------------------------------------------------------
    @property
    def spread_measured(self) -> bool:
        return bool(self.points)

    @property
    def synthetic(self) -> bool:
        return str(self.hardware.get("kind", "")).startswith("synthetic")

    def figure_error_ms(self, step: str, *, nodes: int = 0, depth: int = -1) -> float:
        """Standard error of a fitted figure: that of the mean of its points (0.0: no points).

        ``step`` "tree": the ``verify_ms`` knot at ``nodes``; "autoregressive"; "prepare" /
        "fused_empty" at draft ``depth`` (-1: every depth, the scalar field).
        """
        if step == "tree":
            chosen = [p for p in self.points
                      if p.step == "tree" and p.nodes == nodes and not p.padded_to]
        else:
            chosen = [p for p in self.points
                      if p.step == step and (depth == -1 or p.depth == depth)]
        return _mean_and_error(chosen)[1] if chosen else 0.0

    def relative_noise(self) -> float | None:
        """Median relative standard error of the ``verify_ms`` knots (None: no spread)."""
        if not self.points:
            return None
        ratios = [self.figure_error_ms("tree", nodes=n) / v
                  for n, v in zip(self.nodes, self.verify_ms, strict=True) if v > 0]
        return float(np.median(ratios)) if ratios else 0.0

    def noise_gain_bound(self) -> float | None:
        """Gain over a static tree the noise alone could produce (None: no spread measured)."""
        eps = self.relative_noise()
        return None if eps is None else 1.0 + NOISE_SIGMAS * math.sqrt(2.0) * eps

    def relative_spread(self) -> float | None:
        """Median over the points of ``iqr_ms / ms`` (None: no spread measured)."""
        if not self.points:
            return None
        return float(np.median([p.iqr_ms / p.ms if p.ms > 0 else 0.0 for p in self.points]))

    def findings(self) -> list[LatencyFinding]:
        """The checks of the module doc that this model fails (empty: it passes)."""
        return list(_findings(self))

    @property
    def warnings(self) -> list[str]:
        return [f.message for f in self.findings()]

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_measurements(
        cls,
        measurements: Sequence[tuple[int, int, float]],
        *,
        autoregressive_ms: float,
        prepare_ms: float = 0.0,
        fused_empty_ms: float | None = None,
        prepare_ms_by_depth: Sequence[float] = (),
        fused_empty_ms_by_depth: Sequence[float] = (),
        hardware: dict[str, Any] | None = None,
    ) -> LatencyModel:
        """Least-squares fit of ``verify`` (one value per measured node count) and ``depth_ms``.

        Every measured node count becomes a knot; 0 is added (extrapolated flat) if missing.
        """
        rows = [(int(n), int(d), float(ms)) for n, d, ms in measurements]
        if not rows:
            raise EntmtpError("no latency measurements to fit")
        knots = sorted({n for n, _, _ in rows})
        verify, depth_ms = _fit_knots(rows, knots, fit_depth=len({d for _, d, _ in rows}) > 1)
        if depth_ms < 0:  # a depth term that helps would be positive: refit without it
            verify, depth_ms = _fit_knots(rows, knots, fit_depth=False)
        if knots[0] != 0:  # no step without a tree was measured: extend the first value flat
            knots, verify = [0, *knots], [verify[0], *verify]
        ordered = knots
        verify_ms = tuple(max(v, 0.0) for v in verify)
        return cls(
            nodes=tuple(ordered),
            verify_ms=verify_ms,
            autoregressive_ms=float(autoregressive_ms),
            depth_ms=depth_ms,
            prepare_ms=float(prepare_ms),
            fused_empty_ms=fused_empty_ms,
            prepare_ms_by_depth=tuple(prepare_ms_by_depth),
            fused_empty_ms_by_depth=tuple(fused_empty_ms_by_depth),
            hardware=dict(hardware or {}),
            measurements=tuple(rows),
        )

    @classmethod
    def gpu_like(
        cls, *, base_ms: float = 20.0, flat_until: int = 63, ms_per_node: float = 0.08,
        depth_ms: float = 0.3,
    ) -> LatencyModel:
        """Synthetic accelerator: flat while the tree fits the compute slack, then linear."""
        nodes = (0, flat_until, flat_until + 256)
        verify = (base_ms, base_ms, base_ms + 256 * ms_per_node)
        return cls(nodes, verify, autoregressive_ms=base_ms * 0.97, depth_ms=depth_ms,
                   hardware={"kind": "synthetic-gpu"})

    @classmethod
    def cpu_like(cls, *, depth_ms: float = 0.0) -> LatencyModel:
        """Synthetic CPU: the decode-forward times in docs/design.md for SmolLM2-135M on 2 cores
        (tokens 1, 4, 8, 16, 32, 64, 128 -> nodes 0, 3, 7, 15, 31, 63, 127)."""
        nodes = (0, 3, 7, 15, 31, 63, 127)
        verify = (85.0, 114.0, 149.0, 170.0, 195.0, 311.0, 504.0)
        return cls(nodes, verify, autoregressive_ms=83.0, depth_ms=depth_ms,
                   hardware={"kind": "synthetic-cpu"})

    # -- serialization ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["format"] = LATENCY_FORMAT
        out["nodes"] = list(self.nodes)
        out["verify_ms"] = list(self.verify_ms)
        out["measurements"] = [list(m) for m in self.measurements]
        # null: no spread was measured (files from before the profiler kept it)
        out["noise"] = {"points": [p.to_json() for p in self.points]} if self.points else None
        del out["points"]
        del out["padded_nodes"]
        if self.padded_nodes:  # optional: absent means every tree runs at its own width
            out["padded_nodes"] = {str(n): m for n, m in self.padded_nodes}
        out["warnings"] = self.warnings  # for a reader of the file: recomputed on load
        if self.fused_empty_ms is None:  # optional: absent means the heads cannot be fused
            del out["fused_empty_ms"]
        for scalar in ("prepare_ms", "fused_empty_ms"):
            by_depth = f"{scalar}_by_depth"
            if out[by_depth]:  # the list alone: its last entry is the scalar
                out[by_depth] = list(out[by_depth])
                del out[scalar]
            else:  # absent: the scalar serves every depth
                del out[by_depth]
        return out

    @classmethod
    def from_json(cls, obj: object, *, source: str = "latency model") -> LatencyModel:
        """Build a model from its JSON, refusing a malformed field or an implausible time."""
        fix = LATENCY_FIX
        check_values(obj, source=source, fix=fix)
        if not isinstance(obj, dict) or obj.get("format", LATENCY_FORMAT) != LATENCY_FORMAT:
            raise EntmtpError(f"{source}: not an entmtp latency model (expected format "
                              f"{LATENCY_FORMAT!r}): {fix}")
        number = (int, float)
        for key in ("nodes", "verify_ms"):
            values = require(obj, key, list, source=source, fix=fix)
            for i, value in enumerate(values):
                require({f"{key}[{i}]": value}, f"{key}[{i}]", int if key == "nodes" else number,
                        source=source, fix=fix)
        require(obj, "autoregressive_ms", number, source=source, fix=fix)
        for key in ("depth_ms", "prepare_ms"):
            if key in obj:
                require(obj, key, number, source=source, fix=fix)
        if obj.get("fused_empty_ms") is not None:
            require(obj, "fused_empty_ms", number, source=source, fix=fix)
        for key in ("prepare_ms_by_depth", "fused_empty_ms_by_depth", "measurements"):
            if key in obj:
                require(obj, key, list, source=source, fix=fix)
        for i, row in enumerate(obj.get("measurements", ())):
            if (not isinstance(row, list) or len(row) != 3
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in row[:2])
                    or isinstance(row[2], bool) or not isinstance(row[2], number)):
                raise EntmtpError(f"{source}: measurements[{i}]: {short(repr(row))} is not "
                                  f"[nodes, depth, ms]: {fix}")
        for scalar in ("prepare_ms", "fused_empty_ms"):
            if scalar in obj and f"{scalar}_by_depth" in obj:
                raise EntmtpError(f"{source}: holds both {scalar} and {scalar}_by_depth, whose "
                                  f"last entry it is: keep the list alone, or {fix}")
        if "hardware" in obj:
            require(obj, "hardware", dict, source=source, fix=fix)
        padded = require(obj, "padded_nodes", dict, source=source, fix=fix) \
            if "padded_nodes" in obj else {}
        for key, value in padded.items():
            if not (isinstance(key, str) and key.isdigit()) or isinstance(value, bool) \
                    or not isinstance(value, int):
                raise EntmtpError(f"{source}: padded_nodes: {short(repr(key))}: "
                                  f"{short(repr(value))} is not node count -> node count: {fix}")
        noise = obj.get("noise")
        if noise is not None:
            require(obj, "noise", dict, source=source, fix=fix)
            require(noise, "points", list, source=source, fix=fix, where="noise")
        try:
            model = cls(
                nodes=tuple(obj["nodes"]),
                verify_ms=tuple(obj["verify_ms"]),
                autoregressive_ms=float(obj["autoregressive_ms"]),
                depth_ms=float(obj.get("depth_ms", 0.0)),
                prepare_ms=float(obj.get("prepare_ms", 0.0)),
                fused_empty_ms=_optional_float(obj.get("fused_empty_ms")),
                prepare_ms_by_depth=tuple(obj.get("prepare_ms_by_depth", ())),
                fused_empty_ms_by_depth=tuple(obj.get("fused_empty_ms_by_depth", ())),
                hardware=dict(obj.get("hardware", {})),
                measurements=tuple(tuple(m) for m in obj.get("measurements", ())),
                points=tuple(LatencyPoint.from_json(p)
                             for p in (noise or {}).get("points", ())),
                padded_nodes=tuple((int(n), int(m)) for n, m in padded.items()),
            )
        except EntmtpError as err:
            raise EntmtpError(f"{source}: {err}: {fix}") from err
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
            raise EntmtpError(f"{source}: a field is missing or bad ({short(str(err))}): "
                              f"{fix}") from err
        _check_plausible(model, source)
        return model

    def save(self, path: str | os.PathLike) -> Path:
        return atomic_write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> LatencyModel:
        source = f"latency file {path}"
        return cls.from_json(read_json(path, source=source, fix=LATENCY_FIX), source=source)


def _check_plausible(model: LatencyModel, source: str) -> None:
    """Times that pass the schema but no measurement gives: a step of 0 ms, or of hours."""
    # A tree of n >= 1 nodes is at least one level deep, so its step costs verify + depth_ms.
    shortest = [("autoregressive_ms", model.autoregressive_ms),
                ("verify_ms[0]", model.verify_ms[0]),
                *((f"verify_ms[{i}] + depth_ms", v + model.depth_ms)
                  for i, v in enumerate(model.verify_ms) if i > 0)]
    for name, value in shortest:
        if value < MIN_STEP_MS:
            raise EntmtpError(f"{source}: {name}: a step cannot take {value:g} ms (less than "
                              f"{MIN_STEP_MS * 1000:g} microsecond): {LATENCY_FIX}")
    if model.nodes[-1] > MAX_TREE_NODES:
        raise EntmtpError(f"{source}: nodes: a tree of {model.nodes[-1]} nodes is beyond any "
                          f"draft tree (at most {MAX_TREE_NODES}): {LATENCY_FIX}")
    named = [("autoregressive_ms", model.autoregressive_ms),
             *((f"verify_ms[{i}]", v) for i, v in enumerate(model.verify_ms))]
    named += [("depth_ms", model.depth_ms), ("prepare_ms", model.prepare_ms),
              ("fused_empty_ms", model.fused_empty_ms or 0.0),
              *((f"prepare_ms_by_depth[{i}]", v) for i, v in enumerate(model.prepare_ms_by_depth)),
              *((f"fused_empty_ms_by_depth[{i}]", v)
                for i, v in enumerate(model.fused_empty_ms_by_depth))]
    for name, value in named:
        if value > MAX_STEP_MS:
            raise EntmtpError(f"{source}: {name}: {value:g} ms is not a decoding step time (more "
                              f"than {MAX_STEP_MS / 60_000:g} minutes): {LATENCY_FIX}")


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _by_depth(values: tuple[float, ...], draft_depth: int, fallback: float) -> float:
    """``values[d - 1]`` for ``d`` clamped to 1..len(values); ``fallback`` when empty."""
    if not values:
        return fallback
    return values[min(max(int(draft_depth), 1), len(values)) - 1]


def _fit_knots(
    rows: list[tuple[int, int, float]], knots: list[int], *, fit_depth: bool
) -> tuple[list[float], float]:
    """Least squares: ms = verify[knot of n] + depth_ms * d. Returns (verify per knot, depth_ms)."""
    position = {n: i for i, n in enumerate(knots)}
    design = np.zeros((len(rows), len(knots) + int(fit_depth)))
    for r, (n, d, _) in enumerate(rows):
        design[r, position[n]] = 1.0
        if fit_depth:
            design[r, -1] = d
    target = np.array([ms for _, _, ms in rows])
    solution, *_ = np.linalg.lstsq(design, target, rcond=None)
    depth_ms = float(solution[-1]) if fit_depth else 0.0
    return [float(v) for v in solution[: len(knots)]], depth_ms


def _beyond(low: float, high: float, error: float) -> bool:
    """``low`` is below ``high`` by more than ``NOISE_SIGMAS`` standard errors ``error``."""
    return high - low > NOISE_SIGMAS * error


def _findings(model: LatencyModel) -> Iterable[LatencyFinding]:
    noise = "" if model.points else " (no spread measured: any difference counts)"
    if not model.points and not model.synthetic:
        yield LatencyFinding(
            "no spread measured: this file predates the profiler's noise figures, so its checks "
            "count any difference; re-measure with `entmtp latency` on a quiet machine")
    fewest = min((p.rounds for p in model.points), default=MIN_SPREAD_ROUNDS)
    if fewest < MIN_SPREAD_ROUNDS:
        yield LatencyFinding(
            f"only {fewest} round(s) per point: too few to measure a spread, so the checks "
            f"treat a near-zero noise as real; measure with --repeats {MIN_SPREAD_ROUNDS} or "
            "more")
    spread = model.relative_spread()
    if spread is not None and spread > MAX_RELATIVE_SPREAD:
        yield LatencyFinding(
            f"too noisy: a step's rounds spread by {spread:.0%} of its time (median interquartile "
            f"range over the points; at most {MAX_RELATIVE_SPREAD:.0%}): the machine was busy; "
            "re-measure on a quiet machine", everything=True)
    empty = model.verify_ms[0]
    empty_se = model.figure_error_ms("tree", nodes=0)
    fused_depths = (list(range(1, len(model.fused_empty_ms_by_depth) + 1))
                    if model.fused_empty_ms_by_depth else [-1])
    if model.fused_empty_ms is not None:
        for depth in fused_depths:
            fused = model.fused_empty_cost(depth) if depth > 0 else model.fused_empty_ms
            error = math.hypot(model.figure_error_ms("fused_empty", depth=depth), empty_se)
            if _beyond(fused, empty, error):
                label = f" (draft depth {depth})" if depth > 0 else ""
                yield LatencyFinding(
                    f"fused empty step{label} {fused:.2f} ms is cheaper than the plain "
                    f"empty-tree step {empty:.2f} ms beyond noise ({NOISE_SIGMAS:.0f} standard "
                    f"errors: {NOISE_SIGMAS * error:.2f} ms){noise}; it does that step's work "
                    "and more", nodes=(0,), steps=(("fused_empty", depth),))
    ar = model.autoregressive_ms
    error = math.hypot(model.figure_error_ms("autoregressive"), empty_se)
    if _beyond(empty, ar, error):
        yield LatencyFinding(
            f"the empty-tree step {empty:.2f} ms is cheaper than an autoregressive step "
            f"{ar:.2f} ms beyond noise ({NOISE_SIGMAS * error:.2f} ms){noise}; it does that "
            "step's work and more", nodes=(0,), steps=(("autoregressive", -1),))
    elif _beyond(ar * (1 + DECODER_OVERHEAD), empty, error):
        yield LatencyFinding(
            f"the empty-tree step {empty:.2f} ms costs more than an autoregressive step "
            f"{ar:.2f} ms plus {DECODER_OVERHEAD:.0%} beyond noise ({NOISE_SIGMAS * error:.2f} "
            f"ms){noise}", nodes=(0,), steps=(("autoregressive", -1),))
    # The effective curve: each measured count at the count it is verified at (padded_nodes).
    padding = model.padding
    position = {n: i for i, n in enumerate(model.nodes)}
    verified = [padding.get(n, n) for n in model.nodes]
    effective = [model.verify_ms[position[m]] for m in verified]
    errors = [model.figure_error_ms("tree", nodes=m) for m in verified]
    falls = []
    for j in range(1, len(model.nodes)):
        # against every smaller tree: the costliest one may be too noisy to show a fall that a
        # quieter one shows
        worst = None
        for i in range(j):
            error = math.hypot(errors[j], errors[i])
            margin = effective[i] - effective[j] - NOISE_SIGMAS * error
            if _beyond(effective[j], effective[i], error) and (
                    worst is None or margin > worst[0]):
                worst = (margin, i, NOISE_SIGMAS * error)
        if worst is not None:
            _, i, tolerance = worst
            falls.append((model.nodes[i], model.nodes[j], effective[i], effective[j], tolerance))
    if falls:
        shown = "; ".join(f"{a} -> {b} nodes: {ma:.2f} -> {mb:.2f} ms (noise {tol:.2f})"
                          for a, b, ma, mb, tol in falls[:3])
        more = f"; {len(falls) - 3} more" if len(falls) > 3 else ""
        padded = " (at the padded widths the runtime verifies)" if padding else ""
        yield LatencyFinding(
            f"step time falls as the tree grows{padded}, beyond noise{noise}: {shown}{more}",
            nodes=tuple(sorted({n for a, b, *_ in falls for n in (a, b)})))
    dear = []
    for (n, depth, m), group in _padded_groups(model).items():
        measured, measured_error = _mean_and_error(group)
        # Against the unpadded step of that width and depth where one was measured at the same
        # contexts (the padded step should cost what it costs), else against the model's price.
        contexts = {p.context for p in group}
        same = [p for p in model.points if p.step == "tree" and not p.padded_to
                and p.nodes == m and p.depth == depth and p.context in contexts]
        if len(same) == len(group):
            priced, priced_error = _mean_and_error(same)
            against = f"the {m}-node step"
        else:
            priced = float(model.step_ms(n, depth))
            priced_error = model.figure_error_ms("tree", nodes=m)
            against = "priced"
        error = math.hypot(measured_error, priced_error)
        if _beyond(priced, measured, error):
            dear.append((n, depth, m, measured, priced, against, NOISE_SIGMAS * error))
    if dear:
        shown = "; ".join(f"{n} nodes (depth {d}) at {m}: {ms:.2f} ms, {against} {pr:.2f} "
                          f"(noise {tol:.2f})" for n, d, m, ms, pr, against, tol in dear[:3])
        yield LatencyFinding(
            f"a padded step costs more than the step it is priced at, beyond noise: {shown}",
            nodes=tuple(sorted({k for n, _, m, *_ in dear for k in (n, m)})))


def _mean_and_error(points: list[LatencyPoint]) -> tuple[float, float]:
    """Mean ms of ``points`` and its standard error."""
    mean = math.fsum(p.ms for p in points) / len(points)
    return mean, math.sqrt(math.fsum(p.standard_error_ms ** 2 for p in points)) / len(points)


def _padded_groups(model: LatencyModel) -> dict[tuple[int, int, int], list[LatencyPoint]]:
    """Points of padded steps by (nodes, depth, padded count), those the table still pads."""
    padding = model.padding
    groups: dict[tuple[int, int, int], list[LatencyPoint]] = {}
    for p in model.points:
        if p.step == "tree" and p.padded_to and padding.get(p.nodes) == p.padded_to:
            groups.setdefault((p.nodes, p.depth, p.padded_to), []).append(p)
    return groups


def raw_verify_ms(model: LatencyModel, num_nodes: int | np.ndarray) -> np.ndarray:
    """The measured curve (no padding, no depth term) at ``num_nodes``: piecewise linear
    through the knots, extrapolated linearly past the last count, never downwards (a last
    segment that falls, noise or a kernel's dip, would otherwise price large trees below
    zero)."""
    n = np.asarray(num_nodes, dtype=np.float64)
    x = np.asarray(model.nodes, dtype=np.float64)
    y = np.asarray(model.verify_ms, dtype=np.float64)
    out = np.interp(n, x, y)
    if len(x) >= 2:
        slope = max((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0)
        out = np.where(n > x[-1], y[-1] + slope * (n - x[-1]), out)
    return out


def raw_verify_error_ms(model: LatencyModel, num_nodes: int | np.ndarray) -> np.ndarray:
    """Standard error of ``raw_verify_ms``: a knot's ``figure_error_ms``, linearly interpolated
    between knots (the bound for errors that may be correlated; never below the quieter
    knot's), the last knot's past it."""
    n = np.asarray(num_nodes, dtype=np.float64)
    x = np.asarray(model.nodes, dtype=np.float64)
    se = np.array([model.figure_error_ms("tree", nodes=k) for k in model.nodes])
    return np.interp(n, x, se)


def padding_table(model: LatencyModel) -> dict[int, int]:
    """Node count -> the measured node count it is cheaper to verify at (see the module doc):
    for every ``n`` in ``1..nodes[-1]``, the measured ``m > n`` with the cheapest raw step
    among those cheaper than ``n``'s beyond noise (strictly cheaper without a spread), the
    smallest on ties; counts no such ``m`` exists for are left out."""
    knots = np.asarray(model.nodes, dtype=np.int64)
    knot_ms = raw_verify_ms(model, knots)
    knot_se = raw_verify_error_ms(model, knots)
    counts = np.arange(1, int(knots[-1]) + 1)
    count_ms = raw_verify_ms(model, counts)
    count_se = raw_verify_error_ms(model, counts)
    # [counts, knots]: the knot is a candidate for the count: larger and cheaper beyond noise
    saving = count_ms[:, None] - knot_ms[None, :]
    tolerance = NOISE_SIGMAS * np.hypot(count_se[:, None], knot_se[None, :])
    candidate = (knots[None, :] > counts[:, None]) & (saving > tolerance)
    priced = np.where(candidate, knot_ms[None, :], np.inf)
    best = np.argmin(priced, axis=1)  # the first (smallest) knot among equal prices
    padded = candidate.any(axis=1)
    return {int(n): int(knots[b]) for n, b, p in zip(counts, best, padded, strict=True) if p}


def with_padding(model: LatencyModel) -> LatencyModel:
    """``model`` with the ``padding_table`` of its measured curve."""
    return replace(model, padded_nodes=tuple(padding_table(model).items()))


def runtime_padding(latency: LatencyModel | None, *, pad: bool = True) -> dict[int, int] | None:
    """The padding table a runtime verifies a bundle's trees at: its latency model's (None: no
    model, a model without a table, or ``pad`` off)."""
    if not pad or latency is None or not latency.padded_nodes:
        return None
    return latency.padding


def padding_summary(padded_nodes: dict[int, int]) -> str:
    """"2->3, 11-14->15 nodes" (consecutive counts padded to one count as one range); "" for
    no padding."""
    runs: list[list[int]] = []  # [first, last, padded]
    for n, m in sorted(padded_nodes.items()):
        if runs and runs[-1][1] == n - 1 and runs[-1][2] == m:
            runs[-1][1] = n
        else:
            runs.append([n, n, m])
    if not runs:
        return ""
    return ", ".join(f"{a}->{m}" if a == b else f"{a}-{b}->{m}" for a, b, m in runs) + " nodes"
