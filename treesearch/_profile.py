"""The Profile record: per greedy trajectory, base entropy and head rank vectors per position.

Position ``i`` of a trace is the decoding state whose pending (base-model) token is generated
token ``i``: ``entropy[i]`` is the base model's entropy (nats) of the distribution that token was
drawn from, and ``ranks[i, j-1]`` is the rank of generated token ``i + j`` in head ``j``'s top-k at
that state (Hydra: with the true tokens as the drafted prefix); -1 means outside the top-k or past
the end of the trajectory. ``draft_entropy[i]`` (optional: synthetic profiles have none) is the
entropy (nats) of head 1's distribution at that state (Hydra: with token ``i`` as its prefix):
the drafter's own confidence in its first level, known before the step's tree is chosen.

Storage is one uncompressed ``.npz`` (no pickle): concatenated arrays plus offsets and a JSON
metadata blob. ``np.load`` reads members on first access, so opening a profile is cheap.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from entmtp.core import EntmtpError, atomic_write, check_regular_file, parse_json, require, short

PROFILE_FORMAT = "entmtp-profile"
PROFILE_FORMAT_VERSION = 1


@dataclass
class Trace:
    """One prompt's greedy trajectory."""

    prompt_index: int  # index of the prompt in the task's full prompt list (defines merge order)
    prompt_id: str
    entropy: np.ndarray  # [positions] float32, nats
    ranks: np.ndarray  # [positions, heads] int16, -1 = miss
    prompt_length: int = 0  # prompt tokens (context length at the first position)
    draft_entropy: np.ndarray | None = None  # [positions] float32, nats: head 1's entropy

    def __post_init__(self) -> None:
        self.entropy = np.asarray(self.entropy, dtype=np.float32)
        self.ranks = np.asarray(self.ranks, dtype=np.int16)
        if self.draft_entropy is not None:
            self.draft_entropy = np.asarray(self.draft_entropy, dtype=np.float32)
            if self.draft_entropy.shape != self.entropy.shape:
                raise EntmtpError(
                    f"trace {self.prompt_id}: {self.draft_entropy.shape} draft entropies for "
                    f"{len(self.entropy)} positions"
                )
        if self.ranks.ndim != 2 or self.entropy.ndim != 1:
            raise EntmtpError(
                f"trace {self.prompt_id}: entropy must be 1-D and ranks 2-D [positions, heads]"
            )
        if len(self.entropy) != len(self.ranks):
            raise EntmtpError(
                f"trace {self.prompt_id}: {len(self.entropy)} entropies but {len(self.ranks)} "
                "rank rows"
            )

    @property
    def num_positions(self) -> int:
        return len(self.entropy)


@dataclass
class ProfileMeta:
    model: str = ""
    vocab_size: int = 0
    hidden_size: int = 0
    head_type: str = "medusa"  # medusa | hydra
    num_heads: int = 0
    heads_sha256: str = ""
    task: str = ""
    topk: int = 10
    split: str = ""
    max_new_tokens: int = 0
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def compatible_with(self, other: ProfileMeta) -> bool:
        a, b = asdict(self), asdict(other)
        a.pop("extra"), b.pop("extra")
        return a == b


