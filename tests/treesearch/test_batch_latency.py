"""BatchLatency: the batch axis of a latency file, its for_batch rule, its refusals, and the
fit of imported step times."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._batch_latency import (
    BatchLatency,
    StepTime,
    import_step_times,
    read_step_times,
)
from entmtp.treesearch._latency import LATENCY_FIX, LatencyModel, LatencyPoint, with_padding


def _scaled(model: LatencyModel, factor: float) -> LatencyModel:
    return replace(model, verify_ms=tuple(v * factor for v in model.verify_ms),
                   autoregressive_ms=model.autoregressive_ms * factor)


def _measured() -> LatencyModel:
    """A model with every optional field a measured file holds: points, padding, by-depth."""
    cpu = LatencyModel.cpu_like()
    points = tuple(LatencyPoint(step="tree", context=64, ms=v, median_ms=v, iqr_ms=0.01 * v,
                                rounds=8, nodes=n, depth=1)
                   for n, v in zip(cpu.nodes, cpu.verify_ms, strict=True))
    model = replace(cpu, hardware={"kind": "measured", "device_name": "CPU X"}, points=points,
                    prepare_ms_by_depth=(1.0, 2.0), fused_empty_ms_by_depth=(86.0, 87.0),
                    verify_ms=(85.0, 114.0, 149.0, 140.0, 195.0, 311.0, 504.0))
    return with_padding(model)


@pytest.fixture
def batched() -> BatchLatency:
    cpu = LatencyModel.cpu_like()
    return BatchLatency({32: _scaled(cpu, 6.0), 1: cpu, 8: _scaled(cpu, 2.0)})


# -- the mapping and the for_batch rule --------------------------------------------------------
def test_batch_sizes_ascend_and_it_is_a_mapping_of_models(batched):
    assert batched.batch_sizes == (1, 8, 32)
    assert list(batched) == [1, 8, 32]
    assert batched[8].autoregressive_ms == pytest.approx(166.0)
    by_batch = batched.by_batch
    assert by_batch == dict(batched) and isinstance(by_batch, dict)
    by_batch.clear()  # a copy
    assert len(batched) == 3
    assert batched.batched and not BatchLatency({1: LatencyModel.cpu_like()}).batched


def test_for_batch_is_exact_when_measured_and_the_next_size_up_between(batched):
    assert batched.for_batch(1) is batched[1]
    assert batched.for_batch(8) is batched[8]
    for size in (2, 5, 7):
        assert batched.for_batch(size) is batched[8]
    for size in range(9, 33):
        assert batched.for_batch(size) is batched[32]
    above_one = BatchLatency({4: batched[8], 16: batched[32]})
    assert above_one.for_batch(1) is batched[8]  # below the smallest: the smallest


def test_for_batch_never_under_prices_a_step_between_measured_sizes(batched):
    for size in range(1, 33):
        below = max(b for b in batched.batch_sizes if b <= size)
        assert batched.for_batch(size).step_ms(7, 2) >= batched[below].step_ms(7, 2)


@pytest.mark.parametrize("size", [33, 1000, 0, -1, True, 2.0])
def test_for_batch_refuses_a_size_beyond_the_measured_ones_or_not_a_size(batched, size):
    with pytest.raises(EntmtpError) as err:
        batched.for_batch(size)
    assert "\n" not in str(err.value)
    if size == 33:
        assert "beyond the largest measured one (32)" in str(err.value)


def test_tokens_per_second_is_the_batch_times_the_per_sequence_rate(batched):
    per_sequence = 2.5 * 1000.0 / float(batched[8].step_ms(7, 2))
    assert batched.tokens_per_second(8, 2.5, 7, 2) == pytest.approx(8 * per_sequence)
    assert batched.tokens_per_second(5, 2.5, 7, 2) == pytest.approx(5 * per_sequence)


@pytest.mark.parametrize("models", [{}, {0: LatencyModel.cpu_like()}, {1: "fast"},
                                    {70_000: LatencyModel.cpu_like()},
                                    {1: LatencyModel.cpu_like(), "8": LatencyModel.cpu_like()}])
def test_a_batch_latency_refuses_no_model_a_bad_size_or_a_non_model(models):
    with pytest.raises(EntmtpError):
        BatchLatency(models)


# -- the file --------------------------------------------------------------------------------
def test_round_trip_keeps_every_batch_size(batched, tmp_path):
    path = batched.save(tmp_path / "latency.json")
    again = BatchLatency.load(path)
    assert again == batched and again.batch_sizes == (1, 8, 32)
    obj = json.loads(path.read_text())
    assert "batch_size" not in obj  # the top level is batch size 1
    assert sorted(obj["by_batch_size"]) == ["32", "8"]
    assert "format" not in obj["by_batch_size"]["8"]


def test_a_file_without_batch_size_1_names_its_smallest(batched, tmp_path):
    larger = BatchLatency({8: batched[8], 32: batched[32]})
    path = larger.save(tmp_path / "latency.json")
    assert json.loads(path.read_text())["batch_size"] == 8
    assert BatchLatency.load(path) == larger
    # a one-model reader takes the top level: the smallest batch size's model
    assert LatencyModel.load(path) == batched[8]


@pytest.mark.parametrize("model", [LatencyModel.cpu_like(), LatencyModel.gpu_like(), _measured()],
                         ids=["cpu-like", "gpu-like", "measured"])
def test_a_file_of_todays_format_reads_as_batch_1_and_writes_byte_identically(model, tmp_path):
    old = model.save(tmp_path / "old.json")
    read = BatchLatency.load(old)
    assert read.batch_sizes == (1,)
    assert read[1] == LatencyModel.load(old)
    assert read.for_batch(1).step_ms(9, 2) == LatencyModel.load(old).step_ms(9, 2)
    again = read.save(tmp_path / "again.json")
    assert again.read_bytes() == old.read_bytes()
    assert BatchLatency({1: model}).to_json() == model.to_json()


def test_a_one_model_reader_of_a_batched_file_reads_its_batch_1_model(batched, tmp_path):
    path = batched.save(tmp_path / "latency.json")
    assert LatencyModel.load(path) == batched[1]


def _bad_file(tmp_path, obj) -> str:
    path = tmp_path / "latency.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(EntmtpError) as err:
        BatchLatency.load(path)
    message = str(err.value)
    assert "\n" not in message and f"latency file {path}" in message
    return message


def _nested(**changes) -> dict:
    return {**_scaled(LatencyModel.cpu_like(), 2.0).to_json(), **changes}


BAD_BATCH_FILES = {
    "by-batch-size-a-list": ({"by_batch_size": [1, 2]}, "by_batch_size"),
    "key-not-a-number": ({"by_batch_size": {"eight": _nested()}}, "by_batch_size.eight"),
    "key-leading-zero": ({"by_batch_size": {"08": _nested()}}, "by_batch_size.08"),
    "key-zero": ({"by_batch_size": {"0": _nested()}}, "by_batch_size.0"),
    "key-repeats-the-top": ({"by_batch_size": {"1": _nested()}}, "larger than the top-level"),
    "key-below-the-top": ({"batch_size": 8, "by_batch_size": {"4": _nested()}},
                          "larger than the top-level"),
    "key-too-large": ({"by_batch_size": {"100000": _nested()}}, "outside 1..65536"),
    "batch-size-string": ({"batch_size": "8"}, "batch_size"),
    "batch-size-bool": ({"batch_size": True}, "batch_size"),
    "batch-size-zero": ({"batch_size": 0}, "batch_size"),
    "nested-not-an-object": ({"by_batch_size": {"8": [1, 2]}}, "by_batch_size.8"),
    "nested-missing-field": ({"by_batch_size": {"8": {"nodes": [0, 3], "verify_ms": [1, 2]}}},
                             "by_batch_size.8: autoregressive_ms is missing"),
    "nested-negative": ({"by_batch_size": {"8": _nested(verify_ms=[1, -2, 3, 4, 5, 6, 7])}},
                        "by_batch_size.8"),
    "nested-zero-steps": ({"by_batch_size": {"8": _nested(verify_ms=[0.0] * 7)}},
                          "by_batch_size.8"),
    "nested-nan": ({"by_batch_size": {"8": _nested(autoregressive_ms=float("nan"))}}, "NaN"),
    "nested-other-format": ({"by_batch_size": {"8": _nested(format="entmtp-bundle")}},
                            "by_batch_size.8"),
    "nested-batches-of-its-own": ({"by_batch_size": {"8": _nested(by_batch_size={})}},
                                  "holds no batch sizes"),
}


@pytest.mark.parametrize("case", list(BAD_BATCH_FILES))
def test_a_bad_batch_axis_is_a_one_line_refusal_naming_the_field(case, tmp_path):
    changes, mention = BAD_BATCH_FILES[case]
    obj = {**LatencyModel.cpu_like().to_json(), **changes}
    message = _bad_file(tmp_path, obj)
    assert mention in message and LATENCY_FIX in message


# -- imported step times ---------------------------------------------------------------------
def _rows(text: str) -> list[StepTime]:
    return [StepTime(*(int(v) for v in line.split(",")[:3]), float(line.split(",")[3]), i)
            for i, line in enumerate(text.split(), start=2)]


def test_from_step_times_fits_the_means_of_each_measurement():
    rows = _rows("1,0,128,10 1,0,128,12 1,0,512,14 1,3,128,13 1,3,512,15 1,3,512,17 "
                 "1,3,512,19.5 8,0,128,20 8,0,512,22 8,5,128,40 8,5,512,44")
    latency = BatchLatency.from_step_times(rows, hardware={"kind": "imported"})
    assert latency.batch_sizes == (1, 8)
    one = latency[1]
    # per context the mean of the repeats, then the mean over the contexts
    assert one.autoregressive_ms == pytest.approx(statistics.fmean([11.0, 14.0]))
    assert one.step_ms(0, 0) == pytest.approx(12.5)
    assert one.step_ms(3, 1) == pytest.approx(statistics.fmean([13.0, 51.5 / 3]))
    assert one.depth_ms == 0.0 and one.nodes == (0, 3)
    assert latency[8].step_ms(5, 3) == pytest.approx(42.0)
    assert latency[8].hardware == {"kind": "imported", "context_lengths": [128, 512]}
    spread = {(p.step, p.nodes, p.context): p for p in one.points}
    assert spread["tree", 3, 512].rounds == 3 and spread["tree", 3, 512].median_ms == 17.0
    assert spread["tree", 3, 512].iqr_ms == pytest.approx(2.25)  # (18.25 - 16) of 15, 17, 19.5
    assert spread["autoregressive", 0, 128].ms == 11.0
    assert not [w for w in one.warnings if "cheaper" in w]  # one figure for the plain step


@pytest.mark.parametrize(("text", "mention"), [
    ("", "no measured steps"),
    ("8,3,128,10 8,3,512,11", "batch size 8 has no plain step"),
    ("8,0,128,10 8,0,512,11", "batch size 8 has only the plain step"),
    ("8,0,128,10 8,0,512,11 8,3,128,12", "batch size 8, nodes 3: timed at contexts 128 but"),
])
def test_from_step_times_refuses_a_batch_it_cannot_fit(text, mention):
    with pytest.raises(EntmtpError) as err:
        BatchLatency.from_step_times(_rows(text), hardware={})
    assert mention in str(err.value) and "\n" not in str(err.value)


def test_read_step_times_takes_synonyms_comments_and_extra_columns(tmp_path):
    path = tmp_path / "trtllm.csv"
    path.write_text("# TensorRT-LLM, H100\nRuntime, Batch, Draft-Len, Context Length, Step_ms\n"
                    "trt,4,0,256,9.5\n\ntrt,4,2,256,10.25\n")
    rows, node_column = read_step_times(path)
    assert node_column == "draft_len"
    assert rows == [StepTime(4, 0, 256, 9.5, 3), StepTime(4, 2, 256, 10.25, 5)]
    latency = import_step_times(path, device_name="H100, TensorRT-LLM")
    assert latency.batch_sizes == (4,)
    hw = latency[4].hardware
    assert hw["kind"] == "imported" and hw["source"] == str(path)
    assert hw["device_name"] == "H100, TensorRT-LLM" and hw["node_column"] == "draft_len"


BAD_CSV = {
    "no-ms-column": ("batch_size,nodes,context\n1,0,8\n", "line 1 (the header): no ms column"),
    "two-node-columns": ("batch_size,nodes,draft_len,context,ms\n1,0,0,8,1\n",
                         "2 nodes columns (nodes, draft_len)"),
    "header-only": ("batch_size,nodes,context,ms\n", "a header and no measured step"),
    "comments-only": ("# nothing\n\n", "no lines"),
    "short-row": ("batch_size,nodes,context,ms\n1,0,8\n", "line 2: 3 values"),
    "ms-not-a-number": ("batch_size,nodes,context,ms\n1,0,8,fast\n",
                        "line 2: ms 'fast' is not a number"),
    "ms-negative": ("batch_size,nodes,context,ms\n1,0,8,-3\n", "line 2: ms -3 is negative"),
    "ms-zero": ("batch_size,nodes,context,ms\n1,0,8,0\n", "line 2: ms 0 is not a decoding step"),
    "ms-nan": ("batch_size,nodes,context,ms\n1,0,8,nan\n", "line 2: ms nan is not a finite"),
    "ms-hours": ("batch_size,nodes,context,ms\n1,0,8,1e9\n", "not a decoding step time"),
    "nodes-fraction": ("batch_size,nodes,context,ms\n1,0,8,1\n1,2.5,8,1\n",
                       "line 3: nodes '2.5' is not a whole number"),
    "batch-zero": ("batch_size,nodes,context,ms\n0,0,8,1\n", "line 2: batch_size 0 is outside"),
    "context-negative": ("batch_size,nodes,context,ms\n1,0,-8,1\n", "line 2: context -8"),
    "nodes-negative": ("batch_size,draft_len,context,ms\n1,-1,8,1\n", "line 2: draft_len -1"),
    "binary": ("\x00\x01\x02", "not UTF-8 text"),
}


@pytest.mark.parametrize("case", list(BAD_CSV))
def test_read_step_times_refuses_a_bad_line_naming_it(case, tmp_path):
    text, mention = BAD_CSV[case]
    path = tmp_path / "steps.csv"
    path.write_text(text)
    with pytest.raises(EntmtpError) as err:
        read_step_times(path)
    message = str(err.value)
    assert mention in message, message
    assert "\n" not in message and f"step-time file {path}" in message


def test_the_plain_step_is_one_figure_in_both_fields():
    # these figures' least-squares knot rounds below their mean (20.999...): were the plain
    # step's two fields set apart, the zero-noise check would call the empty tree cheaper
    latency = BatchLatency.from_step_times(_rows("8,0,128,20 8,0,512,22 8,3,128,30 8,3,512,32"),
                                           hardware={})
    model = latency[8]
    assert model.autoregressive_ms == model.verify_ms[0] == pytest.approx(21.0)
    assert not [w for w in model.warnings if "cheaper" in w]
