"""Latency profiling: the trees it times, the structure of the fitted model (never the times)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.evaluation._latency_profile import budget_tree, profile_latency, trimmed_mean
from entmtp.model._heads import new_heads
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._tree import Tree
from support import SteppingClock


@pytest.mark.parametrize("topk", [1, 3, 10])
def test_budget_trees_have_the_asked_size_and_depth(topk):
    for num_heads in (1, 2, 4):
        for n in (0, 1, 2, 5, 9, 20):
            capacity = sum(topk**d for d in range(1, num_heads + 1))
            if n > capacity:
                with pytest.raises(EntmtpError, match="does not fit"):
                    budget_tree(n, 1, topk=topk, num_heads=num_heads)
                continue
            for depth in (1, 2, num_heads):
                tree = budget_tree(n, depth, topk=topk, num_heads=num_heads)
                assert tree.num_nodes == n
                tree.check_fits(topk=topk, num_heads=num_heads)
                if n == 0:
                    assert tree.depth == 0
                    continue
                wanted = min(depth, num_heads, n)
                fits = [d for d in range(wanted, num_heads + 1)
                        if sum(topk**j for j in range(1, d + 1)) >= n]
                assert tree.depth == fits[0]  # as asked, or the shallowest that holds n nodes


@pytest.mark.parametrize("engine", ["auto", "eager"])
def test_profile_latency_structure_and_json_round_trip(rt, tmp_path, engine):
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="hydra", num_heads=3, seed=0)
    extra = Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]])
    latency = profile_latency(
        model, heads, node_counts=(0, 1, 3, 6), depths=(1, 3), context_lengths=(8, 24),
        repeats=2, warmup=1, trees=[extra], topk=4, remeasure=0, engine=engine,
    )
    assert isinstance(latency, LatencyModel)
    # trees: 0 nodes once; 1 node once (chain == wide); 3 and 6 nodes wide and deep; + extra
    measured = {(n, d) for n, d, _ in latency.measurements}
    assert measured == {(0, 0), (1, 1), (3, 1), (3, 3), (6, 2), (6, 3), (4, 3)}
    assert len(latency.measurements) == 2 * 7  # every tree at both context lengths
    assert latency.nodes == (0, 1, 3, 4, 6)
    assert all(ms > 0 and math.isfinite(ms) for _, _, ms in latency.measurements)
    assert latency.autoregressive_ms > 0 and latency.prepare_ms > 0
    assert latency.fused_empty_ms is None  # Hydra's head 1 needs the next token: never fused
    assert latency.prepare_ms_by_depth == ()  # Hydra prepares head 1 whatever the depth
    hardware = latency.hardware
    for key in ("device", "device_name", "torch", "cpu_count", "dtype", "context_lengths"):
        assert key in hardware
    assert hardware["torch"] == torch.__version__ and hardware["dtype"] == "float32"
    assert set(hardware["autoregressive_ms_by_context"]) == {"8", "24"}
    assert "trimmed mean" in hardware["statistic"]
    # a Llama runs on the static engine unless eager is asked for; the file says which
    assert hardware["engine"] == ("static" if engine == "auto" else "eager")
    assert hardware["graphs"] is False  # no CUDA here
    assert hardware["booking"] and hardware["runtime_note"]
    path = latency.save(tmp_path / "latency.json")
    assert LatencyModel.load(path) == LatencyModel.from_json(json.loads(path.read_text()))
    assert LatencyModel.load(path).to_json() == latency.to_json()


@pytest.mark.parametrize("deadline", [None, 0.5, 100.0])
def test_a_deadline_cuts_the_rounds_to_two_and_skips_re_measuring(rt, deadline):
    """Every point gets the same rounds: all of them without a deadline or with room; two (the
    floor) when the deadline is near; the file says the deadline stopped it."""
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    latency = profile_latency(
        model, heads, node_counts=(0, 1, 3), depths=(1,), context_lengths=(8,), repeats=6,
        warmup=1, topk=4, remeasure=2, deadline=deadline, wall_clock=SteppingClock(1.0),
    )
    rounds = {p.rounds for p in latency.points}
    if deadline == 0.5:
        assert latency.hardware["stopped_by_deadline"] is True
        assert latency.hardware["repeats"] == 2 and rounds == {2}
        assert latency.hardware["remeasure_passes"] == 0
    else:
        assert "stopped_by_deadline" not in latency.hardware
        assert latency.hardware["repeats"] == 6 and rounds == {6}


def test_profile_latency_rejects_bad_options(rt):
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    with pytest.raises(EntmtpError, match="repeats"):
        profile_latency(model, heads, repeats=0)
    with pytest.raises(EntmtpError, match="positions"):
        profile_latency(model, heads, node_counts=(1,), context_lengths=(600,))
    with pytest.raises(EntmtpError, match="does not fit"):
        profile_latency(model, heads, node_counts=(200,), topk=3)


def test_trimmed_mean_cuts_the_same_count_at_each_end():
    rng = np.random.default_rng(0)
    for n in range(1, 30):
        times = list(rng.exponential(10.0, size=n))
        cut = int(0.1 * n)
        kept = sorted(times)[cut: n - cut]
        assert trimmed_mean(times) == pytest.approx(sum(kept) / len(kept))
    assert trimmed_mean([5.0] * 9 + [5000.0]) == pytest.approx(5.0)  # one stray pause is cut
    assert trimmed_mean([1.0, 2.0, 3.0], trim=0.0) == pytest.approx(2.0)
    with pytest.raises(EntmtpError, match="no timings"):
        trimmed_mean([])
    with pytest.raises(EntmtpError, match="trim"):
        trimmed_mean([1.0], trim=0.5)


def test_profile_latency_interleaves_trees_round_by_round(rt, monkeypatch):
    from entmtp.evaluation import _latency_profile

    stepped = []
    original = _latency_profile.SpeculativeDecoder.step

    def recording_step(self, state, plan, accept):
        stepped.append(id(plan))
        return original(self, state, plan, accept)

    monkeypatch.setattr(_latency_profile.SpeculativeDecoder, "step", recording_step)
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    profile_latency(model, heads, node_counts=(1, 3, 5), depths=(1,), context_lengths=(8, 16),
                    repeats=3, warmup=1, topk=3, remeasure=0, engine="eager")
    trees = len(set(stepped))
    assert trees == 3
    # (warmup + repeats) rounds; each times every tree once at both context lengths, in an
    # order of its own
    rounds = [stepped[i:i + 2 * trees] for i in range(0, len(stepped), 2 * trees)]
    assert len(rounds) == 1 + 3 and len(stepped) == (1 + 3) * 2 * trees
    assert all(sorted(r) == sorted(rounds[0]) and len(set(r)) == trees for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1


@pytest.mark.parametrize("shared", [True, False])
def test_eager_fused_empty_step_is_timed_each_round_for_fusable_heads(rt, monkeypatch, shared):
    from entmtp.evaluation import _latency_profile

    fused = []
    original = _latency_profile.SpeculativeDecoder.fused_empty_step

    def recording(self, state, plan, accept, max_depth):
        fused.append((state.past_len, state.pending, max_depth, plan.num_nodes))
        return original(self, state, plan, accept, max_depth)

    stepped = []
    original_step = _latency_profile.SpeculativeDecoder.step

    def recording_step(self, state, plan, accept):
        stepped.append((state.past_len, state.cache.get_seq_length()))
        return original_step(self, state, plan, accept)

    monkeypatch.setattr(_latency_profile.SpeculativeDecoder, "fused_empty_step", recording)
    monkeypatch.setattr(_latency_profile.SpeculativeDecoder, "step", recording_step)
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0, shared_lm_head=shared)
    latency = profile_latency(model, heads, node_counts=(0, 2), depths=(2,),
                              context_lengths=(8, 16), repeats=3, warmup=1, topk=3, remeasure=0,
                              engine="eager")
    # Medusa heads prepare one row per level: prepare is timed for each draft depth 1..2
    assert len(latency.prepare_ms_by_depth) == 2
    assert latency.prepare_ms == latency.prepare_ms_by_depth[-1] > 0
    if not shared:
        assert fused == [] and latency.fused_empty_ms is None
        assert latency.fused_empty_ms_by_depth == ()
        return
    assert latency.fused_empty_ms > 0 and math.isfinite(latency.fused_empty_ms)
    assert latency.fused_empty_ms == latency.fused_empty_ms_by_depth[-1]
    assert len(latency.fused_empty_ms_by_depth) == 2
    assert "fused_empty_ms_by_depth" in latency.to_json()  # the list alone holds the deepest
    # one per draft depth per round ((warmup + repeats) at each context), always from the
    # restored state
    # (contexts interleaved: each round runs both contexts)
    assert len(fused) == 2 * 2 * (1 + 3)
    assert len(set(fused)) == 4 and {f[0] for f in fused} == {8, 16}
    assert all(sorted(f[0] for f in fused[i:i + 4]) == [8, 8, 16, 16] for i in range(0, 16, 4))
    assert {(f[2], f[3]) for f in fused} == {(1, 0), (2, 0)}
    # every timed tree step after it saw the restored cache
    assert all(past == cached for past, cached in stepped)
    assert all(sorted(s[0] for s in stepped[i:i + 4]) == [8, 8, 16, 16]
               for i in range(0, 16, 4)) and len(stepped) == 16


def _tree_list(script):
    return script.trees


class _ScriptedTimes:
    """Replaces the profiler's timed step: ``durations(key, call)`` gives the ms of the
    ``call``-th step of ``key``; records how often each key was timed."""

    def __init__(self, durations):
        self.durations = durations
        self.calls: dict[tuple, int] = {}

    def __call__(self, timer, key):
        self.trees = timer.trees
        count = self.calls.get(key, 0)
        self.calls[key] = count + 1
        return float(self.durations(timer, key, count))


def _steady(timer, key, call):
    """A quiet machine: the empty-tree step 10 ms, +1 ms per node and 0.5 per level; AR 9.8; a
    fused empty step 10.5; prepare 1; a small deterministic wobble."""
    step, index, context = key
    wobble = 0.05 * ((call * 7 + index * 3 + context) % 5)
    base = {"autoregressive": 9.8, "prepare": 1.0, "fused_empty": 10.5}.get(step)
    if base is None:
        tree = timer.trees[index]
        base = 10.0 + tree.num_nodes + 0.5 * tree.depth
    return base + wobble


def _scripted_profile(rt, monkeypatch, durations, *, remeasure=2, engine="auto"):
    from entmtp.evaluation import _latency_profile

    script = _ScriptedTimes(durations)
    monkeypatch.setattr(_latency_profile._StepTimer, "time", lambda timer, key: script(timer, key))
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0, shared_lm_head=True)
    latency = profile_latency(model, heads, node_counts=(0, 2, 4), depths=(1, 2),
                              context_lengths=(8, 16), repeats=6, warmup=1, topk=3,
                              remeasure=remeasure, engine=engine)
    return latency, script


@pytest.mark.parametrize("engine", ["static", "eager"])
def test_a_quiet_measurement_passes_the_checks_with_its_spread(rt, monkeypatch, engine):
    latency, script = _scripted_profile(rt, monkeypatch, _steady, engine=engine)
    assert latency.findings() == [] and latency.warnings == []
    assert latency.hardware["remeasure_passes"] == 0
    assert set(script.calls.values()) == {1 + 6}  # one pass: warm-up + repeats
    kinds = {p.step for p in latency.points}
    if engine == "eager":
        assert kinds == {"tree", "autoregressive", "prepare", "fused_empty"}
    else:  # fusing heads on the static engine: every step prepares the next, none before
        assert kinds == {"tree", "autoregressive", "fused_empty"}
        assert latency.prepare_ms == 0 and latency.prepare_ms_by_depth == (0.0, 0.0)
    assert all(p.rounds == 6 and p.iqr_ms >= 0 for p in latency.points)
    assert {p.context for p in latency.points} == {8, 16}
    assert latency.noise_gain_bound() is not None and latency.noise_gain_bound() > 1.0


def test_a_failed_check_times_only_its_points_again(rt, monkeypatch):
    """A busy spell made the fused empty step look cheap on the first pass only: those points
    and the empty tree's are timed again, nothing else, and the model then passes."""
    def durations(timer, key, call):
        if key[0] == "fused_empty" and call < 1 + 6:
            return 3.0
        return _steady(timer, key, call)

    latency, script = _scripted_profile(rt, monkeypatch, durations)
    assert latency.warnings == []
    assert latency.hardware["remeasure_passes"] == 1
    again = {key for key, count in script.calls.items() if count > 1 + 6}
    empty_tree = next(i for i, tree in enumerate(_tree_list(script)) if tree.num_nodes == 0)
    assert again == {k for k in script.calls if k[0] == "fused_empty"
                     or (k[0] == "tree" and k[1] == empty_tree)}


