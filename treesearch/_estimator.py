"""Running entropy estimators: the signal an entropy schedule switches trees on.

The estimate that chooses the tree at position ``i`` is a function of the entropies of
positions ``0..i`` of the same trajectory (the live decoder knows ``H_i`` before drafting, and a
step's accepted path reveals the entropies of every position it covers, in order).

Kinds:
- ``ema``: ``e_0 = H_0``, ``e_i = alpha * H_i + (1 - alpha) * e_{i-1}``, ``alpha`` in (0, 1];
- ``window``: mean of the last ``size`` entropies (fewer at the start of a trajectory);
- ``last``: ``e_i = H_i``.

``EntropyEstimator.estimates`` computes every position at once (offline replay);
``EntropyEstimator.new_state`` gives the online form the live decoder feeds token by token.
Both work in float64 and agree to ~1e-15 (``window`` and ``last`` bit for bit).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from entmtp.core import EntmtpError

ESTIMATOR_KINDS = ("ema", "window", "last")


@dataclass(frozen=True)
class EntropyEstimator:
    kind: str = "ema"
    alpha: float | None = None  # ema only: weight of the newest entropy, in (0, 1]
    size: int | None = None  # window only: number of most recent positions averaged, >= 1

    def __post_init__(self) -> None:
        if self.kind not in ESTIMATOR_KINDS:
            raise EntmtpError(
                f"estimator kind {self.kind!r} is unknown: use one of {', '.join(ESTIMATOR_KINDS)}"
            )
        if self.kind == "ema":
            alpha = _as_float(self.alpha, "estimator alpha")
            if not (0.0 < alpha <= 1.0):
                raise EntmtpError(f"estimator alpha is {alpha}: an ema needs 0 < alpha <= 1")
            object.__setattr__(self, "alpha", alpha)
        elif self.alpha is not None:
            raise EntmtpError(f"estimator alpha is set but kind is {self.kind!r}: drop alpha")
        if self.kind == "window":
            if isinstance(self.size, bool) or not isinstance(self.size, (int, np.integer)):
                raise EntmtpError(
                    f"estimator size is {self.size!r}: a window needs an integer size"
                )
            if self.size < 1:
                raise EntmtpError(f"estimator size is {self.size}: a window needs size >= 1")
            object.__setattr__(self, "size", int(self.size))
        elif self.size is not None:
            raise EntmtpError(f"estimator size is set but kind is {self.kind!r}: drop size")

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def ema(cls, alpha: float) -> EntropyEstimator:
        return cls("ema", alpha=alpha)

    @classmethod
    def window(cls, size: int) -> EntropyEstimator:
        return cls("window", size=size)

    @classmethod
    def last(cls) -> EntropyEstimator:
        return cls("last")

    # -- offline ---------------------------------------------------------------------------
    def estimates(
        self, entropy: np.ndarray, *, trace_starts: Sequence[int] | np.ndarray | None = None
    ) -> np.ndarray:
        """Estimate at every position: float64 ``[positions]``.

        ``trace_starts`` (ascending offsets, the first 0) marks where trajectories begin in a
        concatenation; the estimator restarts at each. None means one trajectory.
        """
        values = np.asarray(entropy, dtype=np.float64)
        if values.ndim != 1:
            raise EntmtpError(f"entropy must be 1-D, got shape {values.shape}")
        n = len(values)
        if n == 0:
            return values.copy()
        segment, offset = _segments(n, trace_starts)
        if self.kind == "last":
            return values.copy()
        if self.kind == "window":
            return _window_means(values, offset, self.size)
        return _ema(values, segment, offset, self.alpha)

    # -- online ----------------------------------------------------------------------------
    def new_state(self) -> EstimatorState:
        return EstimatorState(self)

    # -- serialization ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        if self.kind == "ema":
            return {"kind": "ema", "alpha": self.alpha}
        if self.kind == "window":
            return {"kind": "window", "size": self.size}
        return {"kind": self.kind}

    @classmethod
    def from_json(cls, obj: object) -> EntropyEstimator:
        if not isinstance(obj, dict) or "kind" not in obj:
            raise EntmtpError(f"estimator must be an object with a 'kind', got {obj!r}")
        expected = {"ema": {"alpha"}, "window": {"size"}, "last": set()}.get(obj["kind"])
        if expected is None:
            raise EntmtpError(
                f"estimator kind {obj['kind']!r} is unknown: use one of "
                f"{', '.join(ESTIMATOR_KINDS)}"
            )
        params = {k: v for k, v in obj.items() if k != "kind"}
        if set(params) != expected:
            raise EntmtpError(
                f"estimator {obj['kind']!r} takes parameters {sorted(expected)}, got "
                f"{sorted(params)}"
            )
        return cls(obj["kind"], **params)

    def describe(self) -> str:
        """The estimator in words, for reports and terminal output."""
        if self.kind == "ema":
            return f"exponential moving average (alpha {self.alpha:.4g})"
        if self.kind == "window":
            return f"mean of the last {self.size} values"
        return "the last value (no smoothing)"


class EstimatorState:
    """Online estimate: ``update`` with each new entropy in order; ``value`` is the estimate.

    Feeding ``H_0..H_i`` (in any chunking) gives ``estimator.estimates(H)[i]``.
    """

    def __init__(self, estimator: EntropyEstimator) -> None:
        self.estimator = estimator
        self._count = 0
        self._value = math.nan
        self._recent: deque[float] = deque(maxlen=estimator.size or 1)

    @property
    def count(self) -> int:
        """Entropies seen so far."""
        return self._count

    @property
    def value(self) -> float:
        if self._count == 0:
            raise EntmtpError("the entropy estimate is undefined before the first entropy")
        return self._value

    def update(self, values: Sequence[float] | np.ndarray | float) -> float:
        """Fold in the next entropies (oldest first); returns the new estimate."""
        kind = self.estimator.kind
        for raw in np.atleast_1d(np.asarray(values, dtype=np.float64)).tolist():
            if kind == "ema":
                alpha = self.estimator.alpha
                self._value = raw if self._count == 0 else alpha * raw + (1.0 - alpha) * self._value
            elif kind == "window":
                self._recent.append(raw)
                total = 0.0
                for v in self._recent:  # oldest first, the order the offline sum uses
                    total += v
                self._value = total / len(self._recent)
            else:
                self._value = raw
            self._count += 1
        return self.value


def _as_float(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise EntmtpError(f"{name} is {value!r}: it must be a number")
    out = float(value)
    if not math.isfinite(out):
        raise EntmtpError(f"{name} is {out}: it must be finite")
    return out


def _segments(
    n: int, trace_starts: Sequence[int] | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per position: trajectory id and offset inside the trajectory."""
    if trace_starts is None:
        return np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64)
    starts = np.asarray(trace_starts, dtype=np.int64)
    if starts.ndim != 1 or len(starts) == 0 or starts[0] != 0 or np.any(np.diff(starts) < 0):
        raise EntmtpError("trace_starts must be ascending offsets that begin at 0")
    if starts[-1] > n:
        raise EntmtpError(f"trace_starts reaches {starts[-1]} but there are {n} positions")
    lengths = np.diff(np.append(starts, n))
    segment = np.repeat(np.arange(len(starts), dtype=np.int64), lengths)
    offset = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    return segment, offset