@dataclass
class Profile:
    meta: ProfileMeta
    traces: list[Trace]

    def __post_init__(self) -> None:
        heads = {t.ranks.shape[1] for t in self.traces}
        if len(heads) > 1:
            raise EntmtpError(f"profile traces disagree on the number of heads: {sorted(heads)}")
        if heads and self.meta.num_heads and heads != {self.meta.num_heads}:
            raise EntmtpError(
                f"profile metadata says {self.meta.num_heads} heads but traces have {heads.pop()}"
            )

    @property
    def num_heads(self) -> int:
        if self.traces:
            return int(self.traces[0].ranks.shape[1])
        return self.meta.num_heads

    @property
    def num_positions(self) -> int:
        return sum(t.num_positions for t in self.traces)

    def entropy(self) -> np.ndarray:
        """All positions' entropies, traces concatenated: [positions] float32."""
        if not self.traces:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([t.entropy for t in self.traces])

    @property
    def has_draft_entropy(self) -> bool:
        return all(t.draft_entropy is not None for t in self.traces)

    def draft_entropy(self) -> np.ndarray:
        """All positions' head-1 entropies, traces concatenated: [positions] float32."""
        if not self.has_draft_entropy:
            raise EntmtpError(
                "this profile has no draft (head 1) entropies (a synthetic one has none): "
                "profile the model and heads with `entmtp calibrate`"
            )
        if not self.traces:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([t.draft_entropy for t in self.traces])

    def ranks(self) -> np.ndarray:
        """All positions' rank vectors, traces concatenated: [positions, heads] int16."""
        if not self.traces:
            return np.zeros((0, self.num_heads), dtype=np.int16)
        return np.concatenate([t.ranks for t in self.traces])

    def subset(self, prompt_indices: Iterable[int]) -> Profile:
        keep = set(prompt_indices)
        return Profile(self.meta, [t for t in self.traces if t.prompt_index in keep])

    # -- storage -------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        offsets = np.zeros(len(self.traces) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([t.num_positions for t in self.traces])
        header = {
            "format": PROFILE_FORMAT,
            "format_version": PROFILE_FORMAT_VERSION,
            "meta": asdict(self.meta),
            "prompt_ids": [t.prompt_id for t in self.traces],
        }
        arrays = {
            "header": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
            "offsets": offsets,
            "prompt_index": np.array([t.prompt_index for t in self.traces], dtype=np.int64),
            "prompt_length": np.array([t.prompt_length for t in self.traces], dtype=np.int64),
            "entropy": self.entropy(),
            "ranks": self.ranks().astype(np.int16),
        }
        if self.traces and self.has_draft_entropy:
            arrays["draft_entropy"] = self.draft_entropy()
        return atomic_write(path, lambda handle: np.savez(handle, **arrays))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Profile:
        """Read and check a profile: every array, every header field and every value (finite,
        non-negative entropies; ranks in [-1, topk)); one line naming the file and the field
        for anything wrong."""
        path = Path(path)
        source = f"profile {path}"
        fix = "delete it and profile again (entmtp calibrate)"
        if not path.exists() and not path.is_symlink():
            raise EntmtpError(f"{source} does not exist: run `entmtp calibrate` first")
        check_regular_file(path, source=source, fix="give the profile.npz entmtp calibrate wrote")
        try:
            with open(path, "rb") as handle:  # a regular file: this cannot block
                magic = handle.read(4)
        except OSError as err:
            raise EntmtpError(f"{source} cannot be read: {err.strerror}") from err
        if magic != b"PK\x03\x04":  # every .npz is a zip archive
            raise EntmtpError(f"{source} is not a profile (not an .npz archive): give the "
                              "profile.npz entmtp calibrate wrote")
        try:
            with np.load(path, allow_pickle=False) as data:
                missing = [name for name in _PROFILE_ARRAYS if name not in data.files]
                if missing:
                    raise EntmtpError(f"{source}: the array {missing[0]!r} is missing: {fix}")
                arrays = {name: data[name] for name in _PROFILE_ARRAYS}
                draft = data["draft_entropy"] if "draft_entropy" in data.files else None
        # A cut-off .npz fails in zipfile (BadZipFile, EOFError), not only with OSError.
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise EntmtpError(
                f"profile {path} is unreadable or truncated ({short(str(err))}); re-run it"
            ) from err
        header_bytes = arrays["header"]
        if header_bytes.dtype != np.uint8 or header_bytes.ndim != 1:
            raise EntmtpError(f"{source}: header is not a byte array: {fix}")
        header = parse_json(header_bytes.tobytes(), source=f"{source} header", expect=None,
                            fix=fix)
        if not isinstance(header, dict):
            raise EntmtpError(f"{path} is not an entmtp profile (its header is not a JSON object)")
        if header.get("format") != PROFILE_FORMAT:
            raise EntmtpError(f"{path} is not an entmtp profile (format={header.get('format')!r})")
        version = header.get("format_version", 0)
        if isinstance(version, bool) or not isinstance(version, int):
            raise EntmtpError(f"{source}: format_version {short(repr(version))} is not an integer:"
                              " delete it and profile again")
        if version > PROFILE_FORMAT_VERSION:
            raise EntmtpError(
                f"profile {path} has format_version {header['format_version']}, newer than this "
                f"entmtp reads ({PROFILE_FORMAT_VERSION}): upgrade entmtp"
            )
        meta = _read_meta(require(header, "meta", dict, source=source, fix=fix), source, fix)
        prompt_ids = require(header, "prompt_ids", list, source=source, fix=fix)
        for i, prompt_id in enumerate(prompt_ids):
            if not isinstance(prompt_id, str):
                raise EntmtpError(f"{source}: prompt_ids[{i}] is not a string: {fix}")
        offsets, prompt_index, prompt_length, entropy, ranks = (
            _array(arrays, name, source, fix, kind, ndim) for name, kind, ndim in (
                ("offsets", "i", 1), ("prompt_index", "i", 1), ("prompt_length", "i", 1),
                ("entropy", "f", 1), ("ranks", "i", 2)))
        if draft is not None:
            draft = _array({"draft_entropy": draft}, "draft_entropy", source, fix, "f", 1)
        count = len(prompt_ids)
        if not (len(prompt_index) == len(prompt_length) == len(offsets) - 1 == count):
            raise EntmtpError(f"{source}: {count} prompt_ids, {len(prompt_index)} prompt_index, "
                              f"{len(prompt_length)} prompt_length and {len(offsets)} offsets "
                              f"(inconsistent trace counts): {fix}")
        positions = len(entropy)
        if offsets[0] != 0 or offsets[-1] != positions or np.any(np.diff(offsets) < 0):
            raise EntmtpError(f"{source}: offsets must rise from 0 to the {positions} positions: "
                              f"{fix}")
        if len(ranks) != positions or (draft is not None and len(draft) != positions):
            raise EntmtpError(f"{source}: {positions} entropies, {len(ranks)} rank rows"
                              + ("" if draft is None else f", {len(draft)} draft entropies")
                              + f" (shape mismatch): {fix}")
        if meta.num_heads and ranks.shape[1] != meta.num_heads:
            raise EntmtpError(f"{source}: ranks has {ranks.shape[1]} columns but meta.num_heads "
                              f"is {meta.num_heads} (shape mismatch): {fix}")
        if np.any(prompt_length < 0) or np.any(prompt_index < 0):
            raise EntmtpError(f"{source}: prompt_index and prompt_length must not be negative: "
                              f"{fix}")
        if len(np.unique(prompt_index)) != count:
            raise EntmtpError(f"{source}: prompt_index repeats a prompt: {fix}")
        problem = values_problem(entropy, ranks, draft, topk=meta.topk)
        if problem is not None:
            raise EntmtpError(f"{source}: {problem}: {fix}")
        traces = [
            Trace(
                prompt_index=int(prompt_index[i]),
                prompt_id=prompt_ids[i],
                entropy=entropy[offsets[i] : offsets[i + 1]],
                ranks=ranks[offsets[i] : offsets[i + 1]],
                prompt_length=int(prompt_length[i]),
                draft_entropy=None if draft is None else draft[offsets[i] : offsets[i + 1]],
            )
            for i in range(count)
        ]
        return cls(meta, traces)


