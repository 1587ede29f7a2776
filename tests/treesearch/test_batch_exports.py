"""Batch-size schedules against each runtime's own rule, modelled from its source in
tests/export_runtimes.py: the ranges, the best chain per batch size against a brute force over
lengths, and the vLLM and TensorRT-LLM tables read back by their runtime's rule."""

from __future__ import annotations

import random

import numpy as np
import pytest
import yaml
from export_runtimes import (
    VLLM_0_24_0_FIXED_K_METHODS,
    RuntimeRefusal,
    trtllm_draft_len_reads,
    trtllm_stage1_draft_len_reads,
    vllm_batch_schedule_reads,
    vllm_config_file_args,
)

from entmtp.core import EntmtpError
from entmtp.treesearch import LatencyModel, synthetic_profile
from entmtp.treesearch._batch_exports import (
    SCHEDULE_CHECKED_AGAINST,
    BatchScheduleExport,
    batch_ranges,
    best_chain_by_batch,
    trtllm_draft_len_schedule,
    vllm_batch_schedule,
)
from entmtp.treesearch._chain import ChainChoice

HEADS = 4


def batch_latency(batch: int, slope: float = 0.4, depth_ms: float = 0.0) -> LatencyModel:
    """A step of ``batch`` sequences: a fixed cost plus every verified row, so drafting pays at
    small batches and not at large ones."""
    nodes = tuple(range(HEADS + 1))
    verify = tuple(10.0 + slope * batch * (n + 1) for n in nodes)
    return LatencyModel(nodes, verify, autoregressive_ms=10.0 + slope * batch,
                        depth_ms=depth_ms)


FAMILIES = {
    # 48: the chain beats drafting nothing by 0.05%; 52: drafting nothing wins by 1%
    "rows": {b: batch_latency(b) for b in (1, 2, 4, 8, 16, 32, 44, 48, 52, 64)},
    "steep": {b: batch_latency(b, slope=2.0, depth_ms=0.5) for b in (1, 3, 9, 27)},
    "cheap": {b: batch_latency(b, slope=0.01) for b in (1, 16, 256)},
    "mixed": {1: LatencyModel.gpu_like(), 4: LatencyModel.cpu_like(), 8: batch_latency(8),
              32: LatencyModel((0, 1, 4), (10.0, 25.0, 40.0), 10.0)},
}


def reference_time(profile, latency: LatencyModel, length: int) -> float:
    """Modelled ms of drafting the ``length`` chain at every step, step by step: a step at
    position i emits 1 + the run of leading rank-0 heads (at most ``length``), cut at the
    trajectory's end."""
    ms = 0.0
    step_ms = float(latency.step_ms(length, length))
    for trace in profile.traces:
        ranks = np.asarray(trace.ranks)
        last, i = len(ranks) - 1, 0
        while i < last:
            run = 0
            while run < length and ranks[i, run] == 0:
                run += 1
            i += min(1 + run, last - i)
            ms += step_ms
    return ms


def brute_force_length(profile, latency: LatencyModel) -> int:
    """0 when no chain replays strictly faster than drafting nothing, else the fastest chain
    (ties: the shorter)."""
    times = {n: reference_time(profile, latency, n) for n in range(HEADS + 1)}
    best = min(range(1, HEADS + 1), key=lambda n: (times[n], n))
    return 0 if times[0] < times[best] else best


def expected_length(lengths: dict[int, int], size: int) -> int:
    """The length of the next measured size up, as the latency side prices ``size``."""
    return lengths[min(b for b in lengths if b >= size)]


def choice(length: int) -> ChainChoice:
    return ChainChoice(length, 1.0 + 0.3 * length, 50.0, 1.2, 45.0)


@pytest.fixture(scope="module")
def profile():
    return synthetic_profile(num_traces=5, positions=200, num_heads=HEADS, seed=3)


# -- ranges -----------------------------------------------------------------------------------
def test_ranges_of_an_example():
    lengths = {1: 3, 2: 3, 4: 2, 8: 2, 16: 0}
    assert batch_ranges(lengths) == [(1, 2, 3), (3, 8, 2), (9, 16, 0)]
    assert batch_ranges({4: 3, 16: 1}) == [(1, 4, 3), (5, 16, 1)]
    assert batch_ranges({7: 0}) == [(1, 7, 0)]


