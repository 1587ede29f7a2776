"""Head-training data on disk: token records made by one run, read by another.

A record is one token sequence ``tokens`` and the index ``start`` of its first trained position:
head training reads the base model's hidden state at positions ``start .. len - 2`` (one
teacher-forced forward of the whole sequence, at training time) and learns the tokens after
them. Two kinds of record share that form:

- self-distilled: a prompt followed by the base model's greedy continuation, ``start`` at the
  prompt's last token (made by batched greedy generation with a KV cache, the costly part);
- teacher-forced: a prompt followed by a reference answer (a training split's answer, a
  conversation's reply, a function's body), ``start`` at the prompt's last token; no model run.

Only tokens are stored (int32, 4 bytes a token, against 2-4 KB of hidden state per token for a
576-wide model), so millions of tokens fit in a few shards that travel between machines; the
trainer recomputes hidden states with one batched forward, far cheaper than generating.

Layout of a data folder::

    index.json            format, version, model fingerprint, plan digest, settings, and per
                          finished shard: file, records, tokens, trained positions per source
    shard-00000.safetensors   tokens [sum L] int32, lengths [R] int32, starts [R] int32,
                              source_ids [R] int32 (into index.json "sources")

Each shard covers a fixed slice of the input items (``shard_size`` of them) and is written
atomically, then the index; a killed run resumes at the first shard the index does not list.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from entmtp.core import (
    EntmtpError,
    atomic_write,
    atomic_write_json,
    dtype_name,
    parse_jsonl,
    read_bytes,
    read_json,
)
from entmtp.model import greedy_generate, unwrap_base

from ._trajectories import (
    Progress,
    Trajectory,
    _eos_ids,
    load_trajectories,
    save_trajectories,
    text_trajectories,
    trajectories_key,
)

DATA_FORMAT = "entmtp-head-data"
DATA_FORMAT_VERSION = 1
INDEX_NAME = "index.json"
# Embedding entries kept in the fingerprint: enough to tell two models of one architecture
# apart, compared with a tolerance so that the same model loaded in another dtype still matches.
PROBE_ROWS, PROBE_COLS = 4, 8
PROBE_RTOL = 2e-2


@dataclass
class DataItem:
    """One input of data generation: a prompt, with a reference answer for teacher forcing."""

    source: str  # label, e.g. "gsm8k-train" or "math"
    prompt_ids: list[int]
    answer_ids: list[int] | None = None  # None: self-distilled (greedy continuation)


@dataclass
class Record:
    """One stored sequence; positions ``start .. len(tokens) - 2`` are trained on."""

    tokens: Tensor  # [L] int64
    start: int
    source: str

    @property
    def trained_positions(self) -> int:
        return max(0, len(self.tokens) - 1 - self.start)


@dataclass
class HeadData:
    index: dict[str, Any]  # index.json
    records: list[Record]


# ---------------------------------------------------------------------------------------------
# Model fingerprint


def data_fingerprint(base: Any) -> dict[str, Any]:
    """What identifies the model the data was made for (name, sizes, a few embedding values)."""
    module = unwrap_base(base)
    config = module.config.get_text_config()
    embedding = module.get_input_embeddings().weight
    probe = embedding[:PROBE_ROWS, :PROBE_COLS].detach().float().cpu()
    name = getattr(base, "name", None) or getattr(config, "_name_or_path", "") or config.model_type
    return {
        "name": str(name),
        "vocab_size": int(module.get_output_embeddings().weight.shape[0]),
        "hidden_size": int(config.hidden_size),
        "num_layers": int(config.num_hidden_layers),
        "embedding_probe": [[round(float(v), 6) for v in row] for row in probe],
    }


def check_fingerprint(stored: dict[str, Any], base: Any, path: Path) -> None:
    """Raise ``EntmtpError`` when the data in ``path`` was made for another model."""
    current = data_fingerprint(base)
    same = all(stored.get(key) == current[key]
               for key in ("name", "vocab_size", "hidden_size", "num_layers"))
    if same:
        want = torch.as_tensor(stored.get("embedding_probe", []), dtype=torch.float32)
        have = torch.as_tensor(current["embedding_probe"], dtype=torch.float32)
        same = want.shape == have.shape and bool(
            torch.allclose(want, have, rtol=PROBE_RTOL, atol=1e-4))
    if not same:
        raise EntmtpError(
            f"{path} holds head data made for model {stored.get('name')!r} "
            f"(vocab {stored.get('vocab_size')}, hidden {stored.get('hidden_size')}), not for "
            f"{current['name']!r}: make data for this model with `entmtp heads data`"
        )


# ---------------------------------------------------------------------------------------------
# Making records


def _plan_digest(fingerprint: dict[str, Any], items: Sequence[DataItem], settings: dict) -> str:
    digest = hashlib.sha256(json.dumps([fingerprint, settings], sort_keys=True).encode())
    for item in items:
        digest.update(json.dumps([item.source, item.prompt_ids, item.answer_ids]).encode())
    return digest.hexdigest()


def make_records(
    base: Any,
    items: Sequence[DataItem],
    *,
    max_new_tokens: int,
    generation_batch_size: int,
) -> list[Record]:
    """Records of ``items`` in order: teacher-forced ones as given, self-distilled ones by
    batched greedy generation (prompts sorted by length so that a batch pads little)."""
    module = unwrap_base(base)
    eos = _eos_ids(base, module)
    records: list[Record | None] = [None] * len(items)
    greedy: list[int] = []
    for position, item in enumerate(items):
        if not item.prompt_ids:
            raise EntmtpError(f"an empty {item.source!r} prompt cannot be continued: drop it")
        if item.answer_ids is None:
            greedy.append(position)
        else:
            tokens = torch.as_tensor(item.prompt_ids + item.answer_ids, dtype=torch.int64)
            records[position] = Record(tokens, len(item.prompt_ids) - 1, item.source)
    greedy.sort(key=lambda position: len(items[position].prompt_ids))
    for first in range(0, len(greedy), generation_batch_size):
        batch = greedy[first:first + generation_batch_size]
        prompts = [items[position].prompt_ids for position in batch]
        runs = greedy_generate(module, prompts, max_new_tokens=max_new_tokens, eos_token_ids=eos)
        for position, prompt, run in zip(batch, prompts, runs, strict=True):
            tokens = torch.as_tensor(prompt + run.tokens, dtype=torch.int64)
            records[position] = Record(tokens, len(prompt) - 1, items[position].source)
    return [record for record in records if record is not None]


def _shard_name(number: int) -> str:
    return f"shard-{number:05d}.safetensors"


def _write_shard(path: Path, records: Sequence[Record], sources: list[str]) -> None:
    from safetensors.torch import save

    tensors = {
        "tokens": torch.cat([r.tokens for r in records]).to(torch.int32).contiguous(),
        "lengths": torch.as_tensor([len(r.tokens) for r in records], dtype=torch.int32),
        "starts": torch.as_tensor([r.start for r in records], dtype=torch.int32),
        "source_ids": torch.as_tensor([sources.index(r.source) for r in records],
                                      dtype=torch.int32),
    }
    payload = save(tensors)
    atomic_write(path, lambda handle: handle.write(payload))


def _shard_entry(name: str, records: Sequence[Record]) -> dict[str, Any]:
    by_source: dict[str, int] = {}
    for record in records:
        by_source[record.source] = by_source.get(record.source, 0) + record.trained_positions
    return {
        "file": name,
        "records": len(records),
        "tokens": sum(len(r.tokens) for r in records),
        "trained_positions": sum(r.trained_positions for r in records),
        "positions_by_source": dict(sorted(by_source.items())),
    }


def write_head_data(
    base: Any,
    out: str | os.PathLike,
    items: Sequence[DataItem],
    *,
    max_new_tokens: int = 128,
    generation_batch_size: int = 64,
    shard_size: int = 1024,
    extra: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Make the records of ``items`` into the folder ``out``, shard by shard; returns the index.

    Rerunning with the same model, items and settings resumes after the last finished shard;
    a folder made from other items or settings is refused.
    """
    if max_new_tokens < 1 or generation_batch_size < 1 or shard_size < 1:
        raise EntmtpError("max_new_tokens, the generation batch size and the shard size must "
                          "each be at least 1")
    if not items:
        raise EntmtpError("no prompts or texts to make head data from")
    folder = Path(out)
    fingerprint = data_fingerprint(base)
    settings = {"max_new_tokens": max_new_tokens, "shard_size": shard_size}
    plan = _plan_digest(fingerprint, items, settings)
    sources = sorted({item.source for item in items})
    num_shards = math.ceil(len(items) / shard_size)
    index_path = folder / INDEX_NAME
    dtype = dtype_name(next(unwrap_base(base).parameters()).dtype)
    if index_path.is_file():
        index = read_head_data_index(folder)
        check_fingerprint(index["model"], base, folder)
        # Greedy trajectories depend on the weights' precision (bf16 parts from fp32 within a
        # few dozen tokens), so one folder holds one precision's.
        if index.get("dtype", dtype) != dtype:
            raise EntmtpError(
                f"{folder} holds trajectories generated in {index['dtype']}, not {dtype}: resume "
                f"it with --dtype {index['dtype']}, or give another --out"
            )
        if index.get("plan_sha256") != plan:
            raise EntmtpError(
                f"{folder} holds head data made from other prompts or settings: give another "
                "--out, or the same options to resume it"
            )
    else:
        index = {
            "format": DATA_FORMAT,
            "format_version": DATA_FORMAT_VERSION,
            "model": fingerprint,
            "dtype": dtype,
            "plan_sha256": plan,
            **settings,
            "items": len(items),
            "sources": sources,
            "num_shards": num_shards,
            "complete": False,
            "shards": [],
            **(extra or {}),
        }
    done = len(index["shards"])
    if progress is not None:
        progress("generate", done, num_shards)
    for number in range(done, num_shards):
        chunk = items[number * shard_size:(number + 1) * shard_size]
        records = make_records(base, chunk, max_new_tokens=max_new_tokens,
                               generation_batch_size=generation_batch_size)
        name = _shard_name(number)
        _write_shard(folder / name, records, sources)
        index["shards"].append(_shard_entry(name, records))
        index["complete"] = number + 1 == num_shards
        atomic_write_json(index_path, index)
        if progress is not None:
            progress("generate", number + 1, num_shards)
    return index