def test_a_model_that_keeps_failing_is_remeasured_a_bounded_number_of_times(rt, monkeypatch):
    def durations(timer, key, call):
        return 3.0 if key[0] == "fused_empty" else _steady(timer, key, call)

    latency, script = _scripted_profile(rt, monkeypatch, durations, remeasure=2)
    assert latency.hardware["remeasure_passes"] == 2
    fused = [count for key, count in script.calls.items() if key[0] == "fused_empty"]
    assert set(fused) == {(1 + 6) + 2 * (1 + 6)}
    assert any("fused empty step" in w for w in latency.warnings)
    # the file carries the warning, and reading it back gives the same findings
    saved = LatencyModel.from_json(json.loads(json.dumps(latency.to_json())))
    assert latency.to_json()["warnings"] == latency.warnings == saved.warnings


def test_a_busy_machine_is_reported_too_noisy(rt, monkeypatch):
    rng = np.random.default_rng(0)
    latency, _ = _scripted_profile(rt, monkeypatch, lambda timer, key, call: rng.uniform(5, 200))
    assert any(w.startswith("too noisy") for w in latency.warnings)
    assert latency.hardware["remeasure_passes"] == 2


def _reference_problems(model: LatencyModel) -> list[str]:
    """The documented checks, written plainly from the stored points (the test's own reference
    implementation): what a model must not claim without a warning."""
    def error(points):
        if not points:
            return 0.0
        return math.sqrt(sum((p.iqr_ms / 1.349 / math.sqrt(p.rounds)) ** 2
                             for p in points)) / len(points)

    trees = {n: [p for p in model.points if p.step == "tree" and p.nodes == n
                 and not p.padded_to] for n in model.nodes}
    problems = []
    empty = model.verify_ms[0]
    ar_points = [p for p in model.points if p.step == "autoregressive"]
    tolerance = 3 * math.hypot(error(ar_points), error(trees[0]))
    if empty < model.autoregressive_ms - tolerance:
        problems.append("empty below AR")
    if empty > 1.15 * model.autoregressive_ms + tolerance:
        problems.append("empty far above AR")
    for depth, fused in enumerate(model.fused_empty_ms_by_depth, start=1):
        mine = [p for p in model.points if p.step == "fused_empty" and p.depth == depth]
        if fused < empty - 3 * math.hypot(error(mine), error(trees[0])):
            problems.append(f"fused {depth} below plain")
    # the step time at the width each count is verified at (padded_nodes) must not fall
    verified = {n: model.padding.get(n, n) for n in model.nodes}
    ms = {n: model.verify_ms[model.nodes.index(verified[n])] for n in model.nodes}
    for j, n in enumerate(model.nodes):
        for m in model.nodes[:j]:
            if ms[n] < ms[m] - 3 * math.hypot(error(trees[verified[n]]),
                                              error(trees[verified[m]])):
                problems.append(f"{m} -> {n} falls")
        if verified[n] != n and not ms[n] < model.verify_ms[j] - 3 * math.hypot(
                error(trees[n]), error(trees[verified[n]])):
            problems.append(f"{n} padded to {verified[n]} for no saving")
    spreads = sorted(p.iqr_ms / p.ms for p in model.points)
    if float(np.median(spreads)) > 0.25:
        problems.append("too noisy")
    return problems


