"""The bundle: entropy-switched draft trees for one model + head set + task, as versioned JSON.

A bundle (``format: "entmtp-bundle"``, integer ``format_version``) holds the trees, the entropy
thresholds that switch between them (tree ``i`` serves running estimates in
``[thresholds[i-1], thresholds[i])``, in ``entropy.unit``; equal neighbours leave a tree that is
never chosen), the estimator that produces the running estimate, the
model and heads it was calibrated for, and what the replay predicted. The JSON Schema ships as
package data (``bundle.schema.json``); ``load_bundle`` checks it and then what a schema cannot
(prefix-closed paths, ranks below top-k, depth within the heads, counts that match, finite
numbers), with the checks ``Tree`` and ``Schedule`` use. Every rejection is one ``EntmtpError``
line that names the file and the field.

Optional fields: ``best_static`` (the best single static tree on the same replay, by index into
``trees`` or by its own paths; exports default to it) and ``latency`` (the LatencyModel JSON the
prediction used). Any other new field bumps ``format_version``.

**Batch sizes** (``format_version`` 2, the only change from 1): ``batch_ranges``, consecutive
ranges of batch sizes from 1, each with the schedule (entropy, thresholds, trees) that steps of
that many sequences decode with and what its batched replay predicted at every measured size
inside (treesearch/_batch_search.py says how they are chosen). The top-level schedule stays the
batch-1 one, so a version-1 bundle, or a reader that knows no batches, runs it at batch 1.
``Bundle.schedule(batch_size)`` is the one way from a bundle to what runs at a batch size; past
the last range its schedule runs. A bundle without ranges writes version 1, exactly as before.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from entmtp.core import EntmtpError, atomic_write_text, check_values, parse_json, read_bytes
from entmtp.core import field_name as _field
from entmtp.core import short as _short

from ._batch_latency import BatchLatency
from ._estimator import EntropyEstimator
from ._latency import LatencyModel
from ._schedule import Schedule, check_signal, check_thresholds
from ._tree import Tree

SYNTHETIC_MODEL_NAME = "synthetic"  # the model of entmtp demo's made-up profile
BUNDLE_FORMAT = "entmtp-bundle"
BUNDLE_FORMAT_VERSION = 2  # the newest this entmtp reads and writes (with batch_ranges)
BATCHLESS_FORMAT_VERSION = 1  # a bundle without batch_ranges, as every bundle before them
ENTROPY_UNITS = ("nats", "bits")
_NATS_PER_UNIT = {"nats": 1.0, "bits": math.log(2.0)}  # entropies are measured in nats
SCHEMA_RESOURCE = "bundle.schema.json"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    vocab_size: int
    hidden_size: int


@dataclass(frozen=True)
class HeadsInfo:
    type: str  # "medusa" | "hydra"
    num_heads: int
    topk: int | tuple[int, ...]  # candidates each head drafts: one for all heads, or per head
    sha256: str  # of the head weights, lowercase hex


@dataclass(frozen=True)
class EntropyInfo:
    signal: str  # what is estimated, e.g. "base_entropy"
    unit: str  # "nats" | "bits"
    estimator: EntropyEstimator


@dataclass(frozen=True)
class TreeStats:
    expected_accept_length: float  # tokens per step on the positions this tree serves
    latency_ms: float  # modelled draft + verify ms of one step


@dataclass(frozen=True)
class Predicted:
    mean_accept_length: float
    tokens_per_second: float
    speedup_vs_autoregressive: float
    oracle_tokens_per_second: float  # best tree of the set per step, in hindsight


@dataclass(frozen=True)
class CreatedBy:
    entmtp: str  # version
    command: str  # the command line that made the bundle
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. a timestamp


@dataclass(frozen=True)
class BestStatic:
    tree: Tree
    tokens_per_second: float
    tree_index: int | None = None  # set when the tree is one of the bundle's trees


@dataclass(frozen=True)
class BatchPrediction:
    """The batched replay of one measured batch size (treesearch/_batch_replay.py)."""

    batch_size: int
    chosen: str  # which candidate the range's schedule is (treesearch/_batch_search.py)
    tokens_per_second: float  # the whole batch's decode tokens over its steps' time
    mean_accept_length: float  # tokens a live row gains per batch step
    autoregressive_tokens_per_second: float  # plain decoding at this batch size
    best_static_tokens_per_second: float  # this size's best static tree
    batch_one_tokens_per_second: float  # the batch-1 schedule run at this size


@dataclass
class BatchRange:
    """Batch sizes ``min_batch_size .. max_batch_size`` decode with this schedule."""

    min_batch_size: int
    max_batch_size: int
    entropy: EntropyInfo
    thresholds: list[float]  # ascending, len(trees) - 1, in entropy.unit
    trees: list[Tree]
    predicted: list[BatchPrediction]  # one per measured batch size inside, ascending

    def schedule(self) -> Schedule:
        """The range's schedule in nats (as ``Bundle.schedule``)."""
        scale = nats_per_unit(self.entropy.unit)
        return Schedule(tuple(self.trees), tuple(t * scale for t in self.thresholds),
                        self.entropy.estimator, self.entropy.signal)

    @property
    def drafts(self) -> bool:
        """False for "do not draft": plain decoding (the empty tree alone)."""
        return any(tree.num_nodes for tree in self.trees)