# ---------------------------------------------------------------------------------------------
# Reading


def read_head_data_index(folder: Path) -> dict[str, Any]:
    """The index of a head-data folder, checked: one line if it is missing or foreign."""
    path = folder / INDEX_NAME
    if not path.exists():
        raise EntmtpError(f"{folder} is no head-data folder (no {INDEX_NAME}): make one with "
                          "`entmtp heads data`")
    index = read_json(path, source=f"head-data index {path}", fix="make the data again")
    if index.get("format") != DATA_FORMAT:
        raise EntmtpError(f"{path} is not an entmtp head-data index")
    if index.get("format_version") != DATA_FORMAT_VERSION:
        raise EntmtpError(f"{path} has head-data version {index.get('format_version')}; this "
                          f"entmtp reads version {DATA_FORMAT_VERSION}: make the data again")
    return index


def shard_problem(tokens: Tensor, lengths: Tensor, starts: Tensor, source_ids: Tensor, *,
                  vocab_size: int, num_sources: int) -> str | None:
    """None when a shard's arrays hold records (see the module docstring); else what is wrong.
    ``tokens`` [sum L], ``lengths`` / ``starts`` / ``source_ids`` [R]."""
    arrays = {"tokens": tokens, "lengths": lengths, "starts": starts, "source_ids": source_ids}
    for name, array in arrays.items():
        if array.dim() != 1 or array.dtype.is_floating_point or array.dtype.is_complex \
                or array.dtype == torch.bool:
            return f"{name} is not a 1-D integer array ({array.dtype}, {array.dim()}-D)"
    if not len(lengths) == len(starts) == len(source_ids):
        return "lengths, starts and source_ids differ in length"
    if len(lengths) and int(lengths.min()) < 1:
        return "a record has no token"
    if int(lengths.sum()) != len(tokens):
        return f"lengths add up to {int(lengths.sum())}, not the {len(tokens)} tokens"
    if len(tokens) and not (0 <= int(tokens.min()) and int(tokens.max()) < vocab_size):
        return (f"token ids {int(tokens.min())}..{int(tokens.max())} are outside the model's "
                f"vocabulary of {vocab_size}")
    if len(starts) and (int(starts.min()) < 0 or bool((starts >= lengths).any())):
        return "a record's start is not one of its positions"
    if len(source_ids) and not (0 <= int(source_ids.min())
                                and int(source_ids.max()) < num_sources):
        return f"source ids outside the {num_sources} sources of {INDEX_NAME}"
    return None