def test_profiling_beside_a_cpu_hog_passes_the_checks_or_says_it_does_not(rt, tmp_path):
    """A process spinning on the CPU while the profiler runs: the written model either passes
    the checks (plain reference above) or carries warnings; never silent nonsense."""
    import subprocess
    import sys

    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0, shared_lm_head=True)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        latency = profile_latency(model, heads, node_counts=(0, 1, 3, 6), depths=(1, 2),
                                  context_lengths=(8, 24), repeats=6, warmup=1, topk=3)
    finally:
        hog.kill()
        hog.wait()
    written = LatencyModel.load(latency.save(tmp_path / "latency.json"))
    stored = json.loads((tmp_path / "latency.json").read_text())["warnings"]
    assert stored == written.warnings == latency.warnings
    assert written.points and all(p.rounds == 6 for p in written.points)
    problems = _reference_problems(written)
    if problems:
        assert stored, f"the model has {problems} but carries no warning"


# -- the static engine's own steps ----------------------------------------------------------------

def _record_static_runs(monkeypatch):
    """Records (engine, step, past length) of every ``StaticEngine.timed_run``."""
    from entmtp.runtime._static_step import StaticEngine

    runs = []
    original = StaticEngine.timed_run

    def recording(engine, step, past_len, clock=None):
        runs.append((engine, step, past_len))
        return original(engine, step, past_len, clock)

    monkeypatch.setattr(StaticEngine, "timed_run", recording)
    return runs


