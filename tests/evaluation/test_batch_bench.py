"""The live batch sweep: lossless at every size, the same batches as the batched replay, and
live accept lengths equal to it."""

from __future__ import annotations

import pytest
import torch

from entmtp.calibrate._profiler import profile_prompts
from entmtp.calibrate._tasks import TaskPrompt
from entmtp.evaluation._batch_bench import (
    AUTOREGRESSIVE,
    BATCH_ONE,
    ENTMTP,
    run_batch_sweep,
    sweep_measured_runs,
)
from entmtp.evaluation._validation import EncodedPrompt
from entmtp.model._base_model import BaseModel
from entmtp.model._heads import new_heads
from entmtp.treesearch._batch_latency import BatchLatency
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._run import SearchSettings, make_bundle, search, search_by_batch_size

TEXTS = ["a cat", "the quick brown fox", "x", "numbers 1 2 3 4 5 6", "zz top", "hello"]
NEW_TOKENS = 20


class _CharTokenizer:
    pad_token_id = 0
    eos_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [3 + (ord(c) % 120) for c in text]}


def _per_node(ms: float) -> LatencyModel:
    nodes = (0, 3, 7, 15, 31)
    return LatencyModel(nodes, tuple(20.0 + ms * n for n in nodes), autoregressive_ms=20.0,
                        hardware={"kind": "synthetic-cpu", "device_name": "test"})


@pytest.fixture(scope="module")
def sweep_setup(rt):
    base = BaseModel(rt.sharp_llama(5), _CharTokenizer(), name="tiny", source="test",
                     is_instruct=False)
    heads = new_heads(base.model, head_type="medusa", num_heads=3, seed=1)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    prompts = [TaskPrompt(i, f"p{i}", text) for i, text in enumerate(TEXTS)]
    profile = profile_prompts(base, heads, prompts, max_new_tokens=NEW_TOKENS, topk=4)
    latencies = BatchLatency({1: _per_node(0.1), 2: _per_node(0.5), 4: _per_node(20.0)})
    settings = SearchSettings(schedule_trials=4, max_nodes=8, validation_folds=0)
    outcome = search(profile, latencies[1], settings)
    choices = search_by_batch_size(profile, latencies.by_batch, settings, outcome=outcome,
                                   latency=latencies[1])
    bundle = make_bundle(outcome, profile, latencies[1], command="test", version="0",
                         batch_choices=choices, batch_latency=latencies)
    encoded = [EncodedPrompt(p.index, p.prompt_id, base.tokenizer(p.text)["input_ids"])
               for p in prompts]
    return base, heads, bundle, encoded


def test_the_sweep_is_lossless_and_live_accept_lengths_are_the_replays(sweep_setup):
    base, heads, bundle, encoded = sweep_setup
    calls = []
    sizes = run_batch_sweep(base, heads, bundle, encoded, [4, 1, 2], max_new_tokens=NEW_TOKENS,
                            progress=lambda: calls.append(1))
    assert [s.batch_size for s in sizes] == [1, 2, 4]
    assert [s.batches for s in sizes] == [6, 3, 2]  # 6 prompts; 4 wraps around to fill
    assert len(calls) == sweep_measured_runs(len(encoded), [1, 2, 4], bundle)
    for at in sizes:
        names = [row["name"] for row in at.rows]
        assert names == [AUTOREGRESSIVE, BATCH_ONE, ENTMTP]
        entmtp = at.row(ENTMTP)
        shares = bundle.schedule(at.batch_size) == bundle.schedule()
        assert (entmtp["same_runs_as"] == BATCH_ONE) == shares
        for row in at.rows:
            assert row["lossless"], (at.batch_size, row["name"])
            assert row["accept_over_predicted"] == pytest.approx(1.0, abs=0.01), \
                (at.batch_size, row["name"])
            assert row["predicted_tokens_per_second"] is not None
        assert at.row(AUTOREGRESSIVE)["mean_accept_length"] == 1.0
    # at 4, 20 ms a node: the bundle's range there does not draft
    assert sizes[-1].row(ENTMTP)["schedule_trees"] == [0]


def test_past_the_bundles_batch_sizes_only_accept_lengths_are_predicted(sweep_setup):
    base, heads, bundle, encoded = sweep_setup
    (at,) = run_batch_sweep(base, heads, bundle, encoded[:3], [5], max_new_tokens=8)
    assert at.row(ENTMTP)["predicted_tokens_per_second"] is None
    assert at.row(ENTMTP)["tokens_per_second_over_predicted"] is None
    assert at.row(ENTMTP)["predicted_mean_accept_length"] >= 1.0