def read_head_data(path: str | os.PathLike, base: Any | None = None, *,
                   allow_unfinished: bool = False) -> HeadData:
    """All records of a finished data folder (or, with ``allow_unfinished``, of the finished
    shards of a stopped run); with ``base``, refuse another model's data."""
    folder = Path(path)
    index = read_head_data_index(folder)
    if base is not None:
        check_fingerprint(index["model"], base, folder)
    if not index["shards"]:
        raise EntmtpError(f"{folder} has no finished shard yet: run `entmtp heads data` longer")
    if not index.get("complete") and not allow_unfinished:
        raise EntmtpError(f"{folder} is unfinished ({len(index['shards'])} of "
                          f"{index['num_shards']} shards): rerun the same `entmtp heads data` "
                          "command to finish it, or train on what is there with "
                          "--allow-unfinished")
    from safetensors import safe_open

    sources = index["sources"]
    records: list[Record] = []
    for entry in index["shards"]:
        shard = folder / entry["file"]
        try:
            with safe_open(str(shard), framework="pt") as handle:
                tokens, lengths, starts, source_ids = (
                    handle.get_tensor(name) for name in ("tokens", "lengths", "starts",
                                                         "source_ids"))
        except Exception as err:
            raise EntmtpError(f"cannot read head-data shard {shard}: {err}: make the data "
                              "again") from err
        if len(lengths) != entry["records"] or int(lengths.sum()) != entry["tokens"]:
            raise EntmtpError(f"{shard} does not match {INDEX_NAME}: make the data again")
        problem = shard_problem(tokens, lengths, starts, source_ids,
                                vocab_size=int(index["model"]["vocab_size"]),
                                num_sources=len(sources))
        if problem is not None:
            raise EntmtpError(f"head-data shard {shard} is damaged ({problem}): make the data "
                              "again")
        offset = 0
        for length, start, source in zip(lengths.tolist(), starts.tolist(),
                                         source_ids.tolist(), strict=True):
            records.append(Record(tokens[offset:offset + length].long(), start, sources[source]))
            offset += length
    return HeadData(index=index, records=records)