def _run_id(run) -> tuple[int, int]:
    return id(run[1]), run[2]


@pytest.mark.parametrize(("head_type", "shared"), [("medusa", True), ("medusa", False),
                                                   ("hydra", False)])
def test_the_static_profile_times_the_engines_own_step_objects(rt, monkeypatch, head_type,
                                                               shared):
    """Each round times, at each context, every measured tree's base-entropy step, the empty
    tree's plain step (autoregressive), and per draft depth the fused empty step (fusing heads)
    or the heads' preparation (other heads): the engine's step objects, nothing else."""
    from entmtp.evaluation import _latency_profile
    from entmtp.runtime._static_step import PrepareStep, TreeStep

    # real timings on a shared machine may show a dip: no padded rounds here (tested below)
    monkeypatch.setattr(_latency_profile, "with_padding", lambda model: model)
    runs = _record_static_runs(monkeypatch)
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type=head_type, num_heads=2, seed=0, shared_lm_head=shared)
    latency = profile_latency(model, heads, node_counts=(0, 2, 4), depths=(1, 2),
                              context_lengths=(8, 16), repeats=3, warmup=1, topk=3, remeasure=0)
    assert latency.hardware["engine"] == "static" and latency.hardware["window"] == "filled"
    engine = runs[0][0]
    assert all(run[0] is engine for run in runs)
    assert len(runs) % (1 + 3) == 0
    per_round = len(runs) // (1 + 3)
    rounds = [runs[i:i + per_round] for i in range(0, len(runs), per_round)]
    # every round the same steps, each once, in an order of its own
    assert all(sorted(map(_run_id, r)) == sorted(map(_run_id, rounds[0])) for r in rounds)
    assert len(set(map(_run_id, rounds[0]))) == per_round
    one_round = rounds[0]
    assert sorted(past for _, _, past in one_round) == [8] * (per_round // 2) + [16] * (
        per_round // 2)
    steps = [step for _, step, past in one_round if past == 8]
    trees = {(s.plan.num_nodes, s.plan.depth) for s in steps if isinstance(s, TreeStep)
             and not s.prepare_depth and s.base_entropy}
    assert trees == {(n, d) for n, d, _ in latency.measurements}
    plain = [s for s in steps if isinstance(s, TreeStep) and not s.base_entropy
             and not s.prepare_depth]
    assert len(plain) == 1 and plain[0].plan.num_nodes == 0  # the autoregressive step
    fused = [s for s in steps if isinstance(s, TreeStep) and s.fuse]
    prepares = [s for s in steps if isinstance(s, PrepareStep)]
    depths = [1, 2] if head_type == "medusa" else [2]
    if shared:
        assert sorted(s.prepare_depth for s in fused) == depths and prepares == []
        assert latency.prepare_ms_by_depth == (0.0, 0.0) and latency.prepare_ms == 0
        assert latency.fused_empty_ms == latency.fused_empty_ms_by_depth[-1] > 0
    else:
        assert fused == [] and sorted(s.max_depth for s in prepares) == depths
        assert latency.fused_empty_ms is None and latency.prepare_ms > 0
    assert len(steps) == len(trees) + 1 + len(depths)
    for step in steps:  # the steps decoding would run: the engine's cached objects
        if isinstance(step, TreeStep) and step.plan.num_nodes and not step.fuse:
            tree = next(t for t in engine._steps if engine._steps[t] is step)[0]
            assert engine.tree_step(tree, base_entropy=True) is step


def _fresh_outcome(model, heads, prompt, tree, *, topk, capacity):
    """A tree's base-entropy step on a new engine right after prefilling ``prompt``."""
    from entmtp.runtime._decode import SpeculativeDecoder

    engine = SpeculativeDecoder(model, heads, topk=topk).static_engine
    with torch.inference_mode():
        engine.reserve(capacity)
        engine.prefill(prompt)
        step = engine.tree_step(tree, base_entropy=True)
        engine.run(step, len(prompt))
        return step.out_ints[0].tolist(), step.out_floats[0].tolist()


@pytest.mark.parametrize(("graphs", "padded", "rows"), [
    (False, False, 1), (False, True, 1), (True, False, 1), (True, True, 1),
    (False, True, 3), (True, False, 3),
])
def test_static_profile_steps_run_from_their_context_and_leave_it_unchanged(rt, monkeypatch,
                                                                            graphs, padded, rows):
    """Every timed step leaves the engine's state buffers and cache as it found them, and a
    tree's outputs at each context equal those of a fresh engine prefilled with that context,
    round after round: the contexts share one cache without seeing each other's steps. With
    graphs (capture emulated on the CPU) every step is captured once, before any is timed
    (padded steps: before any padded one is). ``padded``: 2-node trees verified at 5 nodes give
    the unpadded outputs. ``rows``: batch steps, every row's outputs those of its own prompt."""
    from dataclasses import replace

    from entmtp.evaluation import _latency_profile
    from entmtp.runtime._static_step import StaticEngine

    # a fixed table (real timings on a shared machine may show any dip)
    monkeypatch.setattr(_latency_profile, "with_padding",
                        lambda model: replace(model, padded_nodes=((2, 5),) if padded else ()))

    captured, timing = [], []
    if graphs:
        original_init = StaticEngine.__init__

        def graph_engine(engine, *args, **kwargs):
            original_init(engine, *args, **{**kwargs, "window": "full"})
            engine.graphs = True  # as on CUDA

        class Replay:
            def __init__(self, step):
                self.step = step

            def replay(self):
                self.step.body(None)

        def capture(engine, step):
            is_padded = getattr(step, "width", 1) > getattr(getattr(step, "plan", None),
                                                            "size", 1)
            assert not timing or (is_padded and all(key[0] != "padded" for key in timing)), \
                "a step was captured while timing"
            captured.append(step)
            return Replay(step)

        monkeypatch.setattr(StaticEngine, "__init__", graph_engine)
        monkeypatch.setattr(StaticEngine, "_capture", capture)

    outputs: dict[tuple, list] = {}
    original_time = _latency_profile._StaticSteps.time

    measured_trees, timer_steps = [], []

    def checked_time(timer, key):
        measured_trees[:] = timer.trees
        steps = timer.steps
        timer_steps[:] = [steps]
        engine = steps.engine
        cache = engine.cache.clone()
        timing.append(key)
        elapsed = original_time(steps, key)
        assert torch.equal(engine.cache, cache)
        assert all(torch.equal(a, b) for a, b in zip(engine.state_tensors(),
                                                     steps.states[key[2]], strict=True))
        step = steps.step(key)
        if key[0] in ("tree", "padded"):
            outputs.setdefault(key, []).append((step.out_ints.tolist(),
                                                step.out_floats.tolist()))
        return elapsed

    monkeypatch.setattr(_latency_profile._StepTimer, "time",
                        lambda timer, key: checked_time(timer, key))
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="hydra", num_heads=2, seed=0)
    contexts, seed, topk = (8, 16), 3, 3
    latency = profile_latency(model, heads, node_counts=(0, 2, 5), depths=(2,),
                              context_lengths=contexts, repeats=2, warmup=1, topk=topk,
                              remeasure=0, seed=seed, batch_size=rows)
    assert latency.hardware["graphs"] is graphs
    assert latency.hardware["batch_size"] == rows == timer_steps[0].engine.rows
    if graphs:
        timed = {id(timer_steps[0].step(key)) for key in timing}
        assert len(captured) == len({id(s) for s in captured})  # each step once
        assert timed <= {id(s) for s in captured} and len(timed) == 3 + 1 + 1 + padded
    timing.clear()  # the reference engines below capture as they go
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = torch.randint(0, vocab, (max(contexts),) if rows == 1 else (rows, max(contexts)),
                            generator=torch.Generator().manual_seed(seed)).reshape(rows, -1)
    trees = {}
    assert any(key[0] == "padded" for key in outputs) == padded
    for (_, index, length), seen in outputs.items():
        for ints, floats in seen:  # the same step from the same state, round after round
            assert ints == seen[0][0]
            for row_floats, first_floats in zip(floats, seen[0][1], strict=True):
                assert row_floats == pytest.approx(first_floats, nan_ok=True)
        tree = trees[index] = measured_trees[index]
        assert len(seen[0][0]) == rows
        for row in range(rows):
            want = _fresh_outcome(model, heads, prompts[row, :length], tree, topk=topk,
                                  capacity=latency.hardware["cache_capacity"])
            assert seen[0][0][row] == want[0]
            # the prefill of a longer prompt rounds its first tokens' keys a little differently
            assert seen[0][1][row] == pytest.approx(want[1], rel=1e-4, nan_ok=True)
    assert len(trees) == 3


