"""The static-shape runtime decodes exactly what the eager runtime and ``model.generate`` do."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from entmtp.core import EntmtpError
from entmtp.evaluation._validation import capture_line, runtime_report
from entmtp.model._heads import new_heads
from entmtp.runtime._decode import SpeculativeDecoder, autoregressive_generate
from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler
from entmtp.runtime._static_step import StepOptions
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._run import reference_tree
from entmtp.treesearch._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule
from entmtp.treesearch._tree import Tree

NUM_HEADS = 4
TOPK = 10
PROMPTS = [[1, 17, 42, 99, 5], [1, 3], [1, 60, 61, 62, 63, 64, 65, 66, 120]]
TREES = {
    "empty": Tree.from_paths([]),
    "chain": Tree.from_paths([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]),
    "wide": Tree.from_paths([[r] for r in range(10)]),
    "deep": Tree.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1],
                             [0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0], [0, 1, 0, 0]]),
    "mc_sim_7b_63": reference_tree("mc_sim_7b_63"),
}


@pytest.fixture(scope="module")
def setup(rt):
    model = rt.sharp_llama(3)
    references = {tuple(p): rt.greedy_reference(model, torch.tensor(p), 40) for p in PROMPTS}
    return model, references


def _noisy_heads(model, head_type: str, *, seed: int = 1, scale: float = 0.05, **kwargs):
    heads = new_heads(model, head_type=head_type, num_heads=NUM_HEADS, seed=seed, **kwargs)
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return heads


def _logged(result) -> list[tuple]:
    return [(s.position, s.tree_index, s.num_nodes, s.depth, s.accept_length)
            for s in result.step_log]


def _same_run(static, eager) -> None:
    assert static.tokens == eager.tokens
    assert static.accept_lengths == eager.accept_lengths
    assert _logged(static) == _logged(eager)
    for a, b in zip(static.step_log, eager.step_log, strict=True):
        assert a.entropy_estimate == pytest.approx(b.entropy_estimate, abs=1e-4, nan_ok=True)


@pytest.mark.parametrize("window", ["filled", "full"])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_every_tree_is_token_identical_to_eager_and_generate(rt, setup, head_type, window):
    """Oracle heads accept varied paths; EOS and max_new_tokens cut the last step."""
    model, references = setup
    rng = np.random.default_rng(21 if head_type == "medusa" else 22)
    for case, (name, tree) in enumerate(TREES.items()):
        for prompt in PROMPTS:
            ids = torch.tensor(prompt)
            reference = references[tuple(prompt)]
            ranks = rt.random_ranks(rng, len(reference), NUM_HEADS, TOPK, miss=0.2)
            heads = rt.OracleHeads(model, ids, reference, ranks, head_type=head_type, topk=TOPK,
                                   seed=case)
            static = SpeculativeDecoder(model, heads, topk=TOPK, window=window)
            eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
            assert static.static_engine is not None and eager.static_engine is None
            max_new = int(rng.integers(1, 40))
            eos = [reference[int(rng.integers(1, 30))]] if case % 2 else []
            got = static.generate(ids, StaticScheduler(tree), max_new_tokens=max_new,
                                  eos_token_ids=eos)
            want = eager.generate(ids, StaticScheduler(tree), max_new_tokens=max_new,
                                  eos_token_ids=eos)
            _same_run(got, want)
            stop = reference.index(eos[0]) + 1 if eos else max_new
            assert got.tokens == reference[: min(stop, max_new)], (name, prompt)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("window", ["filled", "full"])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_real_heads_on_random_trees(rt, setup, head_type, window, padded):
    model, references = setup
    heads = _noisy_heads(model, head_type)
    rng = np.random.default_rng(5)
    static = SpeculativeDecoder(model, heads, topk=TOPK, window=window,
                                padded_nodes=PADDING if padded else None)
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    for case in range(4):
        tree = rt.random_tree(rng, int(rng.integers(0, 60)), depth=NUM_HEADS, topk=TOPK)
        prompt = PROMPTS[case % len(PROMPTS)]
        got = static.generate(torch.tensor(prompt), StaticScheduler(tree), max_new_tokens=30)
        want = eager.generate(torch.tensor(prompt), StaticScheduler(tree), max_new_tokens=30)
        _same_run(got, want)
        assert got.tokens == references[tuple(prompt)][:30]


def _two_tree_schedule(signal: str, trees, eager: SpeculativeDecoder, prompts) -> Schedule:
    """Thresholds at the median estimate of an eager run, so that both trees serve steps."""
    probe = Schedule(trees, (1e9,), EntropyEstimator.last(), signal)
    estimates = []
    for prompt in prompts:
        run = eager.generate(torch.tensor(prompt), BundleScheduler(probe), max_new_tokens=30)
        estimates += [s.entropy_estimate for s in run.step_log]
    values = np.unique(estimates)
    middle = len(values) // 2
    threshold = float((values[middle - 1] + values[middle]) / 2)
    return Schedule(trees, (threshold,), EntropyEstimator.last(), signal)


@pytest.mark.parametrize("window", ["filled", "full"])
@pytest.mark.parametrize(("head_type", "signal", "draft_vocab"), [
    ("medusa", BASE_ENTROPY, None), ("hydra", BASE_ENTROPY, None),
    ("medusa", DRAFT_ENTROPY, None), ("hydra", DRAFT_ENTROPY, None),
    ("medusa", DRAFT_ENTROPY, 80), ("hydra", DRAFT_ENTROPY, 80),
])
def test_bundle_schedules_on_both_signals_match_eager(rt, setup, head_type, signal, window,
                                                      draft_vocab):
    """Entropy-switched trees (with the empty tree: fused for Medusa's draft signal); with a
    draft vocabulary, the prepared buffer holds its columns."""
    model, references = setup
    heads = _noisy_heads(model, head_type, scale=0.2)
    if draft_vocab is not None:
        generator = torch.Generator().manual_seed(7)
        heads.set_draft_vocab(torch.randperm(heads.vocab_size, generator=generator)[:draft_vocab])
    static = SpeculativeDecoder(model, heads, topk=TOPK, window=window)
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    assert static.fuses_empty == (head_type == "medusa")
    trees = (TREES["deep"], TREES["empty"]) if signal == DRAFT_ENTROPY else \
        (TREES["empty"], TREES["mc_sim_7b_63"])
    schedule = _two_tree_schedule(signal, trees, eager, PROMPTS)
    used = set()
    for prompt in PROMPTS:
        got = static.generate(torch.tensor(prompt), BundleScheduler(schedule), max_new_tokens=30)
        want = eager.generate(torch.tensor(prompt), BundleScheduler(schedule), max_new_tokens=30)
        _same_run(got, want)
        assert got.tokens == references[tuple(prompt)][:30]
        used.update(s.tree_index for s in got.step_log)
    assert used == {0, 1}


@pytest.mark.parametrize("engine", ["auto", "eager"])
def test_autoregressive_runs_on_the_same_step_machinery(rt, setup, engine):
    model, references = setup
    for prompt in PROMPTS:
        reference = references[tuple(prompt)]
        result = autoregressive_generate(model, prompt, max_new_tokens=25, engine=engine)
        assert result.tokens == reference[:25] and result.accept_lengths == [1] * 24
        eos = reference[7]
        cut = autoregressive_generate(model, prompt, max_new_tokens=25, eos_token_ids=[eos],
                                      engine=engine)
        assert cut.tokens == reference[: reference.index(eos) + 1]


def test_full_window_ignores_whatever_the_unfilled_cache_holds(rt, setup):
    model, references = setup
    heads = _noisy_heads(model, "hydra")
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full")
    engine = decoder.static_engine
    engine.reserve(400)
    with torch.inference_mode():  # the cache is an inference tensor
        engine.cache.normal_(0.0, 100.0)
    for prompt in PROMPTS:
        got = decoder.generate(torch.tensor(prompt), StaticScheduler(TREES["mc_sim_7b_63"]),
                               max_new_tokens=30)
        assert got.tokens == references[tuple(prompt)][:30]
    assert engine.capacity == 512  # reserved once, never shrunk or reallocated


class _HostSync(AssertionError):
    pass


def _bool_indexed(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


class _DeviceSyncDetector(TorchDispatchMode):
    """Raise on every op that a CUDA graph cannot capture: a read of a tensor's value on the
    host (``data_dependent_output``: ``.item()``, ``bool(t)``, ``equal``), an output whose shape
    depends on values (``dynamic_output_shape``: ``nonzero``, ``masked_select``, boolean-mask
    indexing; integer indexing is fine) and a tensor made from Python data (``torch.tensor``:
    a host-to-device copy whose values the graph would freeze). Seen at the dispatcher, so
    syncs inside C++ (``x[mask]``) are caught too, not only Python-level reads."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tags = set(func.tags)
        packet = func.overloadpacket
        if torch.Tag.data_dependent_output in tags:
            raise _HostSync(f"{func} reads a tensor on the host inside a static step")
        if packet in (torch.ops.aten.index, torch.ops.aten.index_put_,
                      torch.ops.aten.index_put, torch.ops.aten._index_put_impl_):
            if _bool_indexed(args):
                raise _HostSync(f"{func} with a boolean mask inside a static step")
        elif torch.Tag.dynamic_output_shape in tags:
            raise _HostSync(f"{func}'s output shape depends on values inside a static step")
        if packet is torch.ops.aten.lift_fresh:
            raise _HostSync("torch.tensor(Python data) inside a static step")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def forbid_host_sync(monkeypatch):
    """A context in which every Tensor -> Python read raises (what would sync a device) and so
    does every op a CUDA graph cannot capture (``_DeviceSyncDetector``)."""
    def make(name):
        def refuse(self, *args, **kwargs):
            raise _HostSync(f"Tensor.{name} inside a static step")
        return refuse

    @contextmanager
    def forbid():
        with monkeypatch.context() as patch:
            for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__",
                         "__index__"):
                patch.setattr(torch.Tensor, name, make(name))
            with _DeviceSyncDetector():
                yield

    return forbid


