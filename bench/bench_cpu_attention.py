"""Grouped-query attention under a tree mask on the CPU: SDPA's own grouped heads vs keys and
values repeated per query head, side by side per step of the static runtime.

    .venv/bin/python bench/bench_cpu_attention.py [--head-type hydra] [--nodes 0 1 4 8 16 64]
        [--contexts 128 256 384] [--rounds 12] [--threads 2] [--dtype fp32|bf16]
        [--draft-vocab-size 8192] [--json out.json]
    .venv/bin/python bench/bench_cpu_attention.py --tiny --rounds 2   # checks the script only

Each budget tree's step (the plain empty step is autoregressive decoding: no mask, the same
kernel either way, a control) is timed the latency profiler's way, launch to readback from a
restored state at a fixed context, once with ``StaticLlama.grouped_masked_sdpa`` on and once
off, the two in a fresh random order each round. Prints per tree and context the median ms of
each, the median per-round grouped / repeated ratio with its interquartile range, and whether
the two wrote the same cache entries (they must: the same bits). Random weights of the default
model's architecture and random heads drafting over ``--draft-vocab-size`` tokens, loaded as
``entmtp latency`` loads them (a step's time does not depend on the values). Run it on a quiet
machine; it names the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from entmtp.calibrate import load_for_latency, new_heads, resolve_dtype
from entmtp.core import DTYPE_ALIASES, HEAD_TYPES, cpu_name, describe_machine
from entmtp.runtime import SpeculativeDecoder, budget_tree

CONFIG = Path(__file__).resolve().parent.parent / "trees" / "latency" / "SmolLM2-135M-Instruct.Q4_1"
SETTINGS = {"grouped": True, "repeated": False}


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


def time_context(engine, steps: dict[str, object], context: int, rounds: int, vocab: int,
                 order: torch.Generator) -> tuple[dict, dict]:
    """(label -> setting -> ms per round, label -> same cache entries in every round) of each
    step at a past of ``context`` random tokens; two untimed warm-up rounds first. ``timed_run``
    restores the engine's state after each run; the slots a step writes are put back here, so
    every run starts from the same cache."""
    times = {label: {s: [] for s in SETTINGS} for label in steps}
    same = dict.fromkeys(steps, True)
    runs = [(label, setting) for label in steps for setting in SETTINGS]
    engine.prefill(torch.randint(0, vocab, (context,)))
    for round_index in range(2 + rounds):
        written: dict[tuple[str, str], torch.Tensor] = {}
        for position in torch.randperm(len(runs), generator=order).tolist():
            label, setting = runs[position]
            step = steps[label]
            engine.net.grouped_masked_sdpa = SETTINGS[setting]
            slots = slice(context, context + step.cache_width)
            kept = engine.cache[:, :, :, slots].clone()
            elapsed = engine.timed_run(step, context)
            written[label, setting] = engine.cache[:, :, :, slots].clone()
            engine.cache[:, :, :, slots] = kept
            if round_index >= 2:
                times[label][setting].append(elapsed)
        for label in steps:
            same[label] &= torch.equal(written[label, "grouped"], written[label, "repeated"])
    engine.net.grouped_masked_sdpa = SETTINGS["grouped"]
    return times, same


def summary_row(label: str, context: int, times: dict[str, list[float]], same: bool) -> dict:
    ratios = [g / r for g, r in zip(times["grouped"], times["repeated"], strict=True)]
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return {"step": label, "context": context,
            "grouped_ms": statistics.median(times["grouped"]),
            "repeated_ms": statistics.median(times["repeated"]),
            "ratio_median": statistics.median(ratios), "ratio_q1": low, "ratio_q3": high,
            "same_bits": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-type", default="hydra", choices=HEAD_TYPES)
    parser.add_argument("--nodes", type=int, nargs="+", default=[0, 1, 4, 8, 16, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 384])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_ALIASES))
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
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
    steps = {f"{n} nodes": engine.tree_step(budget_tree(n, 4, topk=10, num_heads=4))
             for n in args.nodes}
    order = torch.Generator().manual_seed(0)
    print(f"{cpu_name()}, torch {torch.__version__}, {args.threads} threads, {dtype}; "
          f"{'tiny random Llama' if args.tiny else 'default model, random weights'}, "
          f"{args.head_type} heads over {heads.draft_vocab_size} tokens; {args.rounds} rounds")
    print(f"{'step':10s} {'context':>7s} {'grouped ms':>10s} {'repeated ms':>11s} "
          f"{'grouped/repeated [IQR]':>24s} same bits")
    rows = []
    with torch.inference_mode():
        engine.reserve(max(args.contexts) + max(s.cache_width for s in steps.values()))
        for context in args.contexts:
            times, same = time_context(engine, steps, context, args.rounds,
                                       model.config.vocab_size, order)
            for label in steps:
                row = summary_row(label, context, times[label], same[label])
                rows.append(row)
                print(f"{label:10s} {context:7d} {row['grouped_ms']:10.2f} "
                      f"{row['repeated_ms']:11.2f} {row['ratio_median']:9.3f}x "
                      f"[{row['ratio_q1']:.3f}-{row['ratio_q3']:.3f}] {row['same_bits']}")
    if args.json:
        meta = {**describe_machine("cpu", torch_threads=torch.get_num_threads()),
                "torch": torch.__version__, "dtype": str(dtype), "head_type": args.head_type,
                "draft_vocab_size": heads.draft_vocab_size,
                "tiny": args.tiny, "rounds": args.rounds,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
