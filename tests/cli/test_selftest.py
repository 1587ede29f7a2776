"""`entmtp selftest`: one line per check, the exit status counts failures, --json keeps the
records, and bad options are one-line errors."""

from __future__ import annotations

import json

import pytest
from one_line_errors import assert_user_error
from typer.testing import CliRunner

import entmtp.evaluation._selftest as selftest_module
from entmtp.cli.app import app
from entmtp.evaluation._selftest import SelftestCheck
from entmtp.evaluation._selftest import run_selftest as library_run_selftest
from entmtp.evaluation._selftest_checks import selftest_checks
from entmtp.evaluation._selftest_setup import Found

runner = CliRunner()


def test_selftest_on_the_cpu_passes_with_a_line_per_check(tmp_path):
    out = tmp_path / "selftest.json"
    result = runner.invoke(app, ["selftest", "--device", "cpu", "--json", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    names = [name for name, _ in selftest_checks()]
    assert len(lines) == len(names) + 2
    for line, name in zip(lines, names, strict=False):
        status = "SKIP" if name in ("attention graph", "event vs host time") else "PASS"
        assert line.startswith(f"{status} {name}"), line
    assert lines[-2].startswith("selftest on cpu (float32): 8 passed, 0 failed, 2 skipped in ")
    assert lines[-1] == f"wrote {out}"
    saved = json.loads(out.read_text())
    assert [c["name"] for c in saved["checks"]] == names and saved["failures"] == 0


def test_the_exit_status_is_the_number_of_failures(tmp_path, monkeypatch):
    def failing(index: int):
        def run(setup):
            raise RuntimeError(f"failure {index}\nnot shown")
        return SelftestCheck(f"check {index}", run)

    passing = SelftestCheck("fine", lambda setup: Found("all good"))

    def few_checks(device, dtype, *, on_record=None):
        return library_run_selftest(device, dtype, on_record=on_record,
                                    checks=[failing(1), passing, failing(2), failing(3)])

    monkeypatch.setattr(selftest_module, "run_selftest", few_checks)
    out = tmp_path / "selftest.json"
    result = runner.invoke(app, ["selftest", "--json", str(out)])
    assert result.exit_code == 3, result.output
    assert result.output.splitlines()[:4] == [
        "FAIL check 1: RuntimeError: failure 1", "PASS fine: all good",
        "FAIL check 2: RuntimeError: failure 2", "FAIL check 3: RuntimeError: failure 3"]
    assert "not shown" not in result.output and "Traceback" not in result.output
    assert "1 passed, 3 failed, 0 skipped" in result.output
    assert json.loads(out.read_text())["failures"] == 3  # written whatever the outcome


def test_the_help_says_what_the_exit_status_means():
    result = runner.invoke(app, ["selftest", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "number of failed checks" in text and "125" in text
    assert "--device" in text and "--dtype" in text and "--json" in text


@pytest.mark.parametrize(("args", "mentions"), [
    (["--device", "tpu"], ("--device", "cpu or cuda")),
    (["--dtype", "fp8"], ("--dtype", "bf16")),
])
def test_bad_options_are_one_line_errors(tmp_path, args, mentions):
    assert_user_error(["selftest", *args, "--json", str(tmp_path / "s.json")], tmp_path,
                      mentions=mentions)


def test_a_json_path_that_cannot_be_written_is_refused_before_the_checks(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the checks ran")

    monkeypatch.setattr(selftest_module, "run_selftest", never)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    assert_user_error(["selftest", "--json", str(folder)], tmp_path)