@dataclass
class Bundle:
    model: ModelInfo
    heads: HeadsInfo
    task: str
    entropy: EntropyInfo
    thresholds: list[float]  # ascending (repeats allowed), len(trees) - 1, in entropy.unit
    trees: list[Tree]
    tree_stats: list[TreeStats]  # one per tree
    predicted: Predicted
    hardware: dict[str, Any]
    created_by: CreatedBy
    best_static: BestStatic | None = None
    latency: LatencyModel | None = None
    batch_ranges: list[BatchRange] = field(default_factory=list)  # empty: batch 1 only
    # the step times of every batch size the ranges were searched with (``latency`` is its
    # batch-1 model); written as the ``latency`` field's batch axis
    batch_latency: BatchLatency | None = None

    def __post_init__(self) -> None:
        self.trees = list(self.trees)
        self.tree_stats = list(self.tree_stats)
        if not self.trees:
            raise EntmtpError("bundle: trees: a bundle needs at least one tree")
        if len(self.tree_stats) != len(self.trees):
            raise EntmtpError(
                f"bundle: tree_stats: {len(self.tree_stats)} stats for {len(self.trees)} trees"
            )
        self.thresholds = list(check_thresholds(self.thresholds, len(self.trees),
                                                context="bundle: "))
        self.schedule()  # checks the unit, the signal and its estimator
        self.batch_ranges = list(self.batch_ranges)
        check_batch_ranges(self.batch_ranges, context="bundle: ")

    @property
    def schedule_is_best_static(self) -> bool:
        """One tree, and it is the best static tree: the schedule chooses it at every step
        without reading an entropy, so it decodes exactly as that tree does."""
        best = self.best_static
        return best is not None and len(self.trees) == 1 and best.tree == self.trees[0]

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The measured batch sizes of the ranges (empty: a batch-1 bundle)."""
        return tuple(p.batch_size for r in self.batch_ranges for p in r.predicted)

    def batch_range(self, batch_size: int) -> BatchRange | None:
        """The range serving ``batch_size`` (past the last: the last), None without ranges."""
        if int(batch_size) < 1:
            raise EntmtpError(f"batch size {batch_size}: give 1 or more sequences per step")
        for candidate in self.batch_ranges:
            if candidate.min_batch_size <= batch_size <= candidate.max_batch_size:
                return candidate
        return self.batch_ranges[-1] if self.batch_ranges else None

    def schedule(self, batch_size: int | None = None) -> Schedule:
        """The bundle's entropy schedule in nats: the one way from a bundle to what runs.

        ``batch_size`` None: the top-level (batch-1) schedule; else the schedule of the range
        serving that many sequences (the top level when the bundle has no ranges).
        The replay takes it as is and the runtime runs ``BundleScheduler(bundle.schedule(b))``.
        Profiles and the live decoder measure entropies in nats, so thresholds stored in bits
        are converted here (and in ``BatchRange.schedule``). Equal thresholds stay: that tree
        is never chosen.
        """
        chosen = None if batch_size is None else self.batch_range(batch_size)
        if chosen is not None:
            return chosen.schedule()
        scale = nats_per_unit(self.entropy.unit)
        return Schedule(
            tuple(self.trees),
            tuple(t * scale for t in self.thresholds),
            self.entropy.estimator,
            self.entropy.signal,
        )

    def tree_index_for(self, estimate: float) -> int:
        """Index of the tree that serves a running entropy estimate in nats."""
        return self.schedule().tree_index(estimate)

    def tree_for(self, estimate: float) -> Tree:
        """The tree that serves a running entropy estimate in nats."""
        return self.trees[self.tree_index_for(estimate)]

    def check_compatible(
        self,
        *,
        vocab_size: int | None = None,
        hidden_size: int | None = None,
        head_type: str | None = None,
        num_heads: int | None = None,
        heads_sha256: str | None = None,
    ) -> None:
        """Raise ``EntmtpError`` if the bundle was made for another model or head set.

        Arguments left as None are not checked; a synthetic bundle (``entmtp demo``'s, made
        for no model) is refused whatever is given.
        """
        if self.model.name == SYNTHETIC_MODEL_NAME:
            raise EntmtpError(
                "this bundle is synthetic (made by entmtp demo from a made-up profile, for no "
                "model): nothing decodes with it; give a bundle calibrated for a model (`entmtp "
                "bundles` lists the shipped ones)")
        if head_type is not None and head_type != self.heads.type:
            raise EntmtpError(
                f"the bundle was searched for {self.heads.type} heads but the heads loaded are "
                f"{head_type}: load {self.heads.type} heads (--heads of that type; --head-type "
                f"defaults to the bundle's), or give a {head_type} bundle")
        fix = "calibrate a bundle for this model and heads (entmtp calibrate)"
        checks = [
            ("model vocab_size", self.model.vocab_size, vocab_size),
            ("model hidden_size", self.model.hidden_size, hidden_size),
            ("number of heads", self.heads.num_heads, num_heads),
        ]
        for name, expected, actual in checks:
            if actual is not None and actual != expected:
                raise EntmtpError(
                    f"bundle was made for {name} {expected!r} but the loaded model has "
                    f"{actual!r}: {fix}"
                )
        if heads_sha256 is not None and heads_sha256.lower() != self.heads.sha256:
            raise EntmtpError(
                f"bundle was made for heads with sha256 {self.heads.sha256[:12]}... but the "
                f"loaded heads have {heads_sha256.lower()[:12]}...: {fix}"
            )


def check_batch_ranges(ranges: list[BatchRange], *, context: str = "") -> None:
    """One ``EntmtpError`` line unless ``ranges`` are consecutive from batch size 1, each with
    a valid schedule and predictions at measured sizes inside it, ascending."""
    expected = 1
    for i, batch in enumerate(ranges):
        where = f"{context}batch_ranges[{i}]"
        if batch.min_batch_size != expected:
            raise EntmtpError(
                f"{where}.min_batch_size: {batch.min_batch_size}, expected {expected}: ranges "
                "run consecutively from batch size 1")
        if batch.max_batch_size < batch.min_batch_size:
            raise EntmtpError(f"{where}.max_batch_size: {batch.max_batch_size} is below its "
                              f"min_batch_size {batch.min_batch_size}")
        if not batch.trees:
            raise EntmtpError(f"{where}.trees: a range needs at least one tree")
        batch.thresholds = list(check_thresholds(batch.thresholds, len(batch.trees),
                                                 context=f"{where}: "))
        batch.schedule()  # the unit, the signal and its estimator
        sizes = [p.batch_size for p in batch.predicted]
        if not sizes or sizes != sorted(set(sizes)) or not (
                batch.min_batch_size <= sizes[0] and sizes[-1] <= batch.max_batch_size):
            raise EntmtpError(
                f"{where}.predicted: batch sizes {sizes} must be ascending, distinct and inside "
                f"{batch.min_batch_size}..{batch.max_batch_size}")
        expected = batch.max_batch_size + 1


def nats_per_unit(unit: str) -> float:
    """Nats in one ``unit`` of entropy (``nats`` or ``bits``)."""
    try:
        return _NATS_PER_UNIT[unit]
    except (KeyError, TypeError):
        raise EntmtpError(
            f"bundle: entropy.unit: {unit!r} is unknown: use one of {', '.join(ENTROPY_UNITS)}"
        ) from None


# -- JSON -------------------------------------------------------------------------------------
def bundle_to_json(bundle: Bundle) -> dict[str, Any]:
    """Plain JSON types only (numpy scalars become int/float)."""
    topk = bundle.heads.topk
    out: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "format_version": (BUNDLE_FORMAT_VERSION if bundle.batch_ranges
                           else BATCHLESS_FORMAT_VERSION),
        "model": {
            "name": bundle.model.name,
            "vocab_size": int(bundle.model.vocab_size),
            "hidden_size": int(bundle.model.hidden_size),
        },
        "heads": {
            "type": bundle.heads.type,
            "num_heads": int(bundle.heads.num_heads),
            "topk": [int(k) for k in topk] if isinstance(topk, (tuple, list)) else int(topk),
            "sha256": bundle.heads.sha256,
        },
        "task": bundle.task,
        "entropy": _entropy_json(bundle.entropy),
        "thresholds": [float(t) for t in bundle.thresholds],
        "trees": [
            {
                "paths": tree.to_json(),
                "num_nodes": tree.num_nodes,
                "depth": tree.depth,
                "expected_accept_length": float(stats.expected_accept_length),
                "latency_ms": float(stats.latency_ms),
            }
            for tree, stats in zip(bundle.trees, bundle.tree_stats, strict=True)
        ],
        "predicted": {
            "mean_accept_length": float(bundle.predicted.mean_accept_length),
            "tokens_per_second": float(bundle.predicted.tokens_per_second),
            "speedup_vs_autoregressive": float(bundle.predicted.speedup_vs_autoregressive),
            "oracle_tokens_per_second": float(bundle.predicted.oracle_tokens_per_second),
        },
        "hardware": dict(bundle.hardware),
        "created_by": {
            **bundle.created_by.extra,
            "entmtp": bundle.created_by.entmtp,
            "command": bundle.created_by.command,
        },
    }
    if bundle.best_static is not None:
        best: dict[str, Any] = {}
        if bundle.best_static.tree_index is not None:
            best["tree_index"] = int(bundle.best_static.tree_index)
        else:
            best["paths"] = bundle.best_static.tree.to_json()
        best["tokens_per_second"] = float(bundle.best_static.tokens_per_second)
        out["best_static"] = best
    if bundle.batch_latency is not None:
        out["latency"] = bundle.batch_latency.to_json()
    elif bundle.latency is not None:
        out["latency"] = bundle.latency.to_json()
    if bundle.batch_ranges:
        out["batch_ranges"] = [_batch_range_json(batch) for batch in bundle.batch_ranges]
    return out


def _entropy_json(entropy: EntropyInfo) -> dict[str, Any]:
    return {"signal": entropy.signal, "unit": entropy.unit,
            "estimator": entropy.estimator.to_json()}


def _batch_range_json(batch: BatchRange) -> dict[str, Any]:
    return {
        "min_batch_size": int(batch.min_batch_size),
        "max_batch_size": int(batch.max_batch_size),
        "entropy": _entropy_json(batch.entropy),
        "thresholds": [float(t) for t in batch.thresholds],
        "trees": [{"paths": tree.to_json(), "num_nodes": tree.num_nodes, "depth": tree.depth}
                  for tree in batch.trees],
        "predicted": [
            {"batch_size": int(p.batch_size), "chosen": p.chosen,
             "tokens_per_second": float(p.tokens_per_second),
             "mean_accept_length": float(p.mean_accept_length),
             "autoregressive_tokens_per_second": float(p.autoregressive_tokens_per_second),
             "best_static_tokens_per_second": float(p.best_static_tokens_per_second),
             "batch_one_tokens_per_second": float(p.batch_one_tokens_per_second)}
            for p in batch.predicted],
    }


def bundle_from_json(obj: object, *, source: str = "bundle") -> Bundle:
    """Validate a parsed bundle (schema, then semantics) and build it.

    ``source`` starts every error message, e.g. ``"bundle run/code.json"``.
    """
    try:
        check_values(obj, source=source)
        _check_header(obj, source)
        _check_schema(obj, source)
        return _build(obj, source)  # type: ignore[arg-type]
    except RecursionError as err:
        raise EntmtpError(f"{source}: nested too deeply to be a bundle") from err


def parse_bundle(text: str | bytes, *, source: str = "bundle") -> Bundle:
    """Parse bundle JSON text. NaN/Infinity literals are rejected (JSON has none)."""
    return bundle_from_json(parse_json(text, source=source, expect=None), source=source)


def load_bundle(path: str | os.PathLike) -> Bundle:
    path = Path(path)
    source = f"bundle {path}"
    return parse_bundle(read_bytes(path, source=source), source=source)


def save_bundle(bundle: Bundle, path: str | os.PathLike) -> Path:
    """Validate the exact text ``load_bundle`` will read, then write it atomically."""
    source = f"bundle {path}"
    obj = bundle_to_json(bundle)
    check_values(obj, source=source)  # names the field before json.dumps would refuse unnamed
    try:
        text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as err:
        raise EntmtpError(f"{source}: cannot be written as JSON: {_short(str(err))}") from err
    parse_bundle(text, source=source)
    try:
        return atomic_write_text(path, text)
    except OSError as err:
        raise EntmtpError(f"cannot write {source}: {err.strerror or err}") from err


# -- validation -------------------------------------------------------------------------------
def _check_header(obj: object, source: str) -> None:
    if not isinstance(obj, dict):
        raise EntmtpError(
            f"{source}: not an entmtp bundle: the top level is a {type(obj).__name__}, not an "
            "object"
        )
    fmt = obj.get("format")
    if fmt != BUNDLE_FORMAT:
        shown = "missing" if "format" not in obj else _short(repr(fmt))
        raise EntmtpError(
            f"{source}: format: {shown}, expected {BUNDLE_FORMAT!r}: not an entmtp bundle"
        )
    version = obj.get("format_version")
    if isinstance(version, bool) or not isinstance(version, (int, float)):
        shown = "missing" if "format_version" not in obj else _short(repr(version))
        raise EntmtpError(f"{source}: format_version: {shown}, expected an integer")
    if version > BUNDLE_FORMAT_VERSION:
        raise EntmtpError(
            f"{source}: format_version {_short(str(version))} was made by a newer entmtp (this "
            f"one reads {BUNDLE_FORMAT_VERSION}): upgrade entmtp"
        )
    if version not in range(BATCHLESS_FORMAT_VERSION, BUNDLE_FORMAT_VERSION + 1):
        raise EntmtpError(
            f"{source}: format_version: {_short(str(version))} is not a bundle version (expected "
            f"{BATCHLESS_FORMAT_VERSION} to {BUNDLE_FORMAT_VERSION})"
        )


@lru_cache(maxsize=1)
def bundle_schema() -> dict[str, Any]:
    """The bundle JSON Schema (draft 2020-12) shipped with entmtp.treesearch."""
    from importlib.resources import files

    return json.loads(files("entmtp.treesearch").joinpath(SCHEMA_RESOURCE).read_text("utf-8"))


@lru_cache(maxsize=1)
def _validator():
    try:
        from jsonschema import Draft202012Validator
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise EntmtpError(
            "reading bundles needs jsonschema: pip install 'jsonschema>=4.18'"
        ) from err
    return Draft202012Validator(bundle_schema())


_RULE_WORDS = {
    "type": "is not of type",
    "minimum": "is below the minimum",
    "maximum": "is above the maximum",
    "exclusiveMinimum": "must be above",
    "pattern": "does not match the pattern",
    "minItems": "has fewer items than the minimum",
    "maxItems": "has more items than the maximum",
    "minLength": "is shorter than the minimum length",
}


def _check_schema(obj: dict[str, Any], source: str) -> None:
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(obj))
    if error is None:
        return
    where = _field(list(error.absolute_path))
    if error.validator == "oneOf":  # only best_static has one
        message = "give exactly one of tree_index and paths"
    elif error.validator in _RULE_WORDS:
        shown = _short(json.dumps(error.instance, default=str))
        rule = _short(json.dumps(error.validator_value))
        message = f"{shown} {_RULE_WORDS[error.validator]} {rule}"
    else:
        message = error.message
    raise EntmtpError(f"{source}: {where}: {_short(message)}")


def _build(obj: dict[str, Any], source: str) -> Bundle:
    heads_obj = obj["heads"]
    num_heads = int(heads_obj["num_heads"])
    raw_topk = heads_obj["topk"]
    if isinstance(raw_topk, list):
        if len(raw_topk) != num_heads:
            raise EntmtpError(
                f"{source}: heads.topk: {len(raw_topk)} values for {num_heads} heads: give one "
                "top-k per head or a single number"
            )
        topk: int | tuple[int, ...] = tuple(int(k) for k in raw_topk)
    else:
        topk = int(raw_topk)
    heads = HeadsInfo(
        type=heads_obj["type"], num_heads=num_heads, topk=topk, sha256=heads_obj["sha256"]
    )

    trees: list[Tree] = []
    stats: list[TreeStats] = []
    for i, tree_obj in enumerate(obj["trees"]):
        where = f"trees[{i}]"
        tree = Tree.from_paths(tree_obj["paths"], topk=topk, num_heads=num_heads,
                               where=f"{source}: {where}.paths")
        for name, actual in (("num_nodes", tree.num_nodes), ("depth", tree.depth)):
            if int(tree_obj[name]) != actual:
                raise EntmtpError(
                    f"{source}: {where}.{name}: says {tree_obj[name]} but the paths give {actual}"
                )
        accept = float(tree_obj["expected_accept_length"])
        if accept > tree.depth + 1 + 1e-9:
            raise EntmtpError(
                f"{source}: {where}.expected_accept_length: {accept} exceeds depth + 1 = "
                f"{tree.depth + 1}, the most one step can accept"
            )
        trees.append(tree)
        stats.append(TreeStats(accept, float(tree_obj["latency_ms"])))

    thresholds = check_thresholds(obj["thresholds"], len(trees), context=f"{source}: ")

    entropy = _build_entropy(obj["entropy"], f"{source}: entropy")

    best_static = None
    if "best_static" in obj:
        best_obj = obj["best_static"]
        if "tree_index" in best_obj:
            index = int(best_obj["tree_index"])
            if index >= len(trees):
                raise EntmtpError(
                    f"{source}: best_static.tree_index: {index} is not a tree index "
                    f"(0..{len(trees) - 1})"
                )
            best_tree = trees[index]
        else:
            index = None
            best_tree = Tree.from_paths(best_obj["paths"], topk=topk, num_heads=num_heads,
                                        where=f"{source}: best_static.paths")
        best_static = BestStatic(best_tree, float(best_obj["tokens_per_second"]), index)

    latency = batch_latency = None
    if "latency" in obj:
        try:
            read = BatchLatency.from_json(obj["latency"])
        except (EntmtpError, TypeError, ValueError, OverflowError) as err:
            raise EntmtpError(f"{source}: latency: {_short(str(err))}") from err
        latency = read.for_batch(1)
        batch_latency = read if read.batched else None

    batch_ranges = [_build_batch_range(batch_obj, f"{source}: batch_ranges[{i}]", topk=topk,
                                       num_heads=num_heads)
                    for i, batch_obj in enumerate(obj.get("batch_ranges", []))]
    try:
        check_batch_ranges(batch_ranges, context=f"{source}: ")
    except EntmtpError as err:
        raise EntmtpError(str(err)) from None

    created = obj["created_by"]
    predicted = obj["predicted"]
    return Bundle(
        model=ModelInfo(
            name=obj["model"]["name"],
            vocab_size=int(obj["model"]["vocab_size"]),
            hidden_size=int(obj["model"]["hidden_size"]),
        ),
        heads=heads,
        task=obj["task"],
        entropy=entropy,
        thresholds=list(thresholds),
        trees=trees,
        tree_stats=stats,
        predicted=Predicted(
            mean_accept_length=float(predicted["mean_accept_length"]),
            tokens_per_second=float(predicted["tokens_per_second"]),
            speedup_vs_autoregressive=float(predicted["speedup_vs_autoregressive"]),
            oracle_tokens_per_second=float(predicted["oracle_tokens_per_second"]),
        ),
        hardware=dict(obj["hardware"]),
        created_by=CreatedBy(
            entmtp=created["entmtp"],
            command=created["command"],
            extra={k: v for k, v in created.items() if k not in ("entmtp", "command")},
        ),
        best_static=best_static,
        latency=latency,
        batch_ranges=batch_ranges,
        batch_latency=batch_latency,
    )


def _build_entropy(entropy_obj: dict[str, Any], where: str) -> EntropyInfo:
    try:
        estimator = EntropyEstimator.from_json(entropy_obj["estimator"])
    except EntmtpError as err:
        raise EntmtpError(f"{where}.estimator: {err}") from err
    try:
        check_signal(entropy_obj["signal"], estimator)
    except EntmtpError as err:
        raise EntmtpError(f"{where}.signal: {err}") from err
    return EntropyInfo(entropy_obj["signal"], entropy_obj["unit"], estimator)


def _build_batch_range(obj: dict[str, Any], where: str, *, topk: int | tuple[int, ...],
                       num_heads: int) -> BatchRange:
    trees = []
    for i, tree_obj in enumerate(obj["trees"]):
        tree = Tree.from_paths(tree_obj["paths"], topk=topk, num_heads=num_heads,
                               where=f"{where}.trees[{i}].paths")
        for name, actual in (("num_nodes", tree.num_nodes), ("depth", tree.depth)):
            if int(tree_obj[name]) != actual:
                raise EntmtpError(f"{where}.trees[{i}].{name}: says {tree_obj[name]} but the "
                                  f"paths give {actual}")
        trees.append(tree)
    predicted = [
        BatchPrediction(int(p["batch_size"]), p["chosen"], float(p["tokens_per_second"]),
                        float(p["mean_accept_length"]),
                        float(p["autoregressive_tokens_per_second"]),
                        float(p["best_static_tokens_per_second"]),
                        float(p["batch_one_tokens_per_second"]))
        for p in obj["predicted"]]
    return BatchRange(int(obj["min_batch_size"]), int(obj["max_batch_size"]),
                      _build_entropy(obj["entropy"], f"{where}.entropy"),
                      list(obj["thresholds"]), trees, predicted)