_PROFILE_ARRAYS = ("header", "offsets", "prompt_index", "prompt_length", "entropy", "ranks")
# Entropies are sums of -p log p >= 0; float32 rounding may leave a tiny negative value.
ENTROPY_TOLERANCE = 1e-4


def values_problem(entropy: np.ndarray, ranks: np.ndarray, draft: np.ndarray | None, *,
                   topk: int) -> str | None:
    """What is wrong with a profile's or trace's values, naming the field, or None: entropies
    (nats) must be finite and not negative, ranks in [-1, topk) (-1: a miss)."""
    for name, values in (("entropy", entropy), ("draft_entropy", draft)):
        if values is None or not len(values):
            continue
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            return f"{name}[{bad[0]}] is {values[bad[0]]} (entropies must be finite)"
        low = np.flatnonzero(values < -ENTROPY_TOLERANCE)
        if len(low):
            return f"{name}[{low[0]}] is {values[low[0]]:.6g} (entropies are not negative)"
    if ranks.size:
        outside = np.argwhere((ranks < -1) | (ranks >= topk))
        if len(outside):
            row, head = outside[0]
            return (f"ranks[{row}, {head}] is {ranks[row, head]}, outside [-1, {topk}) "
                    f"(-1 is a miss; meta.topk is {topk})")
    return None