# ---------------------------------------------------------------------------------------------
# Records -> training trajectories


def record_trajectories(
    base: Any,
    records: Sequence[Record],
    *,
    batch_size: int = 16,
    whole: bool = False,
    progress: Progress | None = None,
) -> list[Trajectory]:
    """Trajectories (hidden states at the trained positions and the tokens after them) of
    ``records`` with trained positions, in order, by one teacher-forced forward per record
    (batched by length). ``whole``: from the record's first position (prompt included) instead,
    so trajectory position ``record.start`` is the first trained one."""
    usable = [record for record in records if record.trained_positions > 0]
    order = sorted(range(len(usable)), key=lambda i: len(usable[i].tokens))
    result: list[Trajectory | None] = [None] * len(usable)
    report: Callable[[str, int, int], None] | None = progress
    for first in range(0, len(order), batch_size):
        chunk = order[first:first + batch_size]
        sequences = [usable[i].tokens for i in chunk]
        width = max(len(tokens) for tokens in sequences)
        forwarded = text_trajectories(base, sequences, max_length=width, batch_size=len(chunk))
        for i, trajectory in zip(chunk, forwarded, strict=True):
            start = 0 if whole else usable[i].start
            result[i] = Trajectory(trajectory.hidden[start:].clone(),
                                   trajectory.tokens[start:].clone(), usable[i].source)
        if report is not None:
            report("forward", min(first + batch_size, len(order)), len(order))
    return [trajectory for trajectory in result if trajectory is not None]


