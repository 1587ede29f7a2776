"""`entmtp heads train`: Medusa / Hydra draft heads for a frozen base model (the library call is
``entmtp.calibrate.train_heads_run``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from entmtp.calibrate import TrainArguments, train_heads_run
from entmtp.core import HEAD_TYPES, EntmtpError

from ._errors import user_errors
from ._model_setup import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    FORCE_OPTION,
    MODEL_OPTION,
    SEED_OPTION,
    check_device_and_dtype,
    check_output_folder,
    check_outputs,
    load_base,
)
from ._progress import progress_bar
from ._typer_app import app

heads_app = typer.Typer(no_args_is_help=True, help="Draft heads: make training data, train "
                        "Medusa / Hydra heads.")
app.add_typer(heads_app, name="heads")

STAGE_NAMES = {"generate": "generating trajectories", "forward": "teacher-forced forward",
               "teacher": "teacher distribution", "train": "training"}


def accuracy_table(report: Any) -> Table:
    """Held-out top-1 / top-5 accuracy of each head."""
    table = Table(title=f"held-out accuracy ({report.heldout_trajectories} trajectories, "
                        f"{report.heldout_positions} positions)", title_justify="left")
    for name in ("head", "positions", "top-1", "top-5"):
        table.add_column(name, justify="right")
    for acc in report.heldout:
        table.add_row(str(acc.depth), str(acc.positions),
                      f"{acc.top1:.3f}", f"{acc.top5:.3f}")
    return table


class StageProgress:
    """``(stage, done, total)`` callbacks as one progress bar (or log line) per stage."""

    def __init__(self, console: Console) -> None:
        self.bar = progress_bar(console, rate=False)
        self.jobs: dict[str, Any] = {}

    def __enter__(self) -> StageProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.jobs:
            self.jobs[stage] = self.bar.add_task(STAGE_NAMES.get(stage, stage), total=total,
                                                 completed=done)
        self.bar.update(self.jobs[stage], completed=done, total=total)


class TrainProgress(StageProgress):
    """A ``StageProgress`` whose bar starts at the first callback: while the arguments are
    checked and the model loads (or downloads, with its own progress bars) it holds nothing."""

    started = False

    def __enter__(self) -> TrainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            super().__exit__(*exc)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.started:
            self.started = True
            super().__enter__()
        super().__call__(stage, done, total)


def one_head_type(head_type: str | None, type_alias: str | None) -> str:
    """``--head-type``, or ``--type``: its old name, hidden from the help."""
    if head_type is not None and type_alias is not None and head_type != type_alias:
        raise EntmtpError(f"--head-type {head_type} and --type {type_alias} disagree: give "
                          "--head-type alone")
    chosen = head_type if head_type is not None else type_alias
    option = "--head-type" if head_type is not None else "--type"
    if chosen is None:
        raise EntmtpError("give --head-type medusa or --head-type hydra: the heads to train")
    if chosen not in HEAD_TYPES:
        raise EntmtpError(f"{option} {chosen!r}: use one of {', '.join(HEAD_TYPES)}")
    return chosen


@heads_app.command("train")
@user_errors
def train(
    head_type: str | None = typer.Option(None, "--head-type", help="The heads to train "
                                         "(required)."),
    type_alias: str | None = typer.Option(None, "--type", hidden=True),  # its old name
    out: Path = typer.Option(..., "--out", help="Folder to write the entmtp heads to."),
    model: str | None = MODEL_OPTION,
    task: list[str] = typer.Option(["chat"], "--task", help="code, chat, math or lit; repeat "
                                   "for several (prompts per task: --prompts)."),
    data: str | None = typer.Option(None, "--data", help="JSONL file with a 'prompt' field "
                                    "instead of tasks."),
    from_data: list[Path] = typer.Option([], "--from-data", help="Train on a folder made by "
                                         "`entmtp heads data` (for this model) instead of "
                                         "generating; repeat to train on several: "
                                         "--task/--data/--mode are then unused."),
    allow_unfinished: bool = typer.Option(False, "--allow-unfinished", help="With --from-data: "
                                          "train on the finished shards of stopped runs."),
    from_shard: list[int] = typer.Option([], "--from-shard", help="With --from-data: train "
                                         "on shards N.. only (0-based; one per --from-data, "
                                         "in the same order): go on from heads trained on the "
                                         "first N shards with what the data run made since."),
    split: str = typer.Option("calibration", "--split", help="calibration, heldout or all; "
                              "keep heldout unseen for `entmtp validate`."),
    prompts: int = typer.Option(64, "--prompts", help="Prompts per task."),
    mode: str = typer.Option("self-distill", "--mode", help="self-distill (learn the model's "
                             "own greedy continuations) or text (teacher-force the prompts)."),
    num_heads: int | None = typer.Option(None, "--num-heads", help="Heads to train (default "
                                         "4, or --init-heads' count)."),
    num_layers: int | None = typer.Option(None, "--num-layers", help="ResBlocks per head "
                                          "(default 1, or --init-heads' count)."),
    init_heads: Path | None = typer.Option(None, "--init-heads", help="Start from this entmtp "
                                           "heads folder of the same type instead of random "
                                           "heads (go on training with more data, another "
                                           "--loss or --lr)."),
    epochs: int = typer.Option(3, "--epochs", help="Passes over the training positions."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak learning rate of AdamW (a warm-up, then "
                             "a cosine decay to zero by the last step)."),
    batch_size: int = typer.Option(256, "--batch-size", help="Positions per optimizer step."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Greedy tokens per "
                                       "prompt (self-distill)."),
    heldout_fraction: float = typer.Option(0.1, "--heldout-fraction", help="Trajectories kept "
                                           "out of training for the accuracy table."),
    seed: int = SEED_OPTION,
    loss: str = typer.Option("full", "--loss", help="full (cross-entropy over the whole "
                             "vocabulary), or batch (frequent + target + sampled tokens: "
                             "several times cheaper on a CPU) or seen (tokens of the data)."),
    distill: int = typer.Option(0, "--distill", help="Learn the base model's distribution "
                                "at each target (its top-K tokens, renormalised) instead of its "
                                "one token; 0: the token alone."),
    forward_batch: int = typer.Option(16, "--forward-batch", help="Sequences per teacher-forced "
                                      "forward when reading --from-data."),
    hidden_cache: list[Path] = typer.Option([], "--hidden-cache", help="With --from-data: "
                                            "keep the base model's hidden states in this file "
                                            "(written on the first run, read by later ones: "
                                            "the forward costs more than training on a CPU); "
                                            "one per --from-data, in the same order."),
    max_seconds: float | None = typer.Option(None, "--max-seconds", help="End the training "
                                             "by this many seconds after the command starts: "
                                             "a schedule that would not fit is shortened (the "
                                             "learning rate still decays to zero) and the heads "
                                             "are written as usual."),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    force: bool = FORCE_OPTION,
) -> None:
    """Train draft heads on a frozen base model and write an entmtp heads folder.

    The base model runs on --device in --dtype; the heads train in float32 whatever --dtype
    (calibrate._train.fit_heads says why) and are stored in float16.

    Example: entmtp heads train --head-type medusa --task chat --task code --prompts 200
    --out heads/m

    Example: entmtp heads train --head-type hydra --from-data data/smollm2 --out heads/h
    """
    head_type = one_head_type(head_type, type_alias)
    arguments = TrainArguments(
        head_type=head_type, out=out, model=model, tasks=task, data=data, from_data=from_data,
        allow_unfinished=allow_unfinished, from_shard=from_shard, split=split, prompts=prompts,
        mode=mode, num_heads=num_heads, num_layers=num_layers, init_heads=init_heads,
        epochs=epochs, lr=lr, batch_size=batch_size, max_new_tokens=max_new_tokens,
        heldout_fraction=heldout_fraction, seed=seed, loss=loss, distill=distill,
        forward_batch=forward_batch, hidden_cache=hidden_cache, max_seconds=max_seconds,
        device=device, dtype=dtype)
    console = Console()
    with TrainProgress(console) as progress:
        trained = train_heads_run(arguments, progress)
    report = trained.report
    losses = report.epoch_losses
    if report.steps < report.planned_steps:
        console.print(f"--max-seconds: trained {report.steps} of {report.planned_steps} "
                      "planned steps (the schedule shortened to end in time)")
    console.print(f"trained on {report.train_trajectories} trajectories "
                  f"({report.train_positions} positions); loss {losses[0]:.3f} after epoch 1, "
                  f"{losses[-1]:.3f} after epoch {len(losses)}")
    if report.heldout:
        console.print(accuracy_table(report))
    else:
        console.print("no held-out trajectories: raise --heldout-fraction or --prompts for an "
                      "accuracy table")
    console.print(f"wrote {trained.path}")


@heads_app.command("data")
@user_errors
def data_command(
    out: Path = typer.Option(..., "--out", help="Folder to write the head data to (rerun the "
                             "same command to resume it)."),
    model: str | None = MODEL_OPTION,
    task: list[str] = typer.Option([], "--task", help="Self-distill the prompts of these tasks "
                                   "(--split, --prompts per task); repeat for several."),
    data: list[Path] = typer.Option([], "--data", help="JSONL (or .jsonl.gz): 'prompt', "
                                    "optional 'answer' (then teacher-forced on it) and "
                                    "'source'; repeat for several."),
    split: str = typer.Option("calibration", "--split", help="Task split for --task."),
    prompts: int = typer.Option(64, "--prompts", help="Prompts per --task."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="Greedy tokens per "
                                       "self-distilled prompt."),
    max_answer_tokens: int = typer.Option(256, "--max-answer-tokens", help="Answer tokens kept "
                                          "per teacher-forced line."),
    generation_batch: int = typer.Option(64, "--generation-batch", help="Prompts generated "
                                         "together (padded, KV cache)."),
    shard_size: int = typer.Option(1024, "--shard-size", help="Prompts per shard (the unit "
                                   "of resuming)."),
    seed: int = SEED_OPTION,
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    force: bool = FORCE_OPTION,
) -> None:
    """Make head-training data: self-distilled greedy trajectories and teacher-forced answers,
    stored as int32 token shards for `entmtp heads train --from-data` (another run, another
    machine; one data folder trains both head types).

    Example: entmtp heads data --task chat --task code --prompts 200 --out data/smollm2

    Example (held-out prompts, for `entmtp heads eval`): entmtp heads data --task chat --split
    heldout --prompts 32 --out data/heldout
    """
    device, dtype_name = check_device_and_dtype(device, dtype)
    if not task and not data:
        raise EntmtpError("give --task and/or --data: the prompts to make data from")
    if max_new_tokens < 1 or max_answer_tokens < 1:
        raise EntmtpError("--max-new-tokens and --max-answer-tokens must be at least 1")
    if shard_size < 1 or generation_batch < 1:
        raise EntmtpError("--shard-size and --generation-batch must be at least 1")
    check_output_folder(out, what="head-data folder")  # before the model loads
    from entmtp.calibrate import (
        DataItem,
        encode_item,
        load_prompts,
        read_jsonl_items,
        write_head_data,
    )

    rows = [row for path in data for row in read_jsonl_items(path)]
    task_prompts = [(name, prompt) for name in task for prompt in
                    load_prompts(name, split=split, num_prompts=prompts, seed=seed)]
    base = load_base(model, device=device, dtype=dtype)
    items = [encode_item(base, prompt, answer, source, max_answer_tokens=max_answer_tokens)
             for prompt, answer, source in rows]
    items += [DataItem(name, list(base.encode_task_prompt(prompt)))
              for name, prompt in task_prompts]
    console = Console()
    started = time.perf_counter()
    with StageProgress(console) as progress:
        index = write_head_data(
            base, out, items, max_new_tokens=max_new_tokens,
            generation_batch_size=generation_batch, shard_size=shard_size, progress=progress,
            extra={"model_source": base.source, "device": device, "dtype_name": dtype_name,
                   "tasks": list(task), "split": split, "data": [str(p) for p in data]},
        )
    positions: dict[str, int] = {}
    for shard in index["shards"]:
        for name, count in shard["positions_by_source"].items():
            positions[name] = positions.get(name, 0) + count
    table = Table(title=f"head data in {out} ({time.perf_counter() - started:.0f} s this run)",
                  title_justify="left")
    table.add_column("source")
    table.add_column("trained positions", justify="right")
    for name, count in positions.items():
        table.add_row(name, str(count))
    table.add_row("all", str(sum(positions.values())))
    console.print(table)



@heads_app.command("eval")
@user_errors
def eval_command(
    from_data: Path = typer.Option(..., "--from-data", help="A folder made by `entmtp heads "
                                   "data` (e.g. held-out prompts) for this model."),
    heads: list[str] = typer.Option(..., "--heads", help="entmtp heads folder; repeat to "
                                    "compare several on the same data."),
    trees: list[str] = typer.Option(["mc_sim_7b_63"], "--tree", metavar="<name>",
                                    help="Shipped reference tree (trees/NAME.json) whose "
                                    "accept length to replay; repeat for several."),
    model: str | None = MODEL_OPTION,
    forward_batch: int = typer.Option(16, "--forward-batch", help="Sequences per "
                                      "teacher-forced forward."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the accuracies here."),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    force: bool = FORCE_OPTION,
) -> None:
    """Top-1 / top-5 accuracy of each head per data source (full vocabulary; Hydra with the
    true prefix), and each --tree's mean accept length replayed on the same positions, for
    heads side by side on the same trajectories.

    Example: entmtp heads eval --from-data data/heldout --heads trees/heads/smollm2-135m-medusa
    --heads heads/m
    """
    device, _ = check_device_and_dtype(device, dtype)
    if forward_batch < 1:
        raise EntmtpError(f"--forward-batch must be at least 1, got {forward_batch}")
    from entmtp.calibrate import (
        HeadRanks,
        head_ranks,
        read_head_data,
        read_head_data_index,
        record_trajectories,
    )
    from entmtp.calibrate import accuracy_table as markdown_table
    from entmtp.core import atomic_write_json
    from entmtp.model import load_heads
    from entmtp.treesearch import reference_tree

    replayed = {name: reference_tree(name) for name in trees}
    read_head_data_index(from_data)
    check_outputs(json_out)
    base = load_base(model, device=device, dtype=dtype)
    loaded = [(path, load_heads(path, base.model)) for path in heads]
    data = read_head_data(from_data, base)
    console = Console()
    with StageProgress(console) as progress:
        trajectories = record_trajectories(base, data.records, batch_size=forward_batch,
                                           progress=progress)
    sources = sorted({t.source for t in trajectories})
    topk = max([5] + [tree.min_topk for tree in replayed.values()])
    accuracies: dict[str, Any] = {}
    accept: dict[str, dict[str, dict[str, float]]] = {}
    for path, draft in loaded:
        ranks = {source: head_ranks(draft, [t for t in trajectories if t.source == source],
                                    topk=topk)
                 for source in sources}
        ranks["all"] = HeadRanks.concat(list(ranks.values()))
        rows = {name: r.accuracy() for name, r in ranks.items()}
        accuracies[path] = {name: [_accuracy_record(a) for a in accs]
                            for name, accs in rows.items()}
        accept[path] = {tree_name: {name: r.accept_length(tree) for name, r in ranks.items()}
                        for tree_name, tree in replayed.items()}
        console.print(f"{path} ({draft.head_type}, sha256 {draft.sha256()[:12]})")
        typer.echo(markdown_table(rows))  # plain: a terminal-wide rich print would wrap it
    for tree_name in replayed:
        typer.echo(f"\n{tree_name}: mean accept length replayed (tokens per step)")
        typer.echo(accept_length_table({path: accept[path][tree_name] for path, _ in loaded}))
    if json_out is not None:
        atomic_write_json(json_out, {"data": str(from_data),
                                     "plan_sha256": data.index["plan_sha256"],
                                     "heads": accuracies, "accept_length": accept})


@heads_app.command("draft-vocab")
@user_errors
def draft_vocab_command(
    heads: Path = typer.Option(..., "--heads", help="Heads folder to draft with fewer tokens."),
    from_data: Path = typer.Option(..., "--from-data", help="A folder made by `entmtp heads "
                                   "data` for this model: its targets' frequencies choose the "
                                   "tokens."),
    size: int = typer.Option(..., "--size", help="Tokens in the draft vocabulary (the most "
                             "frequent ones)."),
    out: Path = typer.Option(..., "--out", help="New heads folder: the same weights, drafting "
                             "over --size tokens."),
    model: str | None = MODEL_OPTION,
    force: bool = FORCE_OPTION,
) -> None:
    """Heads that draft over the --size most frequent target tokens of --from-data: each draft
    step reads that many rows of the vocabulary projection instead of all of them (verification
    is unchanged, so decoding stays lossless). The new heads have a new sha256: profile and
    search again for them, and time them with `entmtp latency --draft-vocab-size`.

    Example: entmtp heads draft-vocab --heads trees/heads/smollm2-135m-hydra --from-data
    data/smollm2 --size 16384 --out heads-16k
    """
    import torch

    from entmtp.calibrate import read_head_data, read_head_data_index
    from entmtp.model import (
        check_draft_vocab_size,
        check_heads_target,
        draft_vocab_coverage,
        frequent_tokens,
        load_heads,
        read_heads_config,
        resolve_dtype,
        save_heads,
        target_token_counts,
    )

    read_head_data_index(from_data)
    check_heads_target(out)
    if out.exists() and heads.exists() and out.resolve() == heads.resolve():
        raise EntmtpError(f"--out {out} is the source heads (--heads): choose a new folder, so "
                          "that the bundles made for those heads still find them")
    base = load_base(model)
    draft = load_heads(heads, base.model)
    check_draft_vocab_size(size, draft.vocab_size, option="--size")
    data = read_head_data(from_data, base)
    counts = target_token_counts(((r.tokens, r.start) for r in data.records), draft.vocab_size)
    ids = frequent_tokens(counts, size)
    covered = draft_vocab_coverage(counts, ids)
    config = read_heads_config(heads)
    storage = config.get("storage_dtype", "float16")
    record = {**config.get("training", {}), "draft_vocab": {
        # no paths: the data and the source heads are named by their digests
        "size": size, "plan_sha256": data.index["plan_sha256"],
        "targets": int(counts.sum()), "coverage": covered,
        "heads_sha256": draft.sha256()}}
    draft.set_draft_vocab(torch.as_tensor(ids))
    path = save_heads(draft, out, dtype=resolve_dtype(storage),
                      topk_default=int(config.get("topk_default", 10)), extra=record)
    typer.echo(f"{path}: {draft.head_type} heads drafting over {size} of {draft.vocab_size} "
               f"tokens ({covered:.1%} of the {int(counts.sum())} targets in {from_data}); "
               f"sha256 {draft.sha256()[:12]}")


def accept_length_table(rows: dict[str, dict[str, float]]) -> str:
    """Markdown: one row per heads folder, one column per data source, each later row's ratio
    to the first row's in parentheses."""
    labels = list(rows)
    columns = list(rows[labels[0]])
    lines = ["| heads | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    first = rows[labels[0]]
    for label in labels:
        cells = []
        for column in columns:
            value = rows[label][column]
            ratio = f" ({value / first[column]:.3f}x)" if label != labels[0] else ""
            cells.append(f"{value:.3f}{ratio}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _accuracy_record(accuracy: Any) -> dict[str, Any]:
    """An accuracy as JSON: null top-1 / top-5 for a head with no position to score."""
    record = dict(vars(accuracy))
    if not accuracy.positions:
        record.update(top1=None, top5=None)
    return record
