"""Device check of the static-shape runtime: CUDA graphs capture, replay and decode what the
eager runtime decodes; capture time and memory; per-step ms of both runtimes side by side.

    python bench/gpu_static_check.py [--device cuda] [--dtype fp32] [--new-tokens 64]
                                     [--rounds 3] [--prompts 3] [--out DIR] [--tiny]
                                     [--budget-s S]
    python bench/gpu_static_check.py --device cpu --tiny --rounds 1   # checks the script only

The model is the default model's architecture (SmolLM2-135M: the sizes below are its config)
with random weights and random heads built on the device, so no file travels; latency depends on
the architecture, dtype and device, not on the weights. For each arm (autoregressive; Medusa and
Hydra heads with a 4-chain, mc_sim_7b_63 and a 128-node tree; a draft-entropy schedule switching
between a deep tree and the empty tree, which runs the prepare and fused steps) it decodes the
same prompts with the eager runtime, the static one without graphs and the static one with
graphs, and checks: graphs == no graphs exactly (the same kernels), and static == eager or, where
not, the first departure and its top-two logit margin (random weights have near-ties). Then it
times eager vs graphs in interleaved rounds (the engine that goes first alternates): median
per-step ms and their ratio. Departures are judged against plain greedy decoding in the same
dtype (evaluation/_departures.py: a near-tie of the top two logits, or not). The issue's targets
(``TARGETS``, judged by ``judge_targets``): the graph runtime's autoregressive step over the bare
captured forward of one token (at most 1.25x), and a 64-node tree's whole step over the bare
captured forward of its 65 tokens (drafting and bookkeeping at most 15% of it), both over the
same static cache; and autoregressive tokens/s with graphs at least 4x the eager runtime's (an
autoregressive step makes one token, so that is eager step ms over graph step ms). The step and
the bare forward are timed by the host clock (the step as decoding runs it, launch to readback)
and on CUDA also between two CUDA events around the replay (``StaticEngine.timed_run``): for a
~1 ms step the host's launch and readback overhead alone could decide a ratio, so the step /
bare forward targets judge the CUDA-event ratio where there is one, and each verdict names the
clock it judged. A capture that fails is reported (the step then runs without graphs) and never
ends the run. Last, the
bare forward of 1, 17, 65 and 129 tokens with each way of reading grouped key/value heads
(``StaticLlama.grouped_kv``), captured, in interleaved rounds: the runtime's way against the
others on this device. Writes ``static_check.json`` under ``--out`` (default ``$OUT`` or the
working directory) after every arm, so a run stopped early keeps the arms it finished;
``--budget-s`` skips the arms that would not finish in time (the targets' arms come first). Any
figure comes from the machine it ran on; none is written here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from entmtp.core import DTYPE_ALIASES, HEAD_TYPES, atomic_write_text, device_name
from entmtp.evaluation import budget_tree, check_departure, run_record
from entmtp.model import GROUPED_KV_WAYS, StaticLlama, new_heads, resolve_dtype
from entmtp.runtime import (
    BundleScheduler,
    SpeculativeDecoder,
    StaticScheduler,
    autoregressive_engine,
    autoregressive_generate,
)
from entmtp.treesearch import DRAFT_ENTROPY, EntropyEstimator, Schedule, Tree, reference_tree

# SmolLM2-135M-Instruct's config (its config.json).
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
               rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
TOPK = 10


def synced_ms() -> float:
    """Host ms now, after the queued device work (earlier work stays out of a timed run)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() * 1000.0


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__


def build(device: str, dtype: torch.dtype, tiny: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**(TINY if tiny else SMOLLM2))
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(dtype).eval()
    heads = {}
    for index, head_type in enumerate(HEAD_TYPES):
        made = new_heads(model, head_type=head_type, num_heads=4, seed=index)
        generator = torch.Generator(device="cpu").manual_seed(10 + index)
        with torch.no_grad():
            for parameter in made.parameters():
                noise = torch.randn(parameter.shape, generator=generator) * 0.05
                parameter.add_(noise.to(parameter.device, parameter.dtype))
        heads[head_type] = made.to(device=device, dtype=dtype)
    return model, heads