def cached_trajectories(
    base: Any,
    head_data: HeadData,
    cache: str | os.PathLike | None,
    *,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> list[Trajectory]:
    """``record_trajectories`` of ``head_data``, kept in the file ``cache`` (None: not kept).

    The teacher-forced forward costs more than training on a CPU; the file lets later runs
    (the other head type, other settings) skip it. It is used when it was made from the same
    data (whose plan digest names the model it was made for, which ``read_head_data``
    checked), in the same dtype on the same kind of device: as it is for the same shards, or,
    when it holds the first shards of a run that has finished more since, extended by the
    forward of the new shards only. Anything else is refused, never silently recomputed over.
    """
    module = unwrap_base(base)
    weight = module.get_input_embeddings().weight
    index = head_data.index
    shards = [entry["file"] for entry in index["shards"]]
    key = {"format": "entmtp-hidden-states", "plan_sha256": index["plan_sha256"],
           "shards": shards, "dtype": dtype_name(weight.dtype), "device": weight.device.type}
    path = None if cache is None else Path(cache)
    kept: list[Trajectory] = []
    records = head_data.records
    if path is not None and path.exists():
        stored = trajectories_key(path)
        if stored == key:
            return load_trajectories(path)
        held = (stored or {}).get("shards")
        if not (isinstance(held, list) and held and shards[:len(held)] == held
                and {**stored, "shards": shards} == key):
            raise EntmtpError(
                f"--hidden-cache {path} holds hidden states of other head data, shards, dtype "
                "or device: delete it or name another file")
        kept = load_trajectories(path)
        records = records[sum(entry["records"] for entry in index["shards"][:len(held)]):]
    trajectories = kept + record_trajectories(base, records, batch_size=batch_size,
                                              progress=progress)
    if path is not None:
        save_trajectories(path, trajectories, key=key)
    return trajectories


def check_first_shard(index: dict[str, Any], first_shard: int) -> None:
    """One line unless ``first_shard`` names a finished shard of the data ``index`` describes."""
    count = len(index["shards"])
    if not 0 <= first_shard < count:
        raise EntmtpError(f"--from-shard {first_shard}: the data has {count} finished shards; "
                          f"give 0 to {count - 1}")


def trajectories_from_shard(head_data: HeadData, trajectories: Sequence[Trajectory],
                            first_shard: int) -> list[Trajectory]:
    """The part of ``trajectories`` (``record_trajectories`` of all of ``head_data``'s records,
    in order) that comes from shard ``first_shard`` on: what a run fine-tuning on the shards a
    data run finished since an earlier training trains on."""
    check_first_shard(head_data.index, first_shard)
    shards = head_data.index["shards"]
    skipped_records = sum(entry["records"] for entry in shards[:first_shard])
    skipped = sum(record.trained_positions > 0 for record in head_data.records[:skipped_records])
    usable = sum(record.trained_positions > 0 for record in head_data.records)
    if usable != len(trajectories):
        raise ValueError(f"{len(trajectories)} trajectories for {usable} trainable records")
    return list(trajectories[skipped:])


# ---------------------------------------------------------------------------------------------
# Inputs


def answer_end_id(base: Any) -> int | None:
    """The token that ends an answer: the chat end token of an instruct model, else EOS."""
    from entmtp.model import CHAT_END_TOKENS

    tokenizer = base.tokenizer
    vocab = tokenizer.get_vocab()
    if getattr(base, "is_instruct", False):
        for token in CHAT_END_TOKENS:
            if token in vocab:
                return int(vocab[token])
    return tokenizer.eos_token_id


def encode_item(base: Any, prompt: str, answer: str | None, source: str, *,
                max_answer_tokens: int) -> DataItem:
    """A DataItem of text: the prompt as the model sees it (chat template for instruct models),
    the answer's tokens (cut to ``max_answer_tokens``) then the answer end token."""
    prompt_ids = list(base.encode_prompt(prompt))
    if answer is None:
        return DataItem(source, prompt_ids)
    answer_ids = list(base.tokenizer(answer, add_special_tokens=False)["input_ids"])
    end = answer_end_id(base)
    if end is not None:
        answer_ids.append(int(end))
    return DataItem(source, prompt_ids, answer_ids[:max_answer_tokens])


def read_jsonl_items(path: str | os.PathLike, *,
                     option: str = "--data") -> list[tuple[str, str | None, str]]:
    """(prompt, answer or None, source) of each line of a JSONL file (``.gz`` too): ``prompt``
    required, ``answer`` (teacher-forced when present) and ``source`` (default: the file's
    stem). ``option``: what errors call the file."""
    import gzip
    import zlib

    file = Path(path)
    source = f"{option} file {file}"
    fix = "one JSON object with a 'prompt' string per line"
    raw = read_bytes(file, source=source, fix=fix)
    if file.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise EntmtpError(f"{source}: not a readable .gz file ({err}): {fix}") from err
    default_source = file.name.split(".")[0]
    rows: list[tuple[str, str | None, str]] = []
    for number, row in parse_jsonl(raw, source=source, fix=fix):
        prompt, answer = row.get("prompt"), row.get("answer")
        if not isinstance(prompt, str) or not prompt.strip() or not (
                answer is None or isinstance(answer, str)):
            raise EntmtpError(f"{file} line {number} needs a non-empty string 'prompt' "
                              "(and 'answer', if any, a string)")
        rows.append((prompt, answer, str(row.get("source") or default_source)))
    if not rows:
        raise EntmtpError(f"{file} has no prompts")
    return rows