def _array(arrays: dict[str, np.ndarray], name: str, source: str, fix: str, kind: str,
           ndim: int) -> np.ndarray:
    """``arrays[name]`` if its dtype is of ``kind`` ("i": integer, "f": float) and it has
    ``ndim`` dimensions."""
    array = arrays[name]
    if array.dtype.kind != kind and not (kind == "i" and array.dtype.kind == "u"):
        wanted = {"i": "integers", "f": "floating-point numbers"}[kind]
        raise EntmtpError(f"{source}: {name} holds {array.dtype} values, not {wanted}: {fix}")
    if array.ndim != ndim:
        raise EntmtpError(f"{source}: {name} has shape {array.shape}, not {ndim}-D (shape "
                          f"mismatch): {fix}")
    return array


_META_FIELDS: dict[str, tuple[type, int | None]] = {  # field -> (type, minimum)
    "model": (str, None), "vocab_size": (int, 0), "hidden_size": (int, 0),
    "head_type": (str, None), "num_heads": (int, 0), "heads_sha256": (str, None),
    "task": (str, None), "topk": (int, 1), "split": (str, None), "max_new_tokens": (int, 0),
    "seed": (int, None), "extra": (dict, None),
}


def _read_meta(meta: dict[str, Any], source: str, fix: str) -> ProfileMeta:
    unknown = sorted(set(meta) - set(_META_FIELDS))
    if unknown:
        raise EntmtpError(f"{source}: meta.{unknown[0]} is not a profile field (written by "
                          f"another entmtp?): {fix}")
    for key, (kind, minimum) in _META_FIELDS.items():
        if key not in meta:
            continue
        value = require(meta, key, kind, source=source, fix=fix, where="meta")
        if minimum is not None and value < minimum:
            raise EntmtpError(f"{source}: meta.{key} is {value}, below {minimum}: {fix}")
    return ProfileMeta(**meta)


def merge_profiles(shards: Sequence[Profile]) -> Profile:
    """Combine shard profiles into the profile one process would have produced.

    Traces are ordered by ``prompt_index``; metadata must agree (``extra`` aside); a prompt that
    appears in two shards is an error.
    """
    if not shards:
        raise EntmtpError("no shard profiles to merge")
    meta = shards[0].meta
    for shard in shards[1:]:
        if not meta.compatible_with(shard.meta):
            raise EntmtpError(
                "shard profiles come from different settings (model, heads, task, top-k or split): "
                "merge only shards of one run"
            )
    traces = [t for shard in shards for t in shard.traces]
    indices = [t.prompt_index for t in traces]
    if len(set(indices)) != len(indices):
        raise EntmtpError("two shards profiled the same prompt: check --num-shards/--shard-index")
    traces.sort(key=lambda t: t.prompt_index)
    extra: dict[str, Any] = {}
    for shard in shards:
        extra.update(shard.meta.extra)
    merged_meta = ProfileMeta(**{**asdict(meta), "extra": extra})
    return Profile(merged_meta, traces)
