"""What each variant of a bundle's tree steps costs on the static engine, side by side.

    .venv/bin/python bench/bench_step_variants.py --bundle trees/bundles/math-medusa-cpu2.json
        [--context 256] [--rounds 40] [--threads 2]
    .venv/bin/python bench/bench_step_variants.py --bundle B --rounds 2   # checks the script

A tree's step comes in variants that the latency model prices alike: plain (a static tree's
schedule reads no entropies), base-entropy (what the latency profiler times, and what a
base-entropy schedule runs) and draft-entropy (drafts from the prepared heads, then prepares the
next step for the schedule's deepest tree). This times, at one context, the bundle's best static
tree and every drafted tree of its schedule in each variant, the plain empty step
(autoregressive) and, for heads that share the lm_head, the fused empty step, interleaved in a
fresh random order each round (the profiler's way: launch to readback from a restored state).
Random weights of the default model's architecture and random heads of the bundle's type (a
step's time does not depend on the values). Prints the median ms and interquartile range of each.
Run it on a quiet machine; it names the CPU.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from entmtp.core import cpu_name
from entmtp.model import new_heads, random_model
from entmtp.runtime import SpeculativeDecoder
from entmtp.treesearch import Tree, load_bundle

CONFIG = Path(__file__).resolve().parent.parent / "trees" / "latency" / "SmolLM2-135M-Instruct.Q4_1"


def variant_steps(engine, bundle, depth: int, fuses_empty: bool) -> dict[str, object]:
    """Name -> the engine's step object of each variant timed; ``depth``: the schedule's
    deepest tree, the heads its draft-entropy steps prepare."""
    static = bundle.best_static.tree
    steps = {}
    for label, tree in [("best static", static)] + [
            (f"schedule tree {i}", t) for i, t in enumerate(bundle.trees) if t.num_nodes]:
        shape = f"{label}: {tree.num_nodes} nodes, depth {tree.depth}"
        steps[f"{shape}, plain"] = engine.tree_step(tree)
        steps[f"{shape}, base-entropy (profiled)"] = engine.tree_step(tree, base_entropy=True)
        steps[f"{shape}, draft-entropy, prepares {depth}"] = engine.tree_step(
            tree, prepare_depth=depth)
    empty = Tree.from_paths([])
    steps["empty tree, plain (autoregressive)"] = engine.tree_step(empty)
    if fuses_empty:
        steps[f"empty tree, fused, prepares {depth}"] = engine.tree_step(
            empty, prepare_depth=depth, fuse=True)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load_bundle(args.bundle)
    model = random_model(str(CONFIG)).model
    heads = new_heads(model, head_type=bundle.heads.type, num_heads=bundle.heads.num_heads,
                      seed=0, shared_lm_head=True)
    decoder = SpeculativeDecoder(model, heads, topk=10)
    engine = decoder.static_engine
    depth = max(t.depth for t in bundle.trees)
    steps = variant_steps(engine, bundle, depth, decoder.fuses_empty)
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    order = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        engine.reserve(args.context + max(s.cache_width for s in steps.values()))
        engine.reserve_prepared()
        engine.prefill(torch.randint(0, model.config.vocab_size, (args.context,)))
        engine.run(engine.prepare_step(depth), args.context)
        state = engine.save_state()
        for round_index in range(2 + args.rounds):  # two warm-up rounds
            for position in torch.randperm(len(names), generator=order).tolist():
                step = steps[names[position]]
                engine.restore_state(state)
                slots = slice(args.context, args.context + step.cache_width)
                kept = engine.cache[:, :, :, slots].clone()
                elapsed = engine.timed_run(step, args.context).host_ms
                engine.cache[:, :, :, slots] = kept
                if round_index >= 2:
                    times[names[position]].append(elapsed)
    print(f"{cpu_name()}, torch {torch.__version__}, {args.threads} threads; {args.bundle.name}; "
          f"random weights, past {args.context} tokens, {args.rounds} rounds")
    for name in names:
        low, _, high = statistics.quantiles(times[name], n=4)
        print(f"{statistics.median(times[name]):8.2f} ms  IQR {high - low:5.2f}  {name}")


if __name__ == "__main__":
    main()
