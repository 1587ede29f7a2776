"""The latency profiler fits the host-clock time of each step (what decoding pays) and, on CUDA,
keeps the same runs' CUDA-event times beside it (emulated here)."""

from __future__ import annotations

import torch

from entmtp.evaluation import _latency_profile
from entmtp.evaluation._latency_profile import profile_latency
from entmtp.model._heads import new_heads
from entmtp.runtime._static_step import StaticEngine

EVENT_MS = 0.25  # every emulated event pair reads this: never a host-clock figure


class _Event:
    """torch.cuda.Event on the CPU: each pair reads EVENT_MS; counts its records."""

    records = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing

    def record(self, stream=None) -> None:
        _Event.records += 1

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        return EVENT_MS


def _profile(rt, monkeypatch, *, events: bool, engine: str = "auto", remeasure: int = 0):
    # a fixed (empty) padding table: real timings on a shared machine may show any dip
    monkeypatch.setattr(_latency_profile, "with_padding", lambda model: model)
    if events:
        original_init = StaticEngine.__init__

        def evented(engine, *args, **kwargs):
            original_init(engine, *args, **kwargs)
            engine.timing_events = True  # as on CUDA

        monkeypatch.setattr(StaticEngine, "__init__", evented)
        monkeypatch.setattr(torch.cuda, "Event", _Event)
        monkeypatch.setattr(_Event, "records", 0)
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    return profile_latency(model, heads, node_counts=(0, 2), depths=(1, 2),
                           context_lengths=(8, 16), repeats=3, warmup=1, topk=3,
                           remeasure=remeasure, engine=engine)


def test_on_cuda_the_event_times_are_kept_beside_the_fitted_host_times(rt, monkeypatch):
    latency = _profile(rt, monkeypatch, events=True)
    hardware = latency.hardware
    assert hardware["clock"] == _latency_profile.CLOCK and "host clock" in hardware["clock"]
    events = hardware["cuda_event_points"]
    points = [p.to_json() for p in latency.points]
    # one event point per timed point, the warm-up round left out as for the host times
    identity = ("step", "context", "nodes", "depth", "rounds")
    assert [{k: e[k] for k in identity} for e in events] == \
        [{k: p[k] for k in identity} for p in points]
    assert all(e["ms"] == e["median_ms"] == EVENT_MS and e["iqr_ms"] == 0 for e in events)
    # the fit reads the host clock: no point and no fitted figure is an event time
    assert all(p.ms != EVENT_MS for p in latency.points)
    assert latency.autoregressive_ms != EVENT_MS
    assert _Event.records == 2 * sum(p.rounds for p in latency.points) + 2 * len(points)


def test_off_cuda_only_the_host_clock_is_kept(rt, monkeypatch):
    for engine, clock in (("auto", _latency_profile.CLOCK),
                          ("eager", _latency_profile.EAGER_CLOCK)):
        latency = _profile(rt, monkeypatch, events=False, engine=engine)
        assert latency.hardware["clock"] == clock
        assert "cuda_event_points" not in latency.hardware


def test_remeasured_points_keep_the_event_times_of_their_last_rounds(rt, monkeypatch):
    """A re-measured point's host rounds replace the earlier ones; so do its event rounds."""
    monkeypatch.setattr(_latency_profile._StepTimer, "time", _always_failing_time())
    latency = _profile(rt, monkeypatch, events=True, remeasure=2)
    events = {(e["step"], e["context"], e["nodes"], e["depth"]): e["rounds"]
              for e in latency.hardware["cuda_event_points"]}
    assert events == {(p.step, p.context, p.nodes, p.depth): p.rounds for p in latency.points}
    assert latency.hardware["remeasure_passes"] >= 1


def _always_failing_time():
    """``_StepTimer.time`` with the real runs (host and event times recorded) but a host time
    that makes the 2-node step cheaper than the empty one, a check that fails every pass."""
    real = _latency_profile._StepTimer.time

    def time(timer, key):
        real(timer, key)
        tree = timer.trees[key[1]] if key[0] == "tree" else None
        return 1.0 if tree is not None and tree.num_nodes == 2 else 10.0

    return time