@pytest.mark.parametrize("seed", range(20))
def test_ranges_cover_every_size_once_with_the_next_measured_length_and_merge_minimally(seed):
    rng = random.Random(seed)
    sizes = sorted(rng.sample(range(1, 200), rng.randint(1, 12)))
    lengths = {b: rng.choice([0, 1, 1, 2, 3]) for b in sizes}
    ranges = batch_ranges(lengths)
    covered = [b for first, last, _ in ranges for b in range(first, last + 1)]
    assert covered == list(range(1, max(sizes) + 1))  # every size once, in order
    for first, last, length in ranges:
        assert last in lengths  # a range ends at a measured size
        assert all(length == expected_length(lengths, b) for b in range(first, last + 1))
    assert all(a[2] != b[2] for a, b in zip(ranges, ranges[1:], strict=False))  # minimal
    changes = sum(1 for a, b in zip(sizes, sizes[1:], strict=False) if lengths[a] != lengths[b])
    assert len(ranges) == changes + 1


@pytest.mark.parametrize("lengths, phrase", [
    ({}, "at least one"),
    ({0: 1}, "not a batch size"),
    ({True: 1}, "not a batch size"),
    ({2.0: 1}, "not a batch size"),
    ({2: -1}, "integer >= 0"),
    ({2: 1.5}, "integer >= 0"),
])
def test_bad_lengths_are_refused_in_one_line(lengths, phrase):
    with pytest.raises(EntmtpError, match=phrase) as info:
        batch_ranges(lengths)
    assert "\n" not in str(info.value)


# -- the best chain per batch size ------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_best_chain_per_batch_is_the_brute_force_over_lengths(profile, family):
    latencies = FAMILIES[family]
    choices = best_chain_by_batch(profile, latencies)
    assert list(choices) == sorted(latencies)
    for size, latency in latencies.items():
        got = choices[size]
        assert got.length == brute_force_length(profile, latency), size
        if got.length == 0:
            assert got.tokens_per_second == got.plain_tokens_per_second
            assert got.mean_accept_length == 1.0
            tokens = sum(len(t.ranks) - 1 for t in profile.traces)
            plain_ms = reference_time(profile, latency, 0)
            assert got.tokens_per_second == pytest.approx(1000.0 * tokens / plain_ms)
            ar_ms = tokens * latency.autoregressive_ms
            assert got.speedup_vs_autoregressive == pytest.approx(ar_ms / plain_ms)


def test_zero_where_plain_decoding_wins_and_a_chain_where_it_pays(profile):
    choices = best_chain_by_batch(profile, FAMILIES["rows"])
    lengths = [choices[b].length for b in sorted(choices)]
    assert lengths[0] >= 1 and lengths[-1] == 0  # drafting pays alone, not at batch 64
    assert lengths == sorted(lengths, reverse=True)
    assert all(choices[b].plain_tokens_per_second >= choices[b].tokens_per_second
               for b in choices if choices[b].length == 0)


def test_max_length_caps_every_batch_size(profile):
    choices = best_chain_by_batch(profile, FAMILIES["cheap"], max_length=2)
    assert max(c.length for c in choices.values()) <= 2


@pytest.mark.parametrize("latencies, phrase", [
    ({}, "at least one"),
    ({0: LatencyModel.gpu_like()}, "not a batch size"),
    ({"8": LatencyModel.gpu_like()}, "not a batch size"),
    ({4: "fast"}, "not a LatencyModel"),
])
def test_bad_latency_mappings_are_refused(profile, latencies, phrase):
    with pytest.raises(EntmtpError, match=phrase):
        best_chain_by_batch(profile, latencies)


