"""Does the latency profiler's step time match live decoding? Step ms of static trees, three ways.

    .venv/bin/python bench/bench_latency_fidelity.py --task code --head-type hydra \
        [--prompts 4] [--max-new-tokens 64] [--rounds 2] [--threads 2]

On the default model with the shipped heads, for a few static trees (none, 1 node, 3 nodes on
one level, 3 nodes in a chain), each round measures the mean step time
- live: ``SpeculativeDecoder.generate`` over the held-out prompts (``StepLog.step_ms``);
- fixed: what ``entmtp latency`` does: one step at the prompt's context, the cache cut back and
  the state restored after each, 8 steps per prompt;
- growing: steps committed one after another, the context growing as in decoding;
and prints the latency file's modelled step time of that tree beside them. If fixed and live
agree, the profiler's method is faithful and a gap to the model is the machine, not the method.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from entmtp.cli._live import encode_prompts, load_base, load_heads_for, load_task_prompts
from entmtp.runtime._decode import SpeculativeDecoder
from entmtp.runtime._kv_cache import truncate_cache
from entmtp.runtime._latency_profile import budget_tree
from entmtp.runtime._scheduler import StaticScheduler
from entmtp.runtime._verify import greedy_accept
from entmtp.treesearch import LatencyModel
from entmtp.treesearch._tree import Tree

FIXED_STEPS = 8  # steps per prompt at its fixed context


def timed_step(decoder: SpeculativeDecoder, state, plan) -> float:
    start = decoder.clock.now()
    with torch.inference_mode():
        outcome = decoder.step(state, plan, greedy_accept)
        decoder.commit(state, outcome, outcome.path)
    return decoder.clock.now() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="code")
    parser.add_argument("--head-type", default="hydra", choices=["medusa", "hydra"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latency", default=None,
                        help="latency file to compare with (default: the 2-thread CPU file)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    base = load_base(None)
    heads = load_heads_for(base, None, args.head_type, None)
    prompts = encode_prompts(base, load_task_prompts(
        task=args.task, data=None, split="heldout", num_prompts=args.prompts, seed=0),
        args.max_new_tokens)
    decoder = SpeculativeDecoder(base.model, heads, topk=10)
    latency = LatencyModel.load(
        args.latency or f"trees/latency/cpu2-{args.head_type}-smollm2-135m.json")
    trees = {
        "empty": Tree.from_paths([]),
        "1 node": Tree.from_paths([(0,)]),
        "3 wide": Tree.from_paths([(0,), (1,), (2,)]),
        "3 chain": budget_tree(3, heads.num_heads, topk=10, num_heads=heads.num_heads),
    }
    print(f"{'round':>5} {'tree':>8} {'live ms':>8} {'fixed ms':>9} {'growing ms':>11} "
          f"{'model ms':>9} {'fixed/live':>10}")
    for round_index in range(args.rounds):
        for name, tree in trees.items():
            plan = decoder.plan(tree)
            live, fixed, growing = [], [], []
            for prompt in prompts:
                result = decoder.generate(prompt.ids, StaticScheduler(tree),
                                          max_new_tokens=args.max_new_tokens)
                live += [step.step_ms for step in result.step_log]
                state, _ = decoder.prefill(prompt.ids, lambda logits: int(logits.argmax()))
                saved = (state.past_len, state.pending, state.hidden)
                for _ in range(FIXED_STEPS):
                    fixed.append(timed_step(decoder, state, plan))
                    truncate_cache(state.cache, saved[0])
                    state.past_len, state.pending, state.hidden = saved
                for _ in range(args.max_new_tokens // 2):
                    growing.append(timed_step(decoder, state, plan))
            live_ms, fixed_ms = statistics.mean(live), statistics.mean(fixed)
            print(f"{round_index:>5} {name:>8} {live_ms:>8.1f} {fixed_ms:>9.1f} "
                  f"{statistics.mean(growing):>11.1f} {latency.tree_ms(tree):>9.1f} "
                  f"{fixed_ms / live_ms:>10.3f}")


if __name__ == "__main__":
    main()