def test_a_model_the_static_engine_cannot_run_is_profiled_on_the_eager_steps(rt):
    """auto falls back to the eager runtime exactly where greedy decoding does, and says why."""
    model = rt.sharp_llama(6)
    model.model.rotary_emb.rope_type = "dynamic"  # inv_freq would change with the length
    heads = new_heads(model, head_type="medusa", num_heads=2, seed=0)
    latency = profile_latency(model, heads, node_counts=(0, 2), depths=(2,),
                              context_lengths=(8,), repeats=1, warmup=0, topk=3, remeasure=0)
    hardware = latency.hardware
    assert hardware["engine"] == "eager" and hardware["graphs"] is False
    assert "eager runtime" in hardware["runtime_note"] and "dynamic" in hardware["runtime_note"]
    assert latency.prepare_ms > 0  # the eager runtime prepares before a draft-entropy choice
    with pytest.raises(EntmtpError, match="engine='static'"):
        profile_latency(model, heads, node_counts=(0,), context_lengths=(8,), engine="static")
    with pytest.raises(EntmtpError, match="batched steps run on the static runtime only"):
        profile_latency(model, heads, node_counts=(0,), context_lengths=(8,), batch_size=2)


def test_a_dip_in_the_static_curve_is_padded_and_the_padded_steps_are_timed(rt, monkeypatch):
    """2-node trees cost more than 4-node ones beyond noise: the model verifies 1-3 nodes at
    4, passes the monotonicity check on that effective curve (no re-measurement for it), and
    keeps the timed padded steps as points the check holds against their price."""
    def durations(timer, key, call):
        step, index, _ = key
        if step == "tree" and timer.trees[index].num_nodes == 2:
            return 30.0 + 0.05 * (call % 3)
        return _steady(timer, key, call)

    latency, script = _scripted_profile(rt, monkeypatch, durations)
    assert latency.padding == {1: 4, 2: 4, 3: 4}
    assert latency.warnings == [] and latency.hardware["remeasure_passes"] == 0
    assert latency.step_ms(2, 1) == pytest.approx(latency.step_ms(4, 1))
    padded_points = [p for p in latency.points if p.padded_to]
    assert {(p.nodes, p.padded_to) for p in padded_points} == {(2, 4)}
    assert {p.context for p in padded_points} == {8, 16}
    assert all(count == 1 + 6 for key, count in script.calls.items() if key[0] == "padded")
    # the raw curve and its knots come from unpadded steps only
    assert latency.verify_ms[latency.nodes.index(2)] > 29
    saved = LatencyModel.from_json(json.loads(json.dumps(latency.to_json())))
    assert saved == latency and saved.padding == {1: 4, 2: 4, 3: 4}

    def dear(timer, key, call):  # padded steps that do not deliver the cheaper width's time
        return 40.0 if key[0] == "padded" else durations(timer, key, call)

    latency, _ = _scripted_profile(rt, monkeypatch, dear)
    assert any("padded step costs more than the step it is priced at" in w
               for w in latency.warnings)
    # the eager runtime never pads: its model keeps the dip, and says so
    eager, _ = _scripted_profile(rt, monkeypatch, durations, engine="eager")
    assert eager.padding == {} and not any(p.padded_to for p in eager.points)
    assert any("falls as the tree grows" in w for w in eager.warnings)