# -- vLLM ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_vllm_schedule_is_read_by_vllms_rule_as_the_chosen_lengths(profile, family):
    choices = best_chain_by_batch(profile, FAMILIES[family])
    lengths = {b: c.length for b, c in choices.items()}
    if set(lengths.values()) == {0}:
        pytest.skip("plain decoding wins everywhere: refused (tested below)")
    export = vllm_batch_schedule(choices, "hydra", source="run/ (profile.npz)")
    largest = max(lengths)
    max_num_seqs = 2 * largest
    config = export.config
    assert set(config) == {"num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
    assert config["num_speculative_tokens"] == max(lengths.values())
    dense = vllm_batch_schedule_reads(config, max_num_seqs)
    for size in range(1, largest + 1):
        assert dense[size] == expected_length(lengths, size), size
    assert dense[largest + 1:] == [lengths[largest]] * (max_num_seqs - largest)
    # The YAML a `vllm serve --config` file holds reads back as the same settings.
    args = vllm_config_file_args(yaml.safe_load(export.yaml_text()))
    assert args["speculative-config"] == config
    assert export.yaml_text().startswith("# entmtp batch schedule (vllm) of run/")


def test_vllm_rule_model_matches_the_documented_example():
    """docs/features/speculative_decoding/dynamic_speculative_decoding.md (vLLM main)."""
    config = {"method": "eagle", "model": "m", "num_speculative_tokens": 3,
              "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 128, 1],
                                                        [129, 512, 0]]}
    dense = vllm_batch_schedule_reads(config, 600)
    assert dense[1] == dense[64] == 3 and dense[65] == dense[128] == 1
    assert dense[129] == dense[512] == dense[600] == 0
    gap = dict(config, num_speculative_tokens_per_batch_size=[[1, 16, 3], [32, 128, 2]])
    assert vllm_batch_schedule_reads(gap, 40)[17:32] == [3] * 15  # a gap keeps the K before
    with pytest.raises(RuntimeRefusal, match="start at 1"):
        vllm_batch_schedule_reads(dict(config, num_speculative_tokens_per_batch_size=[[2, 4, 1]]),
                                  8)
    with pytest.raises(RuntimeRefusal, match="Unexpected"):  # the dict form of early drafts
        vllm_batch_schedule_reads(dict(config, extra={"1-16": 3}), 8)


def test_vllm_caps_at_the_largest_k_wherever_it_is():
    export = vllm_batch_schedule({1: choice(2), 8: choice(3), 16: choice(1)}, "hydra")
    assert export.config["num_speculative_tokens"] == 3
    dense = vllm_batch_schedule_reads(export.config, 20)
    assert dense[1:17] == [2] + [3] * 7 + [1] * 8
    assert "batch 16: 1 draft token, " in export.comment()


def test_vllm_refuses_medusa_heads_whose_proposer_asserts_a_fixed_k():
    assert "medusa" in VLLM_0_24_0_FIXED_K_METHODS
    with pytest.raises(EntmtpError, match="medusa proposer asserts") as info:
        vllm_batch_schedule({1: choice(3), 8: choice(1)}, "medusa")
    assert "\n" not in str(info.value) and "--format vllm-chain" in str(info.value)


def test_hydra_schedule_says_it_is_for_the_chain_drafter_serving_the_heads():
    export = vllm_batch_schedule({1: choice(3), 8: choice(1), 32: choice(0)}, "hydra")
    text = export.comment()
    assert "vLLM has no hydra drafter" in text and "method and model" in text
    assert export.config["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 8, 1],
                                                                      [9, 32, 0]]
    assert "above 32 were not measured: vLLM keeps K = 0" in text


# -- TensorRT-LLM -------------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_trtllm_schedule_is_read_by_trtllms_rule_as_the_chosen_lengths(profile, family):
    choices = best_chain_by_batch(profile, FAMILIES[family])
    lengths = {b: c.length for b, c in choices.items()}
    ranges = batch_ranges(lengths)
    if ranges[0][2] == 0 or any(n > ranges[0][2] for _, _, n in ranges):
        pytest.skip("not expressible in TensorRT-LLM: refused (tested below)")
    export = trtllm_draft_len_schedule(choices, "hydra")
    spec = yaml.safe_load(export.yaml_text())["speculative_config"]  # trtllm-serve's reader
    assert spec == export.config
    assert all(isinstance(key, int) for key in spec["draft_len_schedule"])
    largest = max(lengths)
    for size in range(1, largest + 1):
        assert trtllm_draft_len_reads(spec, size) == expected_length(lengths, size), size
    assert trtllm_draft_len_reads(spec, largest + 1) == 0  # past the last key: no drafting


