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

from entmtp.core import EntmtpError, atomic_write

from ._readers import parse_json, short

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
        path = Path(path)
        if not path.is_file():
            raise EntmtpError(f"profile {path} does not exist: run `entmtp calibrate` first")
        source = f"profile {path}"
        try:
            with np.load(path, allow_pickle=False) as data:
                header_bytes = bytes(data["header"])
                offsets = data["offsets"]
                prompt_index = data["prompt_index"]
                prompt_length = data["prompt_length"]
                entropy = data["entropy"]
                ranks = data["ranks"]
                draft = data["draft_entropy"] if "draft_entropy" in data.files else None
        # A cut-off .npz fails in zipfile (BadZipFile, EOFError), not only with OSError.
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise EntmtpError(
                f"profile {path} is unreadable or truncated ({short(str(err))}); re-run it"
            ) from err
        header = parse_json(header_bytes, source=f"{source} header", expect=None,
                            fix="delete it and profile again")
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
        try:
            meta = ProfileMeta(**header["meta"])
            prompt_ids = list(header["prompt_ids"])
        except (KeyError, TypeError) as err:
            raise EntmtpError(f"profile {path} has a bad header ({err}); re-run it") from err
        if not (len(prompt_ids) == len(prompt_index) == len(prompt_length) == len(offsets) - 1):
            raise EntmtpError(f"profile {path} has inconsistent trace counts; re-run it")
        traces = [
            Trace(
                prompt_index=int(prompt_index[i]),
                prompt_id=str(prompt_ids[i]),
                entropy=entropy[offsets[i] : offsets[i + 1]],
                ranks=ranks[offsets[i] : offsets[i + 1]],
                prompt_length=int(prompt_length[i]),
                draft_entropy=None if draft is None else draft[offsets[i] : offsets[i + 1]],
            )
            for i in range(len(prompt_index))
        ]
        return cls(meta, traces)


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