@pytest.mark.parametrize("culprit", [
    lambda x: x.sum().item(), lambda x: x.tolist(), lambda x: bool(x.sum() > 0),
    lambda x: x[x > 0], lambda x: torch.nonzero(x), lambda x: torch.masked_select(x, x > 0),
    lambda x: x.index_put_((x > 0,), torch.zeros(())), lambda x: torch.tensor([1, 2]),
    lambda x: torch.repeat_interleave(torch.ones(3, dtype=torch.int64)),
])
def test_the_sync_check_catches_what_a_cuda_graph_cannot_capture(forbid_host_sync, culprit):
    x = torch.randn(8)
    with forbid_host_sync(), pytest.raises(_HostSync):
        culprit(x)
    with forbid_host_sync():  # integer indexing, reductions and in-place copies pass
        x.index_select(0, torch.arange(3)).sum()
        x[torch.arange(3)].argmax()
        x.clone().copy_(x)


def _every_step_variant(engine, head_type: str) -> list:
    """Each tree's plain step, the preparation, a draft-entropy tree and empty-tree step, and
    for Medusa the fused empty-tree step."""
    steps = [engine.tree_step(tree, base_entropy=True) for tree in TREES.values()]
    steps += [engine.prepare_step(4), engine.tree_step(TREES["deep"], prepare_depth=4),
              engine.tree_step(TREES["empty"], prepare_depth=4)]
    if head_type == "medusa":
        steps.append(engine.tree_step(TREES["empty"], prepare_depth=4, fuse=True))
    return steps


def _run_as_captured(steps, forbid_host_sync) -> None:
    """Warm-up runs first, as before a capture (the CPU kernels pack weights on first use), then
    each step's body as a capture would record it: with host syncs forbidden."""
    with torch.inference_mode():
        for step in steps:
            step.body(None)
    with forbid_host_sync(), torch.inference_mode():
        for step in steps:
            step.body(None)


