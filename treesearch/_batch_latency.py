"""Latency models with a batch axis: one ``LatencyModel`` per batch size, and step times
imported from another runtime.

**Batch sizes.** The model of batch size ``B`` prices one step of ``B`` sequences that verify
the same tree: ``verify_ms`` / ``step_ms`` is that step's time, ``autoregressive_ms`` a plain
step of ``B`` sequences. Each sequence of the batch accepts its own tokens, so a batch decodes
``B`` times the per-sequence rate: ``tokens_per_second(B, ...)`` is ``B * tokens per step /
step time``. ``BatchLatency`` is an ordered ``Mapping[int, LatencyModel]`` (batch size ->
model, ascending); ``for_batch(b)`` reads it (see there for sizes between the measured ones).

**The file.** The latency file format (``format: "entmtp-latency"``) is unchanged at its top
level: the model of the smallest batch size, so every reader of a one-model file
(``LatencyModel.load``) still reads it. Two optional fields add the axis:
``"batch_size"`` (an integer >= 1; absent: 1), the batch size of the top-level model, and
``"by_batch_size"``, an object from each larger batch size (a decimal string key) to that
size's model in the same shape as the top level, without ``format``. A file with neither
field is a batch-1 file and reads exactly as before; a ``BatchLatency`` of batch size 1 alone
writes exactly ``LatencyModel.to_json``.

**Imported step times** (``read_step_times`` / ``BatchLatency.from_step_times``): a CSV of one
line per measured step, columns batch size, nodes (or a chain's draft length), context and ms
(``STEP_TIME_COLUMNS`` lists the names each column may have). Nodes 0 is the plain step: in a
serving runtime the step that drafts nothing is plain decoding, so it sets both
``autoregressive_ms`` and the empty-tree knot ``verify_ms[0]``. Lines of one (batch size,
nodes, context) are repeats of one measurement: their mean is the point's figure and their
interquartile range its spread (``LatencyPoint``). The points are then fitted as the profiler
fits its own (``LatencyModel.from_measurements``): a knot per node count, the mean of its
contexts' figures; ``autoregressive_ms`` the mean of the plain step's. The imported runtime's
step already includes its drafting, so no depth term is fitted (``depth_ms`` 0): a tree is
priced by its node count.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from entmtp.core import EntmtpError, atomic_write_json, read_json, read_text, short

from ._latency import (
    LATENCY_FIX,
    MAX_STEP_MS,
    MAX_TREE_NODES,
    MIN_STEP_MS,
    LatencyModel,
    LatencyPoint,
)

BATCH_SIZE_FIELD = "batch_size"  # the top-level model's batch size (absent: 1)
BY_BATCH_SIZE_FIELD = "by_batch_size"  # larger batch size (decimal string) -> model JSON
MAX_BATCH_SIZE = 65_536  # no serving runtime batches more sequences in one step
# CSV column -> the header names accepted for it (case-insensitive; "-" and " " read as "_")
STEP_TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "batch_size": ("batch_size", "batch"),
    "nodes": ("nodes", "draft_len", "draft_length"),
    "context": ("context", "context_len", "context_length"),
    "ms": ("ms", "step_ms"),
}
STEP_TIME_FIX = ("give a header line `batch_size,nodes,context,ms` and one line per measured "
                 "step (nodes 0: the plain step)")


class BatchLatency(Mapping[int, LatencyModel]):
    """Batch size -> the latency model of steps at that batch size, ascending (module doc)."""

    def __init__(self, models: Mapping[int, LatencyModel]) -> None:
        if not models:
            raise EntmtpError("a batch latency needs the model of at least one batch size")
        checked: dict[int, LatencyModel] = {}
        for size, model in models.items():
            if not isinstance(model, LatencyModel):
                raise EntmtpError(f"batch size {size}: {type(model).__name__} is not a "
                                  "LatencyModel")
            checked[_check_batch_size(size, "batch size")] = model
        self._models = dict(sorted(checked.items()))

    # -- the mapping -------------------------------------------------------------------------
    def __getitem__(self, batch_size: int) -> LatencyModel:
        return self._models[batch_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def __repr__(self) -> str:
        return f"BatchLatency(batch sizes {list(self._models)})"

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The measured batch sizes, ascending."""
        return tuple(self._models)

    @property
    def by_batch(self) -> dict[int, LatencyModel]:
        """A copy as a plain dict: batch size -> model."""
        return dict(self._models)

    @property
    def batched(self) -> bool:
        """True unless this is batch size 1 alone (a file of today's format)."""
        return self.batch_sizes != (1,)

    def for_batch(self, batch_size: int) -> LatencyModel:
        """The model that prices steps of ``batch_size`` sequences.

        A measured size: its model. Between measured sizes (or below the smallest): the model
        of the next measured size up. A step of more sequences verifies more rows, so it costs
        at least as much: the next size up never under-prices a step (interpolating between the
        two neighbours could, where the time jumps between them). Above the largest measured
        size there is no such bound: refused, as is a size below 1.
        """
        size = _check_batch_size(batch_size, "batch size")
        for measured, model in self._models.items():
            if measured >= size:
                return model
        largest = self.batch_sizes[-1]
        raise EntmtpError(f"batch size {size} is beyond the largest measured one ({largest}): "
                          f"no step time bounds it; time or import steps at batch size {size}")

    def tokens_per_second(self, batch_size: int, tokens_per_step: float, num_nodes: int,
                          depth: int) -> float:
        """Tokens/s of a whole batch whose every sequence gains ``tokens_per_step`` per step of
        a ``num_nodes``-node, ``depth``-deep tree: ``batch_size`` times the per-sequence
        rate, priced by ``for_batch(batch_size)``."""
        step_ms = float(self.for_batch(batch_size).step_ms(num_nodes, depth))
        return batch_size * float(tokens_per_step) * 1000.0 / step_ms

    # -- the file ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The latency file's object: the smallest batch size's model at the top level, the
        others under ``by_batch_size``; a batch-1-only value is ``LatencyModel.to_json``."""
        (smallest, top), *others = self._models.items()
        out = top.to_json()
        if smallest != 1:
            out[BATCH_SIZE_FIELD] = smallest
        if others:
            nested = {}
            for size, model in others:
                obj = model.to_json()
                del obj["format"]
                nested[str(size)] = obj
            out[BY_BATCH_SIZE_FIELD] = nested
        return out

    @classmethod
    def from_json(cls, obj: object, *, source: str = "latency model") -> BatchLatency:
        """Read a latency file's object; one without the batch fields is batch size 1."""
        fix = LATENCY_FIX
        top = LatencyModel.from_json(obj, source=source)  # also checks the whole object's values
        assert isinstance(obj, dict)  # from_json refused anything else
        smallest = 1
        if BATCH_SIZE_FIELD in obj:
            smallest = _batch_size_value(obj[BATCH_SIZE_FIELD], f"{source}: {BATCH_SIZE_FIELD}",
                                         fix)
        models = {smallest: top}
        nested = obj.get(BY_BATCH_SIZE_FIELD)
        if BY_BATCH_SIZE_FIELD in obj and not isinstance(nested, dict):
            raise EntmtpError(f"{source}: {BY_BATCH_SIZE_FIELD}: {short(repr(nested))} is not an "
                              f"object of batch size -> latency model: {fix}")
        for key, value in (nested or {}).items():
            where = f"{source}: {BY_BATCH_SIZE_FIELD}.{key}"
            if not (isinstance(key, str) and key.isdigit() and key == str(int(key))):
                raise EntmtpError(f"{where}: {short(repr(key))} is not a batch size (a decimal "
                                  f"integer such as \"8\"): {fix}")
            size = _batch_size_value(int(key), where, fix)
            if size <= smallest:
                raise EntmtpError(f"{where}: batch sizes here are larger than the top-level "
                                  f"model's ({BATCH_SIZE_FIELD} {smallest}): {fix}")
            if isinstance(value, dict) and ({BATCH_SIZE_FIELD, BY_BATCH_SIZE_FIELD} & set(value)):
                raise EntmtpError(f"{where}: a batch size's model holds no batch sizes of its "
                                  f"own: {fix}")
            models[size] = LatencyModel.from_json(value, source=where)
        return cls(models)

    def save(self, path: str | os.PathLike) -> Path:
        return atomic_write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> BatchLatency:
        source = f"latency file {path}"
        return cls.from_json(read_json(path, source=source, fix=LATENCY_FIX), source=source)

    # -- imported step times -----------------------------------------------------------------
    @classmethod
    def from_step_times(cls, rows: Sequence[StepTime], *, hardware: Mapping[str, Any],
                        source: str = "step times") -> BatchLatency:
        """Fit one model per batch size to measured steps (the module doc's rule); each model's
        ``hardware`` is ``hardware`` plus the contexts timed. Refuses a batch size without a
        plain step or without a drafted one, and a node count timed at other contexts than
        its batch's plain step (the curve would compare steps of other cache lengths)."""
        if not rows:
            raise EntmtpError(f"{source}: no measured steps: {STEP_TIME_FIX}")
        groups: dict[int, dict[tuple[int, int], list[float]]] = {}
        for row in rows:
            groups.setdefault(row.batch_size, {}).setdefault((row.nodes, row.context),
                                                             []).append(row.ms)
        models = {}
        for size, measured in sorted(groups.items()):
            contexts_of: dict[int, set[int]] = {}
            for nodes, context in measured:
                contexts_of.setdefault(nodes, set()).add(context)
            plain = contexts_of.get(0)
            if plain is None:
                raise EntmtpError(f"{source}: batch size {size} has no plain step (a line with "
                                  f"nodes 0): add the plain decoding step's time at batch size "
                                  f"{size}, the baseline of every speedup")
            if len(contexts_of) == 1:
                raise EntmtpError(f"{source}: batch size {size} has only the plain step: add "
                                  "the times of drafted steps (nodes >= 1) at that batch size")
            for nodes, contexts in sorted(contexts_of.items()):
                if contexts != plain:
                    raise EntmtpError(
                        f"{source}: batch size {size}, nodes {nodes}: timed at contexts "
                        f"{_listed(contexts)} but the plain step at {_listed(plain)}: time "
                        "every step of a batch size at the same contexts")
            points = []
            for (nodes, context), times in sorted(measured.items()):
                point = _point("tree", nodes, context, times)
                points.append(point)
                if nodes == 0:  # the plain step is also the step that drafts nothing
                    points.append(_point("autoregressive", 0, context, times))
            plain_ms = [p.ms for p in points if p.step == "autoregressive"]
            model = LatencyModel.from_measurements(
                [(p.nodes, p.depth, p.ms) for p in points if p.step == "tree"],
                autoregressive_ms=statistics.fmean(plain_ms),
                hardware={**hardware, "context_lengths": sorted(plain)},
            )
            # one figure for the plain step in both fields (the fit's rounding could otherwise
            # set them apart, which the zero-noise checks would flag)
            models[size] = replace(model, autoregressive_ms=model.verify_ms[0],
                                   points=tuple(points))
        return cls(models)