def test_a_drift_before_the_padded_rounds_is_not_read_as_a_dear_padded_step(rt, monkeypatch):
    """The machine slows by 3 ms once the padded steps are timed: the steps they are priced at
    are timed again in the same rounds, so the padded steps cost what their price says."""
    drifted = [False]

    def durations(timer, key, call):
        drifted[0] = drifted[0] or key[0] == "padded"
        step, index, _ = key
        if step == "tree" and timer.trees[index].num_nodes == 2:
            return 30.0 + 0.05 * (call % 3)
        if step == "padded":  # the 4-node step's work at its own depth
            return 14.0 + 0.5 * timer.trees[index].depth + 0.05 * (call % 3) + 3.0
        late = drifted[0] and step == "tree" and timer.trees[index].num_nodes == 4
        return _steady(timer, key, call) + (3.0 if late else 0.0)

    latency, script = _scripted_profile(rt, monkeypatch, durations)
    assert latency.padding == {1: 4, 2: 4, 3: 4}
    assert latency.warnings == [], latency.warnings
    four = [key for key in script.calls
            if key[0] == "tree" and script.trees[key[1]].num_nodes == 4]
    assert four and all(script.calls[key] == 2 * (1 + 6) for key in four)


def test_a_padded_step_is_held_against_the_measured_step_of_its_width(rt, monkeypatch):
    """A padded step is compared with the unpadded step of its width and depth measured at the
    same contexts, not with the model's fitted price: when both cost 1.5 ms more than the fit
    says (a depth term that is not linear), padding delivered that width's time; when only the
    padded step does, it did not."""
    def durations(timer, key, call):
        step, index, _ = key
        if step == "tree" and timer.trees[index].num_nodes == 2:
            return 30.0 + 0.05 * (call % 3)
        if step == "padded":  # the 4-node step's work
            return 14.0 + 0.5 * timer.trees[index].depth + 0.05 * (call % 3)
        return _steady(timer, key, call)

    latency, _ = _scripted_profile(rt, monkeypatch, durations)
    padded = {(p.nodes, p.depth) for p in latency.points if p.padded_to == 4}
    widths = {p.depth for p in latency.points if p.step == "tree" and p.nodes == 4
              and not p.padded_to}
    depth = next(d for n, d in sorted(padded) if d in widths)

    def dearer(model, *, unpadded: bool):
        points = tuple(
            replace(p, ms=p.ms + 1.5) if p.step == "tree" and p.depth == depth and (
                p.padded_to == 4 or (unpadded and p.nodes == 4 and not p.padded_to)) else p
            for p in model.points)
        return replace(model, points=points)

    both = [f.message for f in dearer(latency, unpadded=True).findings()]
    assert not any("padded step" in m for m in both), both
    alone = [f.message for f in dearer(latency, unpadded=False).findings()]
    assert any("padded step" in m and "the 4-node step" in m for m in alone), alone