@pytest.mark.parametrize(("head_type", "draft_vocab", "dtype"), [
    ("medusa", None, torch.float32), ("hydra", None, torch.float32),
    ("medusa", 80, torch.bfloat16), ("hydra", 80, torch.bfloat16),
])
def test_graph_shaped_steps_never_read_a_tensor_on_the_host(rt, setup, head_type, draft_vocab,
                                                            dtype, forbid_host_sync):
    model, _ = setup
    heads = _noisy_heads(model, head_type)
    if draft_vocab is not None:
        generator = torch.Generator().manual_seed(7)
        heads.set_draft_vocab(torch.randperm(heads.vocab_size, generator=generator)[:draft_vocab])
    if dtype != torch.float32:
        model, heads = copy.deepcopy((model, heads))  # one copy: the heads share its lm_head
        model, heads = model.to(dtype), heads.to(dtype)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full")
    engine = decoder.static_engine
    assert engine.dtype == dtype
    engine.reserve(128)
    engine.reserve_prepared()
    engine.prefill(torch.tensor(PROMPTS[0]))
    steps = _every_step_variant(engine, head_type)
    _run_as_captured(steps, forbid_host_sync)


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_steps_keep_every_tensor_on_the_models_device(rt, setup, head_type):
    """The graph-shaped steps on a device other than the CPU, as on CUDA (the meta device: no
    data, so a host read fails too): every buffer, plan and step tensor is made on the model's
    device, nothing mixes in a CPU tensor, and the CPU-only kernels are not taken."""
    model, _ = setup
    heads = _noisy_heads(model, head_type)
    heads.set_draft_vocab(torch.arange(80))
    model, heads = copy.deepcopy((model, heads))  # one copy: the heads share its lm_head
    model, heads = model.to("meta", torch.bfloat16), heads.to("meta", torch.bfloat16)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full", graphs=False,
                                 padded_nodes=PADDING)
    engine = decoder.static_engine
    assert engine.device.type == "meta" and engine.dtype == torch.bfloat16
    engine.reserve(256)
    engine.reserve_prepared()
    with torch.inference_mode():
        logits = engine.prefill(torch.tensor(PROMPTS[0], device="meta"))
        for step in _every_step_variant(engine, head_type):
            step.body(None)
    assert logits.device.type == "meta"
    with pytest.raises(RuntimeError, match="[Mm]eta|device"):  # the check can fail
        torch.ones(2, device="meta") + torch.ones(2)


def test_breakdown_times_phases_and_decodes_the_same(rt, setup, monkeypatch):
    """Phases are timed (a sync after each) only when asked for; by default a step runs whole
    and its launch-to-readback time is logged as verify_ms."""
    import entmtp.runtime._static_step as static_step

    model, references = setup
    heads = _noisy_heads(model, "medusa")
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, breakdown=True)
    result = decoder.generate(torch.tensor(PROMPTS[2]), StaticScheduler(TREES["deep"]),
                              max_new_tokens=20)
    assert result.tokens == references[tuple(PROMPTS[2])][:20]
    assert all(s.draft_ms > 0 and s.verify_ms > 0 and s.bookkeeping_ms >= 0
               for s in result.step_log)

    def no_phase_timing(*args, **kwargs):
        raise AssertionError("a step was timed phase by phase without breakdown")

    monkeypatch.setattr(static_step.TreeStep, "timed", no_phase_timing)
    plain = SpeculativeDecoder(model, heads, topk=TOPK).generate(
        torch.tensor(PROMPTS[2]), StaticScheduler(TREES["deep"]), max_new_tokens=20)
    assert plain.tokens == result.tokens
    assert all(s.draft_ms == 0 and s.verify_ms > 0 for s in plain.step_log)


def test_unsupported_models_stay_eager_and_say_so(rt):
    model = rt.sharp_llama(4)
    model.model.rotary_emb.rope_type = "dynamic"  # inv_freq would change with the length
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    decoder = SpeculativeDecoder(model, heads, topk=4)
    assert decoder.static_engine is None
    assert "eager runtime" in decoder.runtime_note and "dynamic" in decoder.runtime_note
    with pytest.raises(EntmtpError, match="engine='static'"):
        SpeculativeDecoder(model, heads, topk=4, engine="static")
    with pytest.raises(EntmtpError, match="engine 'fast'"):
        SpeculativeDecoder(model, heads, topk=4, engine="fast")
    supported = SpeculativeDecoder(rt.sharp_llama(4), heads, topk=4)
    assert "static-shape runtime (no graphs on cpu)" in supported.runtime_note
    assert "sampling" in supported.runtime_note