def arms(heads):
    """The arms, most needed first (a run that is out of time keeps those): the targets'
    (autoregressive, 64 nodes), the draft-entropy schedules (prepare and fused steps), then the
    other trees."""
    chain = Tree.from_paths([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    mc = reference_tree("mc_sim_7b_63")
    big = budget_tree(128, 4, topk=TOPK, num_heads=4)
    sixty_four = budget_tree(64, 4, topk=TOPK, num_heads=4)
    deep = budget_tree(32, 4, topk=TOPK, num_heads=4)
    switching = Schedule((deep, Tree.from_paths([])), (1e9,), EntropyEstimator.last(),
                         DRAFT_ENTROPY)
    out = [("autoregressive", None, None)]
    out += [(f"{t} 64 nodes", heads[t], StaticScheduler(sixty_four)) for t in HEAD_TYPES]
    out += [(f"{t} draft-entropy", heads[t], switching) for t in HEAD_TYPES]
    for name, tree in (("mc_sim_7b_63", mc), ("chain4", chain), ("128 nodes", big)):
        out += [(f"{t} {name}", heads[t], StaticScheduler(tree)) for t in HEAD_TYPES]
    return out


def split_at_median(model, heads, schedule: Schedule, prompts, new_tokens) -> Schedule:
    """``schedule`` (threshold above every entropy: the first tree always) with its threshold
    at the median draft entropy of an eager run, so that both trees serve steps."""
    decoder = SpeculativeDecoder(model, heads, topk=TOPK, engine="eager")
    estimates = [s.entropy_estimate for p in prompts
                 for s in decoder.generate(p, BundleScheduler(schedule),
                                           max_new_tokens=new_tokens).step_log]
    return Schedule(schedule.trees, (statistics.median(estimates),), schedule.estimator,
                    schedule.signal)


class Runner:
    """One runtime for one arm, built once (its graphs are captured once, before decoding)."""

    def __init__(self, model, heads, scheduler, engine, graphs, prompts, new_tokens):
        self.model, self.heads, self.scheduler = model, heads, scheduler
        self.engine, self.graphs = engine, graphs
        self.prompts, self.new_tokens = prompts, new_tokens
        max_context = max(len(p) for p in prompts) + new_tokens
        if heads is None:
            self.static = autoregressive_engine(model, graphs=graphs) \
                if engine == "static" else None
            if self.static is not None:
                self.static.warm_up(StaticScheduler(Tree.from_paths([])), max_context)
        else:
            self.decoder = SpeculativeDecoder(model, heads, topk=TOPK, engine=engine,
                                              graphs=graphs)
            self.decoder.warm_up(self.make(), max_context=max_context)
            self.static = self.decoder.static_engine

    def make(self):
        s = self.scheduler
        return BundleScheduler(s) if isinstance(s, Schedule) else s

    def __call__(self):
        if self.heads is None:
            return [autoregressive_generate(self.model, p, max_new_tokens=self.new_tokens,
                                            engine=self.engine, graphs=self.graphs)
                    for p in self.prompts]
        return [self.decoder.generate(p, self.make(), max_new_tokens=self.new_tokens)
                for p in self.prompts]


class BareForward:
    """The floor a step is measured against: the model's forward of ``q`` tokens over a static
    cache of ``capacity`` slots (attention over the whole cache under a mask, as the graph
    runtime's steps), logits included, captured as one CUDA graph on CUDA. No drafting,
    acceptance, compaction or readback. A capture that fails leaves it eager, with the first
    error line in ``capture_error`` (a ratio to it then means nothing)."""

    def __init__(self, model, q: int, capacity: int, graphs: bool,
                 grouped_kv: str | None = None) -> None:
        net = StaticLlama(model)
        net.grouped_kv = grouped_kv  # None: the runtime's choice
        device = net.device
        past = max(capacity // 2 - q, 0)
        self.cache = net.new_cache(capacity)
        self.tokens = torch.ones(q, dtype=torch.int64, device=device)
        self.positions = torch.arange(past, past + q, device=device)
        mask = torch.zeros(q, capacity, dtype=torch.bool, device=device)
        mask[:, :past] = True
        mask[:, past:past + q] = torch.ones(q, q, dtype=torch.bool, device=device).tril()
        self.mask = mask

        def forward() -> torch.Tensor:
            hidden = net.backbone(self.cache, self.tokens, self.positions, self.positions,
                                  self.mask, None)
            return net.logits(hidden)

        self.run = forward
        self.capture_error: str | None = None
        if graphs:
            try:
                self.run = self._captured(forward, device)
            except Exception as error:  # the check goes on; the row says why
                self.capture_error = first_line(error)
                torch.cuda.synchronize(device)
                print(f"CUDA graph capture of the bare forward of {q} tokens failed: "
                      f"{self.capture_error}; it runs without graphs")

    @staticmethod
    def _captured(forward, device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(2):
                forward()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            forward()
        return graph.replay

    def ms(self, repeats: int) -> float:
        """Median wall ms of one forward over ``repeats`` timed ones (each synchronized)."""
        return self.timings(repeats)[0]

    @torch.inference_mode()
    def timings(self, repeats: int) -> tuple[float, float | None]:
        """Median ms of one forward over ``repeats`` timed ones by the host clock (each
        synchronized) and, on CUDA, between two CUDA events around it (else None)."""
        on_cuda = self.cache.device.type == "cuda"
        sync = torch.cuda.synchronize if on_cuda else (lambda: None)
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
            if on_cuda else None
        host, device = [], []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            if events is not None:
                events[0].record()
            self.run()
            if events is not None:
                events[1].record()
            sync()
            host.append((time.perf_counter() - start) * 1000.0)
            if events is not None:
                device.append(events[0].elapsed_time(events[1]))
        return statistics.median(host), statistics.median(device) if device else None


def step_timings(static, step, repeats: int) -> tuple[float, float | None]:
    """Median ms of ``repeats`` runs of ``step`` (after one untimed) from the engine's state
    (``StaticEngine.timed_run``, which restores it): launch to readback by the host clock, and
    on CUDA between the CUDA events around the replay (else None)."""
    past = int(static.past_len)
    runs = [static.timed_run(step, past, synced_ms) for _ in range(repeats + 1)][1:]
    device = [r.device_ms for r in runs if r.device_ms is not None]
    return (statistics.median(r.host_ms for r in runs),
            statistics.median(device) if device else None)


def grouped_kv_ways(model, capacity: int, graphs: bool, rounds: int,
                    queries=(1, 17, 65, 129)) -> list[dict]:
    """The bare forward of ``q`` tokens with each way of reading grouped key/value heads
    (``GROUPED_KV_WAYS``), in interleaved rounds (a fresh order each round): median ms of each
    and the ratio of the runtime's way to each other way, per ``q``."""
    default = StaticLlama(model).grouped_kv_way(batched=False)
    order = torch.Generator().manual_seed(0)
    rows = []
    for q in queries:
        forwards = {way: BareForward(model, q, capacity, graphs, grouped_kv=way)
                    for way in GROUPED_KV_WAYS}
        times: dict[str, list[float]] = {way: [] for way in GROUPED_KV_WAYS}
        for _ in range(rounds):
            for index in torch.randperm(len(GROUPED_KV_WAYS), generator=order).tolist():
                way = GROUPED_KV_WAYS[index]
                times[way].append(forwards[way].ms(10))
        ms = {way: statistics.median(times[way]) for way in GROUPED_KV_WAYS}
        rows.append({"q": q, "capacity": capacity, "default": default, "ms": ms,
                     "ratios": {f"{default}/{way}": ms[default] / ms[way]
                                for way in GROUPED_KV_WAYS if way != default}})
        print(f"grouped key/value heads, bare forward of {q:3d} tokens over {capacity} slots: "
              + ", ".join(f"{way} {ms[way]:.2f} ms" for way in GROUPED_KV_WAYS))
        del forwards
    return rows


def plain_outputs(model, prompts, new_tokens) -> list[list[int]]:
    """Plain greedy decoding in the model's dtype: transformers' forward, one token per step."""
    return [autoregressive_generate(model, p, max_new_tokens=new_tokens, engine="eager").tokens
            for p in prompts]


def step_ms(results) -> float:
    return statistics.fmean(r.decode_ms / max(r.steps, 1) for r in results)


HOST, EVENTS = "host clock", "CUDA events"


@dataclass(frozen=True)
class StepTarget:
    """One target for an arm's row: its ``key`` (``event_key`` where the row has that
    measured) at most or at least ``bound``."""

    arm: str
    key: str  # the row's field it checks: the host clock's figure
    bound: float
    at_most: bool  # True: value <= bound; False: value >= bound
    what: str
    event_key: str | None = None  # the same figure by CUDA events, judged instead when measured

    def judged(self, row: dict) -> tuple[str, str]:
        """The row's field this target judges and its clock: ``event_key`` where it holds a
        finite value, else ``key``."""
        value = row.get(self.event_key) if self.event_key is not None else None
        if value is not None and math.isfinite(value):
            return self.event_key, EVENTS
        return self.key, HOST

    def passes(self, value: float | None) -> bool | None:
        """PASS / MISS; None when the value was not measured."""
        if value is None or not math.isfinite(value):
            return None
        return value <= self.bound if self.at_most else value >= self.bound


STEP_EVENTS = "step_over_bare_forward_events"
TARGETS = (
    StepTarget("autoregressive", "step_over_bare_forward", 1.25, True,
               "graph step / bare captured forward", STEP_EVENTS),
    StepTarget("medusa 64 nodes", "step_over_bare_forward", 1.15, True,
               "graph step / bare captured forward", STEP_EVENTS),
    StepTarget("hydra 64 nodes", "step_over_bare_forward", 1.15, True,
               "graph step / bare captured forward", STEP_EVENTS),
    StepTarget("autoregressive", "speedup", 4.0, False,
               "tokens/s with graphs / eager (eager step ms / graph step ms)"),
)


def judge_targets(rows: Sequence[dict]) -> dict[str, dict[str, dict]]:
    """By arm, then by the target's field (``key``): the value judged, the field it came from
    and its clock (the CUDA-event figure where measured, else the host clock's), the bound and
    PASS / MISS (None: not measured), for the arms among ``rows`` that have targets."""
    by_arm = {row["arm"]: row for row in rows}
    judged: dict[str, dict[str, dict]] = {}
    for target in TARGETS:
        if target.arm not in by_arm:
            continue
        row = by_arm[target.arm]
        field, clock = target.judged(row)
        value = row.get(field)
        judged.setdefault(target.arm, {})[target.key] = {
            "value": value, "at_most" if target.at_most else "at_least": target.bound,
            "what": target.what, "judged": field, "clock": clock,
            "pass": target.passes(value)}
    return judged


def target_lines(judged: dict[str, dict[str, dict]]) -> list[str]:
    """One line per judged target: what, value, bound and PASS / MISS / n/a."""
    lines = []
    for arm, by_key in judged.items():
        for verdict in by_key.values():
            bound = (f"at most {verdict['at_most']}" if "at_most" in verdict
                     else f"at least {verdict['at_least']}")
            value = "-" if verdict["value"] is None else f"{verdict['value']:.3f}"
            shown = {True: "PASS", False: "MISS", None: "n/a"}[verdict["pass"]]
            clock = f" by {EVENTS}" if verdict.get("clock") == EVENTS else ""
            lines.append(f"target {arm}: {verdict['what']}{clock} {value} ({bound}) {shown}")
    return lines


def write_report(report: dict, out: Path) -> None:
    """``static_check.json`` under ``out`` with the targets of the arms so far (temp file, then
    rename: a run stopped mid-write leaves the previous report)."""
    report["targets"] = judge_targets(report["arms"])
    atomic_write_text(out / "static_check.json", json.dumps(report, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_ALIASES))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a tiny model: checks the script")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="seconds the run may take (0: no limit): an arm that would end "
                             "past them, judged by the longest arm so far, is skipped")
    args = parser.parse_args()
    started = time.perf_counter()

    model, heads = build(args.device, resolve_dtype(args.dtype), args.tiny)
    vocab = model.config.vocab_size
    prompts = [[1 + (7 * i + 13 * j) % (vocab - 1) for j in range(12 + 5 * i)]
               for i in range(args.prompts)]
    device = device_name(args.device)
    print(f"device {device}, torch {torch.__version__}, dtype {args.dtype}, "
          f"{'tiny' if args.tiny else 'SmolLM2-135M architecture'}, random weights; "
          f"{len(prompts)} prompts x {args.new_tokens} new tokens")
    report = {**run_record(model, model="tiny" if args.tiny
                           else "SmolLM2-135M architecture, random weights",
                           new_tokens=args.new_tokens, prompts=len(prompts), rounds=args.rounds),
              "arms": []}
    plain_greedy = plain_outputs(model, prompts, args.new_tokens)
    out = Path(args.out)
    longest = 0.0
    report["skipped_arms"] = []
    for name, arm_heads, scheduler in arms(heads):
        arm_start = time.perf_counter()
        if args.budget_s and arm_start - started + longest > args.budget_s:
            report["skipped_arms"].append(name)
            print(f"{name}: skipped (the budget of {args.budget_s:.0f} s would be exceeded)")
            continue
        if isinstance(scheduler, Schedule):
            scheduler = split_at_median(model, arm_heads, scheduler, prompts, args.new_tokens)
        runners = {(engine, graphs): Runner(model, arm_heads, scheduler, engine, graphs, prompts,
                                            args.new_tokens)
                   for engine, graphs in (("eager", False), ("static", False), ("static", True))}
        eager = runners["eager", False]()
        plain = runners["static", False]()
        graphed = runners["static", True]()
        same_as_plain = all(g.tokens == p.tokens and g.accept_lengths == p.accept_lengths
                            for g, p in zip(graphed, plain, strict=True))
        departures = [check_departure(model, prompt, g.tokens, want)
                      for prompt, g, want in zip(prompts, graphed, plain_greedy, strict=True)]
        graphed_engine = runners["static", True].static
        captures = [
            {"step": c.step, "capture_ms": c.capture_ms, "memory_bytes": c.memory_bytes}
            for c in graphed_engine.capture_log]
        timings = {"eager": [], "static": []}
        for round_index in range(args.rounds):
            order = ("eager", "static") if round_index % 2 == 0 else ("static", "eager")
            for engine in order:
                results = runners[engine, engine == "static"]()
                timings[engine].append(step_ms(results))
        row = {
            "arm": name,
            "graphs_equal_no_graphs": same_as_plain,
            "static_equals_eager": all(g.tokens == e.tokens
                                       for g, e in zip(graphed, eager, strict=True)),
            "equals_plain_greedy": sum(d is None for d in departures),
            "departures": [d.to_dict() for d in departures if d is not None],
            "departures_all_near_ties": all(d.near_tie for d in departures if d is not None),
            "mean_accept_length": statistics.fmean(r.mean_accept_length for r in graphed),
            "trees_used": sorted({s.tree_index for r in graphed for s in r.step_log}),
            "captures": captures,
            "graph_memory_bytes": graphed_engine.graph_memory_bytes,  # the engine's graph pool
            "capture_failures": [{"step": f.step, "error": f.error}
                                 for f in graphed_engine.capture_failures],
            "eager_step_ms": statistics.median(timings["eager"]),
            "static_graph_step_ms": statistics.median(timings["static"]),
        }
        row["speedup"] = row["eager_step_ms"] / row["static_graph_step_ms"]
        static = graphed_engine
        tree = None if arm_heads is None else runners["static", True].make().trees[0]
        q = 1 if tree is None else tree.num_nodes + 1
        if tree is None or name.endswith("64 nodes"):
            repeats = max(20, 10 * args.rounds)
            bare = BareForward(model, q, static.capacity, graphs=static.graphs)
            row["bare_forward_q"] = q
            row["bare_forward_ms"], row["bare_forward_event_ms"] = bare.timings(repeats)
            row["bare_forward_capture_error"] = bare.capture_error
            step = static.tree_step(Tree.from_paths([]) if tree is None else tree)
            row["graph_step_timed_ms"], row["graph_step_event_ms"] = step_timings(static, step,
                                                                                  repeats)
            # against an uncaptured forward a ratio means nothing: not measured
            captured = bare.capture_error is None
            row["step_over_bare_forward"] = (row["static_graph_step_ms"] / row["bare_forward_ms"]
                                             if captured else None)
            row[STEP_EVENTS] = (row["graph_step_event_ms"] / row["bare_forward_event_ms"]
                                if captured and row["graph_step_event_ms"] is not None
                                and row["bare_forward_event_ms"] else None)
            shown = {key: "-" if row[key] is None else f"{row[key]:.3f}"
                     for key in ("step_over_bare_forward", STEP_EVENTS)}
            print(f"{'':26s} bare forward of {q} tokens over {static.capacity} slots "
                  f"{row['bare_forward_ms']:.2f} ms: step / bare {shown['step_over_bare_forward']}"
                  f" by the host clock, {shown[STEP_EVENTS]} by {EVENTS}")
        report["arms"].append(row)
        longest = max(longest, time.perf_counter() - arm_start)
        write_report(report, out)  # after every arm: a run stopped later keeps these
        print(f"{name:26s} graphs==plain {same_as_plain!s:5s} static==eager "
              f"{row['static_equals_eager']!s:5s} eager {row['eager_step_ms']:8.2f} ms "
              f"graphs {row['static_graph_step_ms']:8.2f} ms  x{row['speedup']:.2f}  "
              f"captures {len(captures)} "
              f"({sum(c['capture_ms'] for c in captures):.0f} ms, "
              f"{row['graph_memory_bytes'] / 2**20:.0f} MiB pool)"
              + (f", {len(row['capture_failures'])} failed" if row["capture_failures"] else ""))
    ways_capacity = max(len(p) for p in prompts) + args.new_tokens + 160
    if args.budget_s and time.perf_counter() - started + longest > args.budget_s:
        print("grouped key/value ways: skipped (the budget would be exceeded)")
    else:
        report["grouped_kv_ways"] = grouped_kv_ways(model, ways_capacity,
                                                    graphs=args.device.startswith("cuda"),
                                                    rounds=max(3, args.rounds))
    write_report(report, out)
    for line in target_lines(report["targets"]):
        print(line)
    if not all(row["graphs_equal_no_graphs"] for row in report["arms"]):
        raise SystemExit("graph replay decoded differently from the same steps without graphs")


if __name__ == "__main__":
    main()
