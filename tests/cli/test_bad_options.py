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
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_heads_train_bad_numbers_are_refused_before_loading(tmp_path, extra, option):
    # --model names nothing: had the model been loaded first, the error would be about it.
    assert_user_error(["heads", "train", "--type", "medusa", "--out", str(tmp_path / "heads"),
                       "--model", str(tmp_path / "no-such-model"), *extra], tmp_path,
                      mentions=(option,))