class _FakeCuda:
    """Stands in for torch.cuda's graph API on the CPU: capture records the step bodies run
    inside it (raising on any op a real capture cannot take) and undoes what they did (a real
    capture executes nothing); replay runs them.

    It keeps what a check needs: the pool and the stream each capture got (``pools``,
    ``capture_streams``), the side streams made, and the allocator's reserved memory as a graph
    pool that grows 1 MiB per capture plus cached blocks (3 MiB per eager run of a step, freed by
    ``empty_cache`` and by entering a capture, as the real context does). ``fail_body`` (a step
    name) makes that step's captured body raise, after which the context's exit raises its own
    error, as CUDA does; ``fail_exit`` makes only the exit raise; ``on_enter`` runs as a capture
    begins. ``timeline`` logs warm-up runs, replays and CUDA events (which time the host
    clock)."""

    BODY_ERROR = ("CUDA error: operation not permitted when stream is capturing\n"
                  "CUDA kernel errors might be asynchronously reported at some other API call")
    EXIT_ERROR = "CUDA error: operation failed due to a previous error during capture"

    def __init__(self, engine, monkeypatch):
        import time
        from contextlib import nullcontext

        import entmtp.runtime._static_step as static_step

        self.engine = engine
        self.recording = None
        self.captures = 0
        self.replayed: list[str] = []  # the name of each replayed graph's step
        self.pools: list = []  # the pool each capture got
        self.capture_streams: list = []  # the stream each capture ran on
        self.warmup_streams: list = []  # the stream each warm-up ran on
        self.streams_made = 0
        self.handles = 0
        self.pool_bytes = 0
        self.cached_bytes = 0
        self.fail_body: str | None = None
        self.fail_exit: str | None = None
        self.on_enter = None
        self.timeline: list[str] = []
        self._stream = None
        fake = self

        class Graph:
            def __init__(self):
                self.calls = []
                self.step = None

            def replay(self):
                fake.replayed.append(self.step)
                fake.timeline.append("replay")
                for call in self.calls:
                    call()

        class Capture:
            def __init__(self, graph, pool=None, stream=None):
                self.graph = graph
                fake.pools.append(pool)
                fake.capture_streams.append(stream)

            def __enter__(self):
                if fake.on_enter is not None:
                    fake.on_enter()
                fake.cached_bytes = 0  # the real context empties the cache first
                fake.saved = [t.clone() for t in [*engine.state_tensors(), engine.cache]]
                fake.recording = self.graph
                fake.captures += 1
                fake.pool_bytes += 2**20

            def __exit__(self, kind, value, traceback):
                fake.recording = None
                for tensor, value_ in zip([*engine.state_tensors(), engine.cache], fake.saved,
                                          strict=True):
                    tensor.copy_(value_)
                if kind is not None:  # the capture is invalidated: ending it fails too
                    raise RuntimeError(fake.EXIT_ERROR)
                if self.graph.step == fake.fail_exit:
                    raise RuntimeError("CUDA error: out of memory")

        class Stream:
            def __init__(self, *args):
                fake.streams_made += 1

            def wait_stream(self, other):
                pass

        current = object.__new__(Stream)  # the default stream: not made by the engine

        @contextmanager
        def on_stream(stream):
            fake._stream = stream
            try:
                yield
            finally:
                fake._stream = None

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.at = None

            def record(self, stream=None):
                self.at = time.perf_counter()
                fake.timeline.append("event")

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.at - self.at) * 1000.0

        def handle():
            fake.handles += 1
            return (1, fake.handles)

        def empty_cache():
            fake.cached_bytes = 0

        for cls in (static_step.TreeStep, static_step.PrepareStep):
            original = cls.body

            def body(step, past_len, original=original):
                if fake.recording is None:
                    if fake._stream is not None:
                        fake.warmup_streams.append(fake._stream)
                        fake.timeline.append("warm-up")
                    fake.cached_bytes += 3 * 2**20
                    original(step, past_len)
                    return
                fake.recording.calls.append(lambda: original(step, None))
                fake.recording.step = step.name
                if step.name == fake.fail_body:
                    engine.past_len.add_(7)  # half-done work a failed capture leaves
                    raise RuntimeError(fake.BODY_ERROR)
                with _DeviceSyncDetector():  # what a real capture refuses
                    original(step, past_len)

            monkeypatch.setattr(cls, "body", body)
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(cuda, "graph", Capture)
        monkeypatch.setattr(cuda, "graph_pool_handle", handle)
        monkeypatch.setattr(cuda, "Stream", Stream)
        monkeypatch.setattr(cuda, "stream", lambda s: on_stream(s) if s is not None
                            else nullcontext())
        monkeypatch.setattr(cuda, "current_stream", lambda *a: current)
        monkeypatch.setattr(cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(cuda, "empty_cache", empty_cache)
        monkeypatch.setattr(cuda, "Event", Event)
        monkeypatch.setattr(cuda, "memory_reserved", lambda *a: fake.pool_bytes + fake.cached_bytes)


@pytest.mark.parametrize(("head_type", "signal"), [("medusa", DRAFT_ENTROPY),
                                                   ("hydra", BASE_ENTROPY)])
def test_graph_bookkeeping_captures_each_step_once_and_replays_it(rt, setup, head_type, signal,
                                                                  monkeypatch):
    """With graph capture emulated on the CPU: warm-up leaves the state as it was, each step is
    captured once and replayed, and a grown cache re-captures."""
    model, references = setup
    heads = _noisy_heads(model, head_type, scale=0.2)
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full")
    engine = decoder.static_engine
    engine.graphs = True  # as on CUDA
    fake = _FakeCuda(engine, monkeypatch)
    trees = (TREES["deep"], TREES["empty"]) if signal == DRAFT_ENTROPY else \
        (TREES["empty"], TREES["mc_sim_7b_63"])
    schedule = _two_tree_schedule(signal, trees, eager, PROMPTS)
    for prompt in PROMPTS:
        fake.replayed.clear()
        got = decoder.generate(torch.tensor(prompt), BundleScheduler(schedule), max_new_tokens=30)
        want = eager.generate(torch.tensor(prompt), BundleScheduler(schedule), max_new_tokens=30)
        _same_run(got, want)
        assert got.tokens == references[tuple(prompt)][:30]
        # every step replays the graph of its own tree's step; a draft-entropy schedule also
        # replays the preparation once after the prefill
        chosen = [engine.step_for(trees[s.tree_index], StepOptions.of(
            BundleScheduler(schedule), decoder.fuses_empty)).name for s in got.step_log]
        assert fake.replayed == (["prepare"] if signal == DRAFT_ENTROPY else []) + chosen
    captured = [record.step for record in engine.capture_log]
    assert len(captured) == len(set(captured)) == fake.captures >= 2  # once per step object
    assert all(r.capture_ms > 0 and r.memory_bytes == 2**20 for r in engine.capture_log)
    report = runtime_report([decoder], model, engine="auto", graphs=True)
    assert report["graph_captures"] == len(captured)
    assert report["capture_ms"] == pytest.approx(sum(r.capture_ms for r in engine.capture_log))
    assert report["capture_memory_bytes"] == len(captured) * 2**20
    assert {c["step"] for c in report["captures"] if c["runtime"] == "decoder 0"} == set(captured)
    assert capture_line(report) == (
        f"captured {len(captured)} CUDA graphs in {report['capture_ms']:.0f} ms, "
        f"{len(captured):.1f} MiB of graph memory")
    assert capture_line(runtime_report([eager], model, engine="eager", graphs=True)) is None
    engine.reserve(engine.capacity + 1)  # a new cache: every graph is captured again
    decoder.generate(torch.tensor(PROMPTS[0]), BundleScheduler(schedule), max_new_tokens=30)
    assert fake.captures > len(captured)


_HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__",
               "__index__")


@pytest.mark.parametrize(("head_type", "signal"), [
    ("medusa", None), ("medusa", BASE_ENTROPY), ("hydra", BASE_ENTROPY),
    ("medusa", DRAFT_ENTROPY), ("hydra", DRAFT_ENTROPY),
])
def test_decoding_reads_the_device_once_per_step(rt, setup, head_type, signal, monkeypatch):
    """Between two steps' callbacks the host copies device data exactly once (the step's
    readback), whatever the schedule reads: one tree, base entropies or head 1's entropy.
    A ``numpy()`` after a ``cpu()`` reads the copy, not the device."""
    model, _ = setup
    heads = _noisy_heads(model, head_type, scale=0.2)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full")
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    if signal is None:
        scheduler = StaticScheduler(TREES["deep"])
    else:
        trees = (TREES["deep"], TREES["empty"]) if signal == DRAFT_ENTROPY else \
            (TREES["empty"], TREES["mc_sim_7b_63"])
        scheduler = BundleScheduler(_two_tree_schedule(signal, trees, eager, PROMPTS))
    decoder.generate(torch.tensor(PROMPTS[0]), scheduler, max_new_tokens=30)  # warm
    reads: list[str] = []
    for name in _HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if not (_name == "numpy" and self.device.type == "cpu" and reads
                    and reads[-1] == "cpu"):
                reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    per_step: list[int] = []

    def on_step(step, tokens) -> None:
        per_step.append(len(reads))
        reads.clear()

    result = decoder.generate(torch.tensor(PROMPTS[0]), scheduler, max_new_tokens=30,
                              on_step=on_step)
    monkeypatch.undo()
    assert result.steps > 3 and len(per_step) == result.steps + 1  # + the prefill's
    assert per_step[1:] == [1] * result.steps


