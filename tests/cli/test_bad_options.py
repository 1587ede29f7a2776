"""Options that cannot be right are refused before any data or model is loaded: exit 2, one
line naming the option, nothing written."""

from __future__ import annotations

import pytest
from one_line_errors import assert_user_error


@pytest.mark.parametrize("extra, option", [
    (["--lr", "nan"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--lr", "-1e-3"], "--lr"),
    (["--heldout-fraction", "1.5"], "--heldout-fraction"),
    (["--heldout-fraction", "nan"], "--heldout-fraction"),
    (["--epochs", "0"], "--epochs"),
    (["--batch-size", "0"], "--batch-size"),
    (["--max-seconds", "0"], "--max-seconds"),
    (["--max-seconds", "nan"], "--max-seconds"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_heads_train_bad_numbers_are_refused_before_loading(tmp_path, extra, option):
    # --model names nothing: had the model been loaded first, the error would be about it.
    assert_user_error(["heads", "train", "--type", "medusa", "--out", str(tmp_path / "heads"),
                       "--model", str(tmp_path / "no-such-model"), *extra], tmp_path,
                      mentions=(option,))


@pytest.mark.parametrize("extra, option", [
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--topk", "0"], "--topk"),
    (["--batch-size", "0"], "--batch-size"),
    (["--max-nodes", "0"], "--max-nodes"),
    (["--shape-trials", "-1"], "--shape-trials"),
    (["--seed", "-1"], "--seed"),
    (["--seed", "4294967296"], "--seed"),
    (["--validation-folds", "1"], "validation_folds"),
    (["--validation-folds", "-1"], "validation_folds"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_calibrate_bad_numbers_are_refused_before_loading(tmp_path, extra, option):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "def add(a, b):"}\n')
    assert_user_error(["calibrate", "--out", str(tmp_path / "run"), "--data", str(data),
                       "--split", "all", "--model", str(tmp_path / "no-such-model"),
                       "--heads", str(tmp_path), *extra], tmp_path, mentions=(option,))


@pytest.mark.parametrize("extra, option", [
    (["--shard-size", "0"], "--shard-size"),
    (["--generation-batch", "0"], "--generation-batch"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_heads_data_bad_numbers_are_refused_before_loading(tmp_path, extra, option):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "def add(a, b):"}\n')
    assert_user_error(["heads", "data", "--out", str(tmp_path / "hd"), "--data", str(data),
                       "--model", str(tmp_path / "no-such-model"), *extra], tmp_path,
                      mentions=(option,))


def test_latency_tree_larger_than_any_draft_tree_is_refused_before_loading(tmp_path):
    assert_user_error(["latency", "--model", str(tmp_path / "no-such-model"), "--node-counts",
                       "0,99999999", "--out", str(tmp_path / "l.json")], tmp_path,
                      mentions=("--node-counts",))
