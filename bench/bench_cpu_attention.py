"""Grouped-query attention on the CPU, the three ways of ``StaticLlama.grouped_kv`` (query heads
folded into rows, SDPA's own grouped heads, keys and values repeated per query head) side by side
per step of the static runtime.

    .venv/bin/python bench/bench_cpu_attention.py [--head-type hydra] [--nodes 0 1 4 8 16 64]
        [--contexts 128 256 384] [--rounds 12] [--threads 2] [--dtype fp32|bf16]
        [--draft-vocab-size 8192] [--batch 0] [--json out.json]
    .venv/bin/python bench/bench_cpu_attention.py --tiny --rounds 2   # checks the script only

Each budget tree's step (the empty one is autoregressive decoding's plain step, without a mask)
is timed the latency profiler's way, launch to readback from a restored state at a fixed
context, once per way, all of them in a fresh random order each round. ``--batch B`` times
instead the batch forward of batched greedy generation (``B`` rows, one token each: a step of
``model/_greedy.py``'s ``batch_greedy_steps``) over a past of each context. Prints per step
and context the median ms of each way, the median per-round ratio of the runtime's way
(``StaticLlama.grouped_kv_way``'s choice) to each other way with its interquartile range, and
whether the ways wrote the same cache entries as the repeat (transformers' way; ``sdpa`` must,
to the bit; ``fold`` may differ in the last bit where a kernel splits rows differently). Random
weights of the default model's architecture and random heads drafting over
``--draft-vocab-size`` tokens, loaded as ``entmtp latency`` loads them (a step's time does not
depend on the values). Run it on a quiet machine; it names the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from entmtp.core import DTYPE_ALIASES, HEAD_TYPES, cpu_name
from entmtp.evaluation import budget_tree, load_for_latency, run_record
from entmtp.model import GROUPED_KV_WAYS, new_heads, resolve_dtype
from entmtp.runtime import SpeculativeDecoder

CONFIG = Path(__file__).resolve().parent.parent / "trees" / "latency" / "SmolLM2-135M-Instruct.Q4_1"
REFERENCE_WAY = "repeat"  # transformers' way: the bits the others are compared with


def tiny_setup(head_type: str, dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    """A tiny random Llama with grouped key/value heads and random heads drafting over 64
    tokens: checks that the script runs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype).eval()
    heads = new_heads(model, head_type=head_type, num_heads=4, seed=0, shared_lm_head=True)
    heads.set_draft_vocab(torch.randperm(256)[:64])
    return model, heads


# A timed run: (ms, the cache entries it wrote).
Run = Callable[[], tuple[float, torch.Tensor]]


def tree_runs(engine, steps: dict[str, object], context: int, vocab: int) -> dict[str, Run]:
    """Each tree step at a past of ``context`` random tokens. ``timed_run`` restores the engine's
    state after each run, and a step writes its slots after the past before it reads them, so
    every run starts from the same inputs."""
    engine.prefill(torch.randint(0, vocab, (context,)))

    def run_of(step) -> Run:
        def run() -> tuple[float, torch.Tensor]:
            elapsed = engine.timed_run(step, context).host_ms
            return elapsed, engine.cache[:, :, :, context:context + step.cache_width].clone()
        return run

    return {label: run_of(step) for label, step in steps.items()}


def batch_runs(net, cache: torch.Tensor, context: int, vocab: int) -> dict[str, Run]:
    """One step of batched greedy generation's backbone (``model/_greedy.py``: one token per
    row at slot ``context``, an additive mask) over a cache whose first ``context`` slots hold
    random keys and values; every run rewrites the same slot."""
    rows = cache.shape[2]
    generator = torch.Generator().manual_seed(context)
    cache[:, :, :, :, :context] = torch.randn(cache[:, :, :, :, :context].shape,
                                              generator=generator).to(cache.dtype)
    tokens = torch.randint(0, vocab, (rows, 1), generator=generator)
    positions = torch.full((rows, 1), context)
    slots = torch.tensor([context])
    bias = torch.zeros(rows, 1, context + 1, dtype=cache.dtype)

    def run() -> tuple[float, torch.Tensor]:
        start = time.perf_counter()
        net.backbone(cache, tokens, positions, slots, bias, context + 1)
        elapsed = (time.perf_counter() - start) * 1e3
        return elapsed, cache[..., context, :].clone()

    return {f"batch {rows}": run}