def test_the_padded_steps_timed_are_the_runtimes_own(rt, monkeypatch):
    """With a table, the profiler times each padded tree with the engine's ``TreeStep`` at the
    padded width: the step a decoder given that table builds for the tree."""
    from dataclasses import replace

    from entmtp.evaluation import _latency_profile
    from entmtp.runtime._decode import SpeculativeDecoder
    from entmtp.runtime._static_step import TreeStep

    monkeypatch.setattr(_latency_profile, "with_padding",
                        lambda model: replace(model, padded_nodes=((2, 4),)))
    runs = _record_static_runs(monkeypatch)
    model = rt.sharp_llama(6)
    heads = new_heads(model, head_type="hydra", num_heads=2, seed=0)
    latency = profile_latency(model, heads, node_counts=(0, 2, 4), depths=(1, 2),
                              context_lengths=(8, 16), repeats=3, warmup=1, topk=3, remeasure=0)
    padded = {(s.plan.num_nodes, s.plan.depth, s.width) for _, s, _ in runs
              if isinstance(s, TreeStep) and s.width > s.plan.size}
    assert padded == {(2, 1, 5), (2, 2, 5)}
    assert {(p.nodes, p.depth, p.padded_to) for p in latency.points if p.padded_to} == \
        {(2, 1, 4), (2, 2, 4)}
    decoder = SpeculativeDecoder(model, heads, topk=3, padded_nodes=latency.padding)
    for _, step, _ in runs:
        if isinstance(step, TreeStep) and step.width > step.plan.size:
            tree = next(t for t in step.engine._steps if step.engine._steps[t] is step)[0]
            mine = decoder.static_engine.tree_step(tree, base_entropy=True)
            assert (type(mine), mine.width, mine.name) == (type(step), step.width, step.name)
