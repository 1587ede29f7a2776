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
hold those measurements; ``prepare_cost(d)`` / ``fused_empty_cost(d)`` read them, falling back
to the scalar fields (the deepest value, kept for readers of older files) when absent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._atomic import atomic_write_json
from ._errors import EntmtpError

LATENCY_FORMAT = "entmtp-latency"


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
        if fused_by_depth and fused is None:
            raise EntmtpError(
                "latency model has fused_empty_ms_by_depth but no fused_empty_ms: give both"
            )
        object.__setattr__(self, "fused_empty_ms", fused)
        object.__setattr__(self, "prepare_ms_by_depth", prepare_by_depth)
        object.__setattr__(self, "fused_empty_ms_by_depth", fused_by_depth)
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "verify_ms", verify)

    def step_ms(self, num_nodes: int | np.ndarray, depth: int | np.ndarray) -> float | np.ndarray:
        """Modelled ms of one draft+verify step; extrapolates linearly past the last count."""
        n = np.asarray(num_nodes, dtype=np.float64)
        x = np.asarray(self.nodes, dtype=np.float64)
        y = np.asarray(self.verify_ms, dtype=np.float64)
        out = np.interp(n, x, y)
        if len(x) >= 2:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            out = np.where(n > x[-1], y[-1] + slope * (n - x[-1]), out)
        out = out + self.depth_ms * np.asarray(depth, dtype=np.float64)
        return float(out) if np.ndim(out) == 0 else out

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
        """Synthetic CPU: the decode-forward times DESIGN.md measured for SmolLM2-135M on 2 cores
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
        if self.fused_empty_ms is None:  # optional: absent means the heads cannot be fused
            del out["fused_empty_ms"]
        for name in ("prepare_ms_by_depth", "fused_empty_ms_by_depth"):
            if out[name]:
                out[name] = list(out[name])
            else:  # optional: absent means one value for every depth
                del out[name]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LatencyModel:
        if not isinstance(obj, dict) or obj.get("format", LATENCY_FORMAT) != LATENCY_FORMAT:
            raise EntmtpError("not an entmtp latency model (expected format 'entmtp-latency')")
        try:
            return cls(
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
            )
        except (KeyError, TypeError, ValueError) as err:
            raise EntmtpError(f"latency model JSON is missing or has a bad field: {err}") from err

    def save(self, path: str | os.PathLike) -> Path:
        return atomic_write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> LatencyModel:
        path = Path(path)
        try:
            obj = json.loads(path.read_text())
        except FileNotFoundError as err:
            raise EntmtpError(f"latency file {path} does not exist") from err
        except (OSError, json.JSONDecodeError) as err:
            raise EntmtpError(f"latency file {path} is unreadable or not JSON: {err}") from err
        return cls.from_json(obj)


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