def time_ways(net, runs: dict[str, Run], rounds: int, order: torch.Generator
              ) -> tuple[dict, dict]:
    """(label -> way -> ms per round, label -> way -> same cache entries as the reference way in
    every round); two untimed warm-up rounds first."""
    times = {label: {way: [] for way in GROUPED_KV_WAYS} for label in runs}
    same = {label: dict.fromkeys(GROUPED_KV_WAYS, True) for label in runs}
    pairs = [(label, way) for label in runs for way in GROUPED_KV_WAYS]
    for round_index in range(2 + rounds):
        written: dict[tuple[str, str], torch.Tensor] = {}
        for position in torch.randperm(len(pairs), generator=order).tolist():
            label, way = pairs[position]
            net.grouped_kv = way
            elapsed, written[label, way] = runs[label]()
            if round_index >= 2:
                times[label][way].append(elapsed)
        for label, way in pairs:
            same[label][way] &= torch.equal(written[label, way],
                                            written[label, REFERENCE_WAY])
    net.grouped_kv = None  # back to the measured choice
    return times, same


def summary_row(label: str, context: int, times: dict[str, list[float]],
                same: dict[str, bool], default: str) -> dict:
    row = {"step": label, "context": context, "default": default,
           "ms": {way: statistics.median(times[way]) for way in GROUPED_KV_WAYS},
           "same_bits_as_repeat": same, "ratios": {}}
    for way in GROUPED_KV_WAYS:
        if way == default:
            continue
        ratios = [d / o for d, o in zip(times[default], times[way], strict=True)]
        low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        row["ratios"][f"{default}/{way}"] = {"median": statistics.median(ratios), "q1": low,
                                            "q3": high}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-type", default="hydra", choices=HEAD_TYPES)
    parser.add_argument("--nodes", type=int, nargs="+", default=[0, 1, 4, 8, 16, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 384])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_ALIASES))
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=0,
                        help="time a batched greedy step of this many rows instead of trees")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny random model: check that the script runs")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
    if args.tiny:
        model, heads = tiny_setup(args.head_type, dtype)
    else:
        model, heads, _ = load_for_latency(
            model=str(CONFIG), heads=None, head_type=args.head_type, num_heads=4,
            random_weights=True, dtype=args.dtype, device="cpu", seed=0,
            draft_vocab_size=args.draft_vocab_size)
    engine = SpeculativeDecoder(model, heads, topk=10).static_engine
    net = engine.net
    default = net.grouped_kv_way(batched=args.batch > 0)
    others = [way for way in GROUPED_KV_WAYS if way != default]
    vocab = model.config.vocab_size
    order = torch.Generator().manual_seed(0)
    what = (f"batched greedy steps of {args.batch} rows" if args.batch else
            f"{args.head_type} heads over {heads.draft_vocab_size} tokens")
    print(f"{cpu_name()}, torch {torch.__version__}, {args.threads} threads, {dtype}; "
          f"{'tiny random Llama' if args.tiny else 'default model, random weights'}, "
          f"{what}; {args.rounds} rounds; the runtime's way: {default}")
    print(f"{'step':10s} {'context':>7s} "
          + " ".join(f"{way + ' ms':>10s}" for way in GROUPED_KV_WAYS) + " "
          + " ".join(f"{default + '/' + way + ' [IQR]':>24s}" for way in others)
          + "  same bits as repeat")
    rows = []
    with torch.inference_mode():
        if args.batch:
            cache = net.new_cache(max(args.contexts) + 1, batch=args.batch)
        else:
            steps = {f"{n} nodes": engine.tree_step(budget_tree(n, 4, topk=10, num_heads=4))
                     for n in args.nodes}
            engine.reserve(max(args.contexts) + max(s.cache_width for s in steps.values()))
        for context in args.contexts:
            runs = (batch_runs(net, cache, context, vocab) if args.batch
                    else tree_runs(engine, steps, context, vocab))
            times, same = time_ways(net, runs, args.rounds, order)
            for label in runs:
                row = summary_row(label, context, times[label], same[label], default)
                rows.append(row)
                cells = " ".join(f"{row['ms'][way]:10.2f}" for way in GROUPED_KV_WAYS)
                ratios = " ".join(
                    f"{r['median']:9.3f}x [{r['q1']:.3f}-{r['q3']:.3f}]"
                    for r in (row["ratios"][f"{default}/{way}"] for way in others))
                bits = ", ".join(f"{way} {same[label][way]}" for way in GROUPED_KV_WAYS
                                 if way != REFERENCE_WAY)
                print(f"{label:10s} {context:7d} {cells} {ratios}  {bits}")
    if args.json:
        meta = run_record(model, head_type=args.head_type,
                          draft_vocab_size=heads.draft_vocab_size, batch=args.batch,
                          tiny=args.tiny, rounds=args.rounds)
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