def test_the_cache_is_reserved_for_the_context_and_the_widest_step(rt, setup):
    """Prompt + new tokens + the widest step's cache writes (padded widths included), not
    merely rounded up to the allocation quantum."""
    model, _ = setup
    heads = _noisy_heads(model, "medusa")
    # 63 nodes: 64 cache writes a step, 80 padded to 79 nodes
    for padded_nodes, max_context, capacity in (({}, 100, 256), ({63: 79}, 180, 384)):
        decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full",
                                     padded_nodes=padded_nodes)
        decoder.warm_up(StaticScheduler(TREES["mc_sim_7b_63"]), max_context=max_context)
        assert decoder.static_engine.capacity == capacity


def test_warm_up_captures_every_step_before_decoding(rt, setup, monkeypatch):
    """``warm_up`` captures all steps of a schedule up front, also right after a generation
    that left a past length with no room for a larger tree (the warm-up then runs lower)."""
    model, references = setup
    heads = _noisy_heads(model, "medusa", scale=0.2)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full")
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    engine = decoder.static_engine
    engine.graphs = True
    fake = _FakeCuda(engine, monkeypatch)
    long_prompt = torch.tensor(PROMPTS[2])
    chain = StaticScheduler(TREES["chain"])
    got = decoder.generate(long_prompt, chain, max_new_tokens=100)
    assert engine.capacity == 128 and int(engine.past_len) + 64 > engine.capacity
    assert got.tokens == eager.generate(long_prompt, chain, max_new_tokens=100).tokens
    big = StaticScheduler(TREES["mc_sim_7b_63"])  # 64 tokens per step
    decoder.warm_up(big, max_context=len(PROMPTS[1]) + 10)
    assert engine.capacity == 128 and fake.captures == 2
    before = fake.captures
    short = decoder.generate(torch.tensor(PROMPTS[1]), big, max_new_tokens=10)
    assert fake.captures == before  # nothing left to capture
    assert short.tokens == references[tuple(PROMPTS[1])][:10]


def test_timed_runs_repeat_the_same_step_from_the_same_state(rt, setup):
    """What a latency profiler needs: any tree, many times, at one fixed context."""
    model, _ = setup
    heads = _noisy_heads(model, "hydra", scale=0.2)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    engine = decoder.static_engine
    prompt = torch.tensor(PROMPTS[2])
    decoder.warm_up(StaticScheduler(TREES["mc_sim_7b_63"]), max_context=40)
    with torch.inference_mode():
        engine.prefill(prompt)
        past = len(prompt)
        context = engine.cache[..., :past, :].clone()
        state = engine.save_state()
        for tree in (TREES["mc_sim_7b_63"], TREES["empty"], TREES["chain"]):
            step = engine.tree_step(tree)
            outputs = []
            for _ in range(3):
                engine.timed_run(step, past)
                outputs.append(step.out_ints.tolist())
                assert all(torch.equal(a, b) for a, b in zip(engine.state_tensors(), state,
                                                              strict=True))
                assert torch.equal(engine.cache[..., :past, :], context)
            assert outputs[0] == outputs[1] == outputs[2]


# Pads every drafted tree by 1 to 13 rows (a latency model pads only where that is cheaper; the
# runtime must decode the same tokens for any table).
PADDING = {n: n + 1 + (n % 5) * 3 for n in range(1, 128)}


@pytest.mark.parametrize("window", ["filled", "full"])
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_padded_widths_decode_the_unpadded_tokens(rt, setup, head_type, window):
    """Every tree verified at a padded width gives the unpadded step's tokens, accept lengths
    and entropies (oracle heads: varied paths, EOS and max_new_tokens cuts)."""
    model, references = setup
    rng = np.random.default_rng(31 if head_type == "medusa" else 32)
    for case, (name, tree) in enumerate(TREES.items()):
        for prompt in PROMPTS:
            ids = torch.tensor(prompt)
            reference = references[tuple(prompt)]
            ranks = rt.random_ranks(rng, len(reference), NUM_HEADS, TOPK, miss=0.2)
            heads = rt.OracleHeads(model, ids, reference, ranks, head_type=head_type, topk=TOPK,
                                   seed=case)
            padded = SpeculativeDecoder(model, heads, topk=TOPK, window=window,
                                        padded_nodes=PADDING)
            plain = SpeculativeDecoder(model, heads, topk=TOPK, window=window)
            eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
            max_new = int(rng.integers(1, 40))
            eos = [reference[int(rng.integers(1, 30))]] if case % 2 else []
            scheduler = BundleScheduler(Schedule((tree,), (), EntropyEstimator.last(),
                                                 BASE_ENTROPY))
            got = padded.generate(ids, scheduler, max_new_tokens=max_new, eos_token_ids=eos)
            _same_run(got, plain.generate(ids, scheduler, max_new_tokens=max_new,
                                          eos_token_ids=eos))
            _same_run(got, eager.generate(ids, scheduler, max_new_tokens=max_new,
                                          eos_token_ids=eos))
            step = padded.static_engine.tree_step(tree, base_entropy=True)
            want_width = PADDING[tree.num_nodes] + 1 if tree.num_nodes else 1
            assert step.width == step.cache_width == want_width, name


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_padded_schedules_on_real_heads_match_eager(rt, setup, head_type):
    """Switching trees at padded widths, with draft-entropy preparation (Medusa: the empty
    tree's fused step, never padded)."""
    model, references = setup
    heads = _noisy_heads(model, head_type, scale=0.2)
    padded = SpeculativeDecoder(model, heads, topk=TOPK, padded_nodes=PADDING)
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    for signal, trees in ((DRAFT_ENTROPY, (TREES["deep"], TREES["empty"])),
                          (BASE_ENTROPY, (TREES["chain"], TREES["mc_sim_7b_63"]))):
        schedule = _two_tree_schedule(signal, trees, eager, PROMPTS)
        for prompt in PROMPTS:
            got = padded.generate(torch.tensor(prompt), BundleScheduler(schedule),
                                  max_new_tokens=30)
            want = eager.generate(torch.tensor(prompt), BundleScheduler(schedule),
                                  max_new_tokens=30)
            _same_run(got, want)
            assert got.tokens == references[tuple(prompt)][:30]
    assert "padded widths: 1->5, 2->9, 3->13" in padded.runtime_note
    assert "padded" not in eager.runtime_note


