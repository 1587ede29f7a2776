"""Live runtime on the default model: per-step overhead vs the verify forward, and speedup.

    .venv/bin/python bench/bench_runtime.py [--head-type medusa] [--heads FOLDER] [--nodes 32]
                                            [--max-new-tokens 48] [--repeats 7] [--threads N]

1. One step with a ``--nodes`` tree (the budget tree as deep as the heads allow), split into
   drafting, mask building, the verify forward, acceptance, cache compaction and the accepted
   path's entropies; medians of ``--repeats`` after warm-up, the cache cut back after each. The
   runtime overhead is everything but the forward, as a fraction of the forward (target <= 10%).
2. Greedy generation on a few prompts, autoregressive vs the same tree, in this process: tokens
   per second of the decoding steps, their ratio, and whether the outputs are identical.

Heads: ``--heads``, else shipped heads under trees/heads/ when present, else random heads (their
acceptance is near 1 token per step, so the speedup then only shows the cost side).
"""

from __future__ import annotations

import argparse
import statistics
import time
from importlib import resources
from pathlib import Path

import torch

from entmtp.core import HEAD_TYPES
from entmtp.evaluation import budget_tree
from entmtp.model import entropy_from_logits, load_base_model, load_heads, new_heads
from entmtp.runtime import (
    SpeculativeDecoder,
    StaticScheduler,
    autoregressive_generate,
    compact_cache,
    forward_tokens,
    greedy_accept,
    truncate_cache,
)

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
]


def find_heads(base, head_type: str, heads: str | None):
    if heads is not None:
        return load_heads(Path(heads), base.model), heads
    shipped = Path(str(resources.files("entmtp.trees").joinpath("heads")))
    if shipped.is_dir():
        for folder in sorted(shipped.iterdir()):
            if folder.is_dir() and head_type in folder.name:
                return load_heads(folder, base.model), str(folder)
    return new_heads(base.model, head_type=head_type, num_heads=4, seed=0), "random init"


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


def step_breakdown(decoder: SpeculativeDecoder, ids: list[int], tree, repeats: int) -> dict:
    """Median ms of each part of one step, the cache restored after each repeat."""
    model = decoder.model
    state, _ = decoder.prefill(ids, lambda logits: int(logits.argmax()))
    plan = decoder.plan(tree)
    parts: dict[str, list[float]] = {k: [] for k in
                                     ("draft", "mask", "forward", "accept", "compact", "entropy")}
    sync = torch.cuda.synchronize if decoder.device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        for run in range(repeats + 2):
            marks = [time.perf_counter()]

            def mark(marks: list[float] = marks) -> None:
                sync()
                marks.append(time.perf_counter())

            root = torch.tensor([state.pending], device=decoder.device)
            drafted = decoder.drafter.draft(plan, root, state.hidden)
            mark()
            mask = plan.attention_mask(state.past_len, decoder.dtype)
            positions = (plan.depths + state.past_len).unsqueeze(0)
            mark()
            hidden, logits = forward_tokens(model, state.cache, drafted.unsqueeze(0),
                                            position_ids=positions, attention_mask=mask)
            mark()
            path, _ = greedy_accept(plan, drafted, logits)
            drafted.tolist()
            mark()
            # compact a non-contiguous path when the tree has one, so the gather is timed
            leaf = plan.size - 1
            keep = plan.ancestors[leaf, : int(plan.depths[leaf]) + 1].tolist() if leaf else [0]
            compact_cache(state.cache, state.past_len, keep)
            mark()
            entropy_from_logits(logits[keep]).tolist()
            mark()
            truncate_cache(state.cache, state.past_len)
            if run >= 2:
                for name, start, end in zip(parts, marks, marks[1:], strict=False):
                    parts[name].append(end - start)
    return {name: median_ms(values) for name, values in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-type", default="medusa", choices=HEAD_TYPES)
    parser.add_argument("--heads", default=None)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--topk", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 is steadier on a shared machine)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    start = time.perf_counter()
    base = load_base_model()
    heads, heads_source = find_heads(base, args.head_type, args.heads)
    print(f"model {base.name}, {heads.head_type} heads ({heads_source}), "
          f"torch threads {torch.get_num_threads()}, loaded in {time.perf_counter() - start:.1f} s")
    decoder = SpeculativeDecoder(base.model, heads, topk=args.topk)
    tree = budget_tree(args.nodes, heads.num_heads, topk=args.topk, num_heads=heads.num_heads)
    ids = base.encode_prompt(PROMPTS[0])

    parts = step_breakdown(decoder, ids, tree, args.repeats)
    overhead = sum(v for k, v in parts.items() if k != "forward")
    print(f"\nstep with a {tree.num_nodes}-node tree (depth {tree.depth}), "
          f"context {len(ids)} tokens, median of {args.repeats}:")
    for name, value in parts.items():
        print(f"  {name:8s} {value:8.2f} ms  ({value / parts['forward']:6.1%} of forward)")
    print(f"  runtime overhead / verify forward = {overhead / parts['forward']:.1%} "
          f"(target <= 10%)")

    print(f"\ngreedy generation, {args.max_new_tokens} new tokens per prompt:")
    scheduler = StaticScheduler(tree)
    eos = base.eos_token_ids
    warm = base.encode_prompt("Hi")
    autoregressive_generate(base.model, warm, max_new_tokens=4, eos_token_ids=eos)
    decoder.generate(warm, scheduler, max_new_tokens=4, eos_token_ids=eos)
    ar_tokens = ar_ms = sp_tokens = sp_ms = steps = accepted = 0.0
    identical = True
    for text in PROMPTS:
        prompt = base.encode_prompt(text)
        ar = autoregressive_generate(base.model, prompt, max_new_tokens=args.max_new_tokens,
                                     eos_token_ids=eos)
        sp = decoder.generate(prompt, scheduler, max_new_tokens=args.max_new_tokens,
                              eos_token_ids=eos)
        identical &= ar.tokens == sp.tokens
        ar_tokens += len(ar.tokens) - 1
        ar_ms += ar.decode_ms
        sp_tokens += len(sp.tokens) - 1
        sp_ms += sp.decode_ms
        steps += sp.steps
        accepted += sum(sp.accept_lengths)
    ar_rate = 1000.0 * ar_tokens / ar_ms
    sp_rate = 1000.0 * sp_tokens / sp_ms
    print(f"  autoregressive     {ar_rate:7.2f} tokens/s")
    print(f"  tree ({tree.num_nodes:3d} nodes)    {sp_rate:7.2f} tokens/s, "
          f"mean accept length {accepted / max(steps, 1):.2f}")
    print(f"  speedup {sp_rate / ar_rate:.2f}x; outputs identical: {identical}")


if __name__ == "__main__":
    main()