def _window_means(values: np.ndarray, offset: np.ndarray, size: int) -> np.ndarray:
    # Oldest first, starting from 0.0: the same float additions EstimatorState performs.
    total = np.zeros_like(values)
    for lag in range(min(size, int(offset.max()) + 1) - 1, 0, -1):
        total[lag:] += np.where(offset[lag:] >= lag, values[:-lag], 0.0)
    total += values
    return total / np.minimum(offset + 1, size)


def _ema(values: np.ndarray, segment: np.ndarray, offset: np.ndarray, alpha: float) -> np.ndarray:
    """e_i = sum_{k <= i in i's trajectory} w_k * (1-alpha)^(i-k) * H_k, with w = 1 at a
    trajectory's first position and alpha elsewhere: a Hillis-Steele prefix scan, log2(n)
    vectorized passes instead of a Python loop."""
    decay = 1.0 - alpha
    out = values * alpha
    first = offset == 0
    out[first] = values[first]
    shift, factor = 1, decay
    longest = int(offset.max()) + 1
    while shift < longest and factor > 0.0:
        same = segment[shift:] == segment[:-shift]
        out[shift:] += np.where(same, factor * out[:-shift], 0.0)
        shift = 2 * shift
        factor = decay**shift  # pow, not repeated squaring, whose error doubles every pass
    return out