def test_padding_rows_change_no_real_row_and_compaction_ignores_them(rt, setup):
    """One step from one state, unpadded and padded: the same outputs and the same cache up to
    the new past length; the padding rows' keys sit after the tree's slots."""
    model, _ = setup
    heads = _noisy_heads(model, "hydra", scale=0.2)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full")
    engine = decoder.static_engine
    tree = TREES["deep"]  # 11 nodes, q = 12
    engine.reserve(128)
    with torch.inference_mode():
        engine.prefill(torch.tensor(PROMPTS[2]))
        past = len(PROMPTS[2])
        state = engine.save_state()
        results = {}
        for width in (12, 16, 29):
            engine.restore_state(state)
            engine.cache[..., past:, :] = 0.0
            step = engine.tree_step(tree, base_entropy=True, width=width)
            engine.run(step, past)
            out = step.readback()[0]
            cache = engine.cache.clone()
            results[width] = (out, cache, [t.clone() for t in engine.state_tensors()])
        out, cache, after = results[12]
        new_past = past + out.length
        for width in (16, 29):
            padded_out, padded_cache, padded_after = results[width]
            assert padded_out.path_tokens == out.path_tokens
            assert padded_out.next_token == out.next_token
            assert padded_out.base_entropies == pytest.approx(out.base_entropies, abs=1e-5)
            torch.testing.assert_close(padded_cache[..., :new_past, :], cache[..., :new_past, :])
            for a, b in zip(padded_after, after, strict=True):
                torch.testing.assert_close(a, b)
            # the padding rows wrote slots past + 12 .. past + width - 1, nothing beyond
            assert padded_cache[..., past + 12 : past + width, :].abs().sum() > 0
            assert padded_cache[..., past + width :, :].abs().sum() == 0
        with pytest.raises(EntmtpError, match="cannot be verified at width 11"):
            engine.tree_step(tree, width=11)
        with pytest.raises(EntmtpError, match="empty tree"):
            engine.tree_step(TREES["empty"], width=4)
    with pytest.raises(EntmtpError, match="padding 3 -> 2 nodes"):
        SpeculativeDecoder(model, heads, topk=TOPK, padded_nodes={3: 2})


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_batched_steps_never_read_a_tensor_on_the_host(rt, setup, head_type, forbid_host_sync):
    """Three rows at different past lengths, one finished: the same graph-safe ops."""
    model, _ = setup
    heads = _noisy_heads(model, head_type)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full")
    engine = decoder.static_engine
    engine.set_rows(3)
    engine.reserve(128)
    engine.reserve_prepared()
    for row, prompt in enumerate(PROMPTS):
        engine.prefill(torch.tensor(prompt), row)
    engine.finish([1])
    steps = _every_step_variant(engine, head_type)
    steps.append(engine.tree_step(TREES["deep"], base_entropy=True, width=16))
    _run_as_captured(steps, forbid_host_sync)
    assert int(engine.past_len[1]) == len(PROMPTS[1])


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_padded_steps_never_read_a_tensor_on_the_host(rt, setup, head_type, forbid_host_sync):
    model, _ = setup
    heads = _noisy_heads(model, head_type)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full", padded_nodes=PADDING)
    engine = decoder.static_engine
    engine.reserve(256)
    engine.reserve_prepared()
    engine.prefill(torch.tensor(PROMPTS[0]))
    steps = [engine.tree_step(tree, base_entropy=True) for tree in TREES.values()]
    steps.append(engine.tree_step(TREES["deep"], prepare_depth=4))
    assert all(s.width > s.plan.size for s in steps if s.plan.num_nodes)
    _run_as_captured(steps, forbid_host_sync)


@pytest.mark.parametrize(("head_type", "signal"), [("medusa", DRAFT_ENTROPY),
                                                   ("hydra", BASE_ENTROPY)])
def test_padded_steps_under_emulated_graphs_match_eager(rt, setup, head_type, signal,
                                                        monkeypatch):
    """Captured (emulated) padded steps replay the eager tokens; the reserve counts the padded
    width (a capture's warm-up writes every padding slot)."""
    model, references = setup
    heads = _noisy_heads(model, head_type, scale=0.2)
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full", padded_nodes=PADDING)
    engine = decoder.static_engine
    engine.graphs = True
    fake = _FakeCuda(engine, monkeypatch)
    trees = (TREES["deep"], TREES["empty"]) if signal == DRAFT_ENTROPY else \
        (TREES["chain"], TREES["mc_sim_7b_63"])
    schedule = _two_tree_schedule(signal, trees, eager, PROMPTS)
    for prompt in PROMPTS:
        got = decoder.generate(torch.tensor(prompt), BundleScheduler(schedule), max_new_tokens=30)
        want = eager.generate(torch.tensor(prompt), BundleScheduler(schedule), max_new_tokens=30)
        _same_run(got, want)
        assert got.tokens == references[tuple(prompt)][:30]
    assert fake.captures >= 2
    assert any("width=" in record.step for record in engine.capture_log)
    widest = max(PADDING[t.num_nodes] + 1 for t in trees if t.num_nodes)
    assert engine.capacity >= len(PROMPTS[2]) + 30 + widest


# -- capture failures, the graph pool, the heads' draft rows, CUDA-event timing -----------------

def _graph_decoder(model, heads, monkeypatch):
    """A full-window decoder whose engine captures graphs as on CUDA (``_FakeCuda``)."""
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full")
    engine = decoder.static_engine
    engine.graphs = True
    return decoder, engine, _FakeCuda(engine, monkeypatch)


def _state(engine) -> list[torch.Tensor]:
    return [t.clone() for t in engine.state_tensors()]