@dataclass(frozen=True)
class StepTime:
    """One measured step of an imported file."""

    batch_size: int
    nodes: int  # draft tree nodes (a chain: its draft length); 0: the plain step
    context: int  # KV-cache length the step ran at
    ms: float
    line: int  # the file's line it came from


def read_step_times(path: str | os.PathLike) -> tuple[list[StepTime], str]:
    """The measured steps of a step-time CSV (module doc) and the name of its node column;
    one line naming the line and the problem for anything it cannot read."""
    source = f"step-time file {path}"
    text = read_text(path, source=source, fix=STEP_TIME_FIX)
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise EntmtpError(f"{source}: no lines: {STEP_TIME_FIX}")
    parsed = list(csv.reader([line for _, line in lines], skipinitialspace=True))
    header_number, header = lines[0][0], [_column_name(name) for name in parsed[0]]
    where = f"{source} line {header_number} (the header)"
    position: dict[str, int] = {}
    for column, names in STEP_TIME_COLUMNS.items():
        found = [i for i, name in enumerate(header) if name in names]
        if not found:
            raise EntmtpError(f"{where}: no {column} column (name it "
                              f"{' or '.join(names)}): {STEP_TIME_FIX}")
        if len(found) > 1:
            raise EntmtpError(f"{where}: {len(found)} {column} columns "
                              f"({', '.join(parsed[0][i].strip() for i in found)}): keep one")
        position[column] = found[0]
    node_column = header[position["nodes"]]
    rows = []
    for (number, _), fields in zip(lines[1:], parsed[1:], strict=True):
        where = f"{source} line {number}"
        if len(fields) != len(header):
            raise EntmtpError(f"{where}: {len(fields)} values for the header's {len(header)} "
                              f"columns: {STEP_TIME_FIX}")
        value = {column: fields[i].strip() for column, i in position.items()}
        rows.append(StepTime(
            batch_size=_whole(value["batch_size"], "batch_size", where, 1, MAX_BATCH_SIZE),
            nodes=_whole(value["nodes"], node_column, where, 0, MAX_TREE_NODES),
            context=_whole(value["context"], "context", where, 1, 2**31),
            ms=_milliseconds(value["ms"], where),
            line=number,
        ))
    if not rows:
        raise EntmtpError(f"{source}: a header and no measured step: {STEP_TIME_FIX}")
    return rows, node_column