def test_trtllm_rule_model_matches_the_pr_example():
    """PR #10860: {4: 4, 8: 2, 32: 1} drafts 4 up to 4, 2 up to 8, 1 up to 32, 0 above."""
    spec = {"max_draft_len": 4, "draft_len_schedule": {4: 4, 8: 2, 32: 1}}
    reads = [trtllm_draft_len_reads(spec, b) for b in (1, 4, 5, 8, 9, 32, 33)]
    assert reads == [4, 4, 2, 2, 1, 1, 0]
    with pytest.raises(RuntimeRefusal, match="max_draft_len"):
        trtllm_draft_len_reads({"max_draft_len": 3, "draft_len_schedule": {4: 4}}, 1)
    with pytest.raises(RuntimeRefusal, match="mutually exclusive"):
        trtllm_draft_len_reads(dict(spec, max_concurrency=8), 1)


def test_the_stage1_reading_would_misread_the_export_and_the_header_says_so():
    export = trtllm_draft_len_schedule({1: choice(3), 8: choice(1), 32: choice(0)}, "hydra")
    schedule = export.config["draft_len_schedule"]
    assert schedule == {1: 3, 8: 1, 32: 0}
    assert export.config["max_draft_len"] == 3
    assert trtllm_stage1_draft_len_reads(schedule, 2) == 3  # the current rule reads 1
    assert trtllm_draft_len_reads(export.config, 2) == 1
    assert "stage-1 code of PR #8194" in export.comment()


def test_trtllm_refuses_medusa_heads_run_on_the_tensorrt_backend():
    with pytest.raises(EntmtpError, match="supports_backend excludes pytorch") as info:
        trtllm_draft_len_schedule({1: choice(3)}, "medusa")
    assert "\n" not in str(info.value)


def test_trtllm_refuses_what_its_validator_cannot_hold_and_names_the_fix(profile):
    with pytest.raises(EntmtpError, match="max_draft_len > 0"):
        trtllm_draft_len_schedule({1: choice(0), 8: choice(2)}, "hydra")
    with pytest.raises(EntmtpError, match=r"max_length=2") as info:
        trtllm_draft_len_schedule({1: choice(2), 8: choice(3)}, "hydra")
    assert "\n" not in str(info.value)
    # The named fix gives a table the rule accepts.
    latencies = {1: batch_latency(1, slope=0.01), 8: batch_latency(8, slope=0.01)}
    free = best_chain_by_batch(profile, latencies)
    cap = free[1].length
    export = trtllm_draft_len_schedule(best_chain_by_batch(profile, latencies, max_length=cap),
                                       "hydra")
    assert all(trtllm_draft_len_reads(export.config, b) <= cap for b in range(1, 9))


# -- both -------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, runtime", [(vllm_batch_schedule, "vllm"),
                                           (trtllm_draft_len_schedule, "trtllm")])
def test_plain_decoding_everywhere_is_refused(make, runtime):
    with pytest.raises(EntmtpError, match="plain decoding is fastest at every"):
        make({1: choice(0), 16: choice(0)}, "hydra")


@pytest.mark.parametrize("make, runtime", [(vllm_batch_schedule, "vllm"),
                                           (trtllm_draft_len_schedule, "trtllm")])
def test_headers_name_the_source_the_rule_and_each_measured_size(make, runtime):
    choices = {1: ChainChoice(3, 2.5, 40.0, 1.9, 21.0), 4: ChainChoice(2, 2.0, 30.0, 1.4, 21.5)}
    export = make(choices, "hydra", source="my-run")
    assert isinstance(export, BatchScheduleExport) and export.runtime == runtime
    text = export.comment()
    assert f"entmtp batch schedule ({runtime}) of my-run" in text
    assert SCHEDULE_CHECKED_AGAINST[runtime] in text
    assert "next measured size" in text
    assert "batch 4: 2 draft tokens, predicted accept length 2.000, 30.00 tokens/s per " \
           "sequence (120.00 for the batch), 1.400x plain decoding" in text
    assert all(line.startswith("# ") for line in text.splitlines())