@pytest.mark.parametrize("where", ["body", "exit"])
def test_a_failed_capture_restores_the_state_and_says_so_in_one_line(rt, setup, where,
                                                                      monkeypatch, capsys):
    """Whether the step's body raises inside the capture (the context's exit then raises a
    second error) or the exit alone does: the state is restored (the past length the warm-up
    clamped included), one line names the step and the first error, the other steps are
    captured, and the failed one is never captured again, not even for a new cache."""
    from entmtp.runtime._static_step import CaptureFailure

    model, _ = setup
    heads = _noisy_heads(model, "medusa")
    _, engine, fake = _graph_decoder(model, heads, monkeypatch)
    engine.reserve(128)
    with torch.inference_mode():
        engine.prefill(torch.tensor(PROMPTS[0]))
        engine.past_len.fill_(100)  # a finished generation's: the 64-token step's warm-up clamps
    failing = engine.tree_step(TREES["mc_sim_7b_63"])
    other = engine.tree_step(TREES["chain"])
    setattr(fake, "fail_body" if where == "body" else "fail_exit", failing.name)
    before = _state(engine)
    engine.capture([failing, other])
    assert all(torch.equal(a, b) for a, b in zip(engine.state_tensors(), before, strict=True))
    error = ("CUDA error: operation not permitted when stream is capturing" if where == "body"
             else "CUDA error: out of memory")
    assert engine.capture_failures == [CaptureFailure(failing.name, error)]
    line = (f"CUDA graph capture of {failing.name} failed: {error}; this step runs without "
            "graphs (--no-graphs skips capture)")
    assert capsys.readouterr().err.splitlines() == [line]
    assert [r.step for r in engine.capture_log] == [other.name]
    assert failing.graph is None and failing.capture_error == error
    captures = fake.captures
    engine.capture([failing, other])
    engine.reserve(engine.capacity + 1)  # stale graphs: the other step is captured again
    engine.capture([failing, other])
    assert fake.captures == captures + 1 and len(engine.capture_failures) == 1
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("where", ["body", "exit"])
@pytest.mark.parametrize(("head_type", "signal", "fails"), [
    ("medusa", DRAFT_ENTROPY, "deep"), ("medusa", DRAFT_ENTROPY, "prepare"),
    ("hydra", BASE_ENTROPY, "mc_sim_7b_63"), ("hydra", BASE_ENTROPY, "empty"),
])
def test_decoding_past_a_failed_capture_matches_decoding_without_graphs(
        rt, setup, head_type, signal, fails, where, monkeypatch, capsys):
    """The step whose capture failed runs without graphs, the others replay theirs: tokens,
    accept lengths and entropies as without graphs; the failure is printed once, never
    captured again, and is in the runtime report and its capture line."""
    model, references = setup
    heads = _noisy_heads(model, head_type, scale=0.2)
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    plain = SpeculativeDecoder(model, heads, topk=TOPK, window="full", graphs=False)
    decoder, engine, fake = _graph_decoder(model, heads, monkeypatch)
    trees = (TREES["deep"], TREES["empty"]) if signal == DRAFT_ENTROPY else \
        (TREES["empty"], TREES["mc_sim_7b_63"])
    schedule = _two_tree_schedule(signal, trees, eager, PROMPTS)
    options = StepOptions.of(BundleScheduler(schedule), decoder.fuses_empty)
    failing = (engine.prepare_step(options.prepare_depth) if fails == "prepare"
               else engine.step_for(TREES[fails], options))
    setattr(fake, "fail_body" if where == "body" else "fail_exit", failing.name)
    captures = None
    for prompt in PROMPTS:
        got = decoder.generate(torch.tensor(prompt), BundleScheduler(schedule), max_new_tokens=30)
        want = plain.generate(torch.tensor(prompt), BundleScheduler(schedule), max_new_tokens=30)
        _same_run(got, want)
        assert got.tokens == references[tuple(prompt)][:30]
        captures = fake.captures if captures is None else captures
        assert fake.captures == captures  # captured once, before the first prompt
    assert failing.name not in fake.replayed and fake.replayed  # the others replay
    assert [f.step for f in engine.capture_failures] == [failing.name]
    assert capsys.readouterr().err.count("CUDA graph capture of") == 1
    report = runtime_report([decoder], model, engine="auto", graphs=True)
    error = engine.capture_failures[0].error
    assert report["capture_failures"] == [{"runtime": "decoder 0", "step": failing.name,
                                           "error": error}]
    assert report["graph_captures"] == len(engine.capture_log) >= 1
    assert capture_line(report) == (
        f"captured {report['graph_captures']} CUDA graph"
        f"{'s' if report['graph_captures'] != 1 else ''} in {report['capture_ms']:.0f} ms, "
        f"{report['capture_memory_bytes'] / 2**20:.1f} MiB of graph memory; 1 capture failed, "
        "that step runs without graphs (--no-graphs skips capture): "
        f"decoder 0 {failing.name} ({error})")


def test_a_report_with_only_failed_captures_still_has_a_capture_line():
    report = {"graph_captures": 0, "capture_ms": 0.0, "capture_memory_bytes": 0,
              "capture_failures": [{"runtime": "autoregressive", "step": "tree q=1 depth=0",
                                    "error": "CUDA error: x"},
                                   {"runtime": "decoder 0", "step": "prepare",
                                    "error": "CUDA error: y"}]}
    assert capture_line(report) == (
        "2 captures failed, those steps run without graphs (--no-graphs skips capture): "
        "autoregressive tree q=1 depth=0 (CUDA error: x), decoder 0 prepare (CUDA error: y)")
    assert capture_line({**report, "capture_failures": []}) is None


def test_every_capture_of_an_engine_shares_one_pool_and_one_side_stream(rt, setup, monkeypatch):
    """Warm-ups and captures run on one side stream made once; the captures of one cache share
    one graph pool (a new cache drops every graph and the next captures share a new pool); a
    capture's memory is the pool's growth alone (the warm-ups' cached blocks and what decoding
    left cached are emptied before reading), and the report's figure is the pool's."""
    model, _ = setup
    heads = _noisy_heads(model, "medusa", scale=0.2)
    eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    decoder, engine, fake = _graph_decoder(model, heads, monkeypatch)
    schedule = _two_tree_schedule(DRAFT_ENTROPY, (TREES["deep"], TREES["empty"]), eager, PROMPTS)
    decoder.generate(torch.tensor(PROMPTS[0]), BundleScheduler(schedule), max_new_tokens=30)
    first = fake.captures
    assert first >= 3  # the drafted step, the fused empty step and the preparation
    assert len(set(fake.pools)) == 1 and fake.pools[0] is not None
    stream = fake.capture_streams[0]
    assert stream is not None and fake.streams_made == 1
    assert all(s is stream for s in fake.capture_streams + fake.warmup_streams)
    assert len(fake.warmup_streams) == 2 * first  # GRAPH_WARMUP_RUNS each
    assert [r.memory_bytes for r in engine.capture_log] == [2**20] * first
    assert engine.graph_memory_bytes == first * 2**20
    engine.reserve(engine.capacity + 1)
    assert all(s.graph is None for s in [*engine._steps.values(),
                                          *engine._prepare_steps.values()])  # pool dropped
    fake.cached_bytes = 5 * 2**20  # what decoding left cached; the capture context empties it
    decoder.generate(torch.tensor(PROMPTS[1]), BundleScheduler(schedule), max_new_tokens=30)
    assert fake.captures == 2 * first
    assert len(set(fake.pools[first:])) == 1 and set(fake.pools[first:]) != set(fake.pools[:first])
    assert fake.streams_made == 1 and all(s is stream for s in fake.capture_streams)
    assert engine.graph_memory_bytes == first * 2**20  # the live pool's, not both pools'
    report = runtime_report([decoder], model, engine="auto", graphs=True)
    assert report["capture_memory_bytes"] == first * 2**20
    assert report["graph_captures"] == 2 * first