def import_step_times(path: str | os.PathLike, *,
                      device_name: str | None = None) -> BatchLatency:
    """``read_step_times`` then ``BatchLatency.from_step_times``, recording the file."""
    rows, node_column = read_step_times(path)
    hardware = {
        "kind": "imported",
        "source": str(path),
        "device_name": device_name or f"imported from {Path(path).name}",
        "node_column": node_column,
        "lines": len(rows),
        "statistic": "mean of a measurement's lines (one batch size, nodes and context); "
                     "spread: their interquartile range",
    }
    return BatchLatency.from_step_times(rows, hardware=hardware,
                                        source=f"step-time file {path}")


def _check_batch_size(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise EntmtpError(f"{name} {value!r} is not an integer")
    if not 1 <= int(value) <= MAX_BATCH_SIZE:
        raise EntmtpError(f"{name} {value} is outside 1..{MAX_BATCH_SIZE}")
    return int(value)


def _batch_size_value(value: object, where: str, fix: str) -> int:
    try:
        return _check_batch_size(value, "batch size")
    except EntmtpError as err:
        raise EntmtpError(f"{where}: {err}: {fix}") from None


def _column_name(name: str) -> str:
    return "_".join(name.strip().lower().replace("-", " ").split())


def _whole(text: str, column: str, where: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise EntmtpError(f"{where}: {column} {short(repr(text))} is not a whole number: "
                          f"{STEP_TIME_FIX}") from None
    if not low <= value <= high:
        raise EntmtpError(f"{where}: {column} {value} is outside {low}..{high}: "
                          f"{STEP_TIME_FIX}")
    return value


def _milliseconds(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise EntmtpError(f"{where}: ms {short(repr(text))} is not a number: give the step "
                          "time in milliseconds") from None
    if not math.isfinite(value):
        raise EntmtpError(f"{where}: ms {text} is not a finite number: give the step time in "
                          "milliseconds")
    if value < 0:
        raise EntmtpError(f"{where}: ms {value:g} is negative: give the step time in "
                          "milliseconds")
    if not MIN_STEP_MS <= value <= MAX_STEP_MS:
        raise EntmtpError(f"{where}: ms {value:g} is not a decoding step time (between "
                          f"{MIN_STEP_MS:g} and {MAX_STEP_MS:g} ms): give it in milliseconds")
    return value


def _point(step: str, nodes: int, context: int, times: Sequence[float]) -> LatencyPoint:
    low, median, high = (float(q) for q in np.percentile(times, [25, 50, 75]))
    return LatencyPoint(step=step, context=context, ms=statistics.fmean(times),
                        median_ms=median, iqr_ms=max(high - low, 0.0), rounds=len(times),
                        nodes=nodes, depth=0)


def _listed(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in sorted(values))