def test_draft_rows_are_refreshed_before_each_capture_and_never_rebuilt_inside_one(
        rt, setup, monkeypatch, capsys):
    """The heads copy their draft-vocabulary rows again (a weight changed) before the warm-up
    of every capture; inside the capture the heads refuse a rebuild with a clear error, which
    the capture reports, and that step runs without graphs."""
    model, references = setup
    heads = _noisy_heads(model, "hydra", shared_lm_head=False)
    heads.set_draft_vocab(torch.randperm(heads.vocab_size,
                                         generator=torch.Generator().manual_seed(7))[:80])
    decoder, engine, fake = _graph_decoder(model, heads, monkeypatch)
    refresh = heads.refresh_draft_rows
    frozen_in_capture = []

    def refreshing():
        fake.timeline.append("refresh")
        assert not heads.draft_rows_frozen
        refresh()

    monkeypatch.setattr(heads, "refresh_draft_rows", refreshing)
    fake.on_enter = lambda: frozen_in_capture.append(heads.draft_rows_frozen)
    with torch.no_grad():
        heads.proj[0].weight.mul_(1.0)  # a new version: the rows are stale
    fake.timeline.clear()
    chain = StaticScheduler(TREES["chain"])
    got = decoder.generate(torch.tensor(PROMPTS[0]), chain, max_new_tokens=20)
    assert got.tokens == references[tuple(PROMPTS[0])][:20]
    assert engine.capture_failures == [] and fake.captures == 1
    assert fake.timeline[:3] == ["refresh", "warm-up", "warm-up"] and frozen_in_capture == [True]
    assert "refresh" not in fake.timeline[1:]  # one capture, one refresh
    assert not heads.draft_rows_frozen
    weight = heads.proj[0].weight
    assert heads._draft_rows[1][0][:2] == (weight.data_ptr(), weight._version)

    # a weight that changes inside the capture: the rebuild is refused, the step runs eagerly
    def change_inside():
        with torch.no_grad():
            heads.proj[1].weight.mul_(1.0)

    fake.on_enter = change_inside
    deep = StaticScheduler(TREES["deep"])
    got = decoder.generate(torch.tensor(PROMPTS[2]), deep, max_new_tokens=20)
    assert got.tokens == references[tuple(PROMPTS[2])][:20]
    [failure] = engine.capture_failures
    assert "draft-vocabulary rows would be rebuilt inside a CUDA graph capture" in failure.error
    assert "refresh_draft_rows" in failure.error and failure.step.startswith("tree q=12")
    assert "CUDA graph capture of tree q=12" in capsys.readouterr().err
    assert not heads.draft_rows_frozen


def test_the_heads_refuse_to_rebuild_their_draft_rows_while_frozen(rt, setup):
    model, _ = setup
    heads = _noisy_heads(model, "medusa", shared_lm_head=False)
    heads.set_draft_vocab(torch.arange(80))
    heads.refresh_draft_rows()
    rows = heads.draft_projection_weight(2)
    heads.draft_rows_frozen = True
    assert heads.draft_projection_weight(2)[0] is rows[0]  # unchanged weights: the cached rows
    heads.refresh_draft_rows()  # nothing to rebuild: fine while frozen
    with torch.no_grad():
        heads.proj[1].weight.add_(1.0)
    with pytest.raises(EntmtpError, match="head 2's draft-vocabulary rows would be rebuilt"):
        heads.draft_projection_weight(2)
    with pytest.raises(EntmtpError, match="call heads.refresh_draft_rows"):
        heads.refresh_draft_rows()
    heads.draft_rows_frozen = False
    heads.refresh_draft_rows()
    heads.draft_rows_frozen = True
    torch.testing.assert_close(heads.draft_projection_weight(2)[0],
                               heads.proj[1].weight[:80].detach())


def test_timed_run_keeps_the_cuda_event_time_beside_the_host_time(rt, setup, monkeypatch):
    """Off CUDA only the host time; on CUDA (emulated) also the time between two CUDA events
    recorded around the replay (before the readback), which the host time contains."""
    model, _ = setup
    heads = _noisy_heads(model, "medusa")
    decoder = SpeculativeDecoder(model, heads, topk=TOPK)
    engine = decoder.static_engine
    decoder.warm_up(StaticScheduler(TREES["deep"]), max_context=40)
    with torch.inference_mode():
        engine.prefill(torch.tensor(PROMPTS[2]))
    timed = engine.timed_run(engine.tree_step(TREES["deep"]), len(PROMPTS[2]))
    assert not engine.timing_events and timed.host_ms > 0 and timed.device_ms is None

    decoder, engine, fake = _graph_decoder(model, heads, monkeypatch)
    engine.timing_events = True  # as on CUDA
    decoder.warm_up(StaticScheduler(TREES["deep"]), max_context=40)
    step = engine.tree_step(TREES["deep"])
    with torch.inference_mode():
        engine.prefill(torch.tensor(PROMPTS[2]))
    original = type(step).readback
    monkeypatch.setattr(type(step), "readback",
                        lambda s: (fake.timeline.append("readback"), original(s))[1])
    fake.timeline.clear()
    timed = engine.timed_run(step, len(PROMPTS[2]))
    assert fake.timeline == ["event", "replay", "event", "readback"]
    assert 0 <= timed.device_ms <= timed.host_ms
