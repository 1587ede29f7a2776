"""Does the latency profiler's step time match live decoding? Step ms of static trees, three ways.

    .venv/bin/python bench/bench_latency_fidelity.py --task code --head-type hydra \
        [--prompts 4] [--max-new-tokens 64] [--rounds 2] [--threads 2] \
        [--engine auto|static|eager] [--no-graphs] [--device cuda --dtype bf16]

On the default model with the shipped heads, for a few static trees (none, 1 node, 3 nodes on
one level, 3 nodes in a chain), each round measures the mean step time
- live: ``SpeculativeDecoder.generate`` over the held-out prompts (``StepLog.step_ms``);
- fixed: what ``entmtp latency`` does, with its own code (``fixed_context_steps``): one step at
  the prompt's context from its saved state, restored after each, 8 steps per prompt;
- growing: steps committed one after another, the context growing as in decoding;
all on the runtime greedy decoding runs (``--engine``: the static engine, graphs on CUDA, unless
eager is asked for or the model needs it). On the static engine the fixed and growing steps
also output the path's entropies (as the profiler times them), which a static tree's live step
skips.
and prints the latency file's modelled step time of that tree beside them. If fixed and live
agree, the profiler's method is faithful and a gap to the model is the machine, not the method.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from entmtp.cli._live import encode_prompts, load_task_prompts
from entmtp.core import HEAD_TYPES
from entmtp.evaluation import budget_tree, fixed_context_steps
from entmtp.model import entropy_from_logits, load_base, load_heads_for
from entmtp.runtime import SpeculativeDecoder, StaticScheduler, greedy_accept
from entmtp.treesearch import LatencyModel, Tree

FIXED_STEPS = 8  # steps per prompt at its fixed context


def growing_steps(decoder: SpeculativeDecoder, prompt: torch.Tensor, tree: Tree, count: int
                  ) -> list[float]:
    """ms of ``count`` steps of ``tree`` committed one after another after the prompt."""
    clock = decoder.clock
    times = []
    engine = decoder.static_engine
    with torch.inference_mode():
        if engine is not None:
            step = engine.tree_step(tree, base_entropy=True)
            engine.reserve(len(prompt) + count * (tree.num_nodes + 1) + tree.num_nodes + 1)
            engine.capture([step])
            engine.prefill(prompt.to(engine.device))
            past = len(prompt)
            for _ in range(count):
                start = clock.now()
                engine.run(step, past)
                past += step.readback()[0].length
                times.append(clock.now() - start)
            return times
        plan = decoder.plan(tree)
        state, _ = decoder.prefill(prompt, lambda logits: int(logits.argmax()))
        for _ in range(count):
            start = clock.now()
            outcome = decoder.step(state, plan, greedy_accept)
            decoder.commit(state, outcome, outcome.path)
            entropy_from_logits(outcome.logits[outcome.path]).tolist()
            times.append(clock.now() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="code")
    parser.add_argument("--head-type", default="hydra", choices=HEAD_TYPES)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latency", default=None,
                        help="latency file to compare with (default: the 2-thread CPU file)")
    parser.add_argument("--engine", default="auto", choices=["auto", "static", "eager"])
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    base = load_base(None, device=args.device, dtype=args.dtype)
    heads = load_heads_for(base, None, args.head_type, None)
    prompts = encode_prompts(base, load_task_prompts(
        task=args.task, data=None, split="heldout", num_prompts=args.prompts, seed=0),
        args.max_new_tokens)
    decoder = SpeculativeDecoder(base.model, heads, topk=10, engine=args.engine,
                                 graphs=not args.no_graphs)
    print(decoder.runtime_note)
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
            live, fixed, growing = [], [], []
            for prompt in prompts:
                result = decoder.generate(prompt.ids, StaticScheduler(tree),
                                          max_new_tokens=args.max_new_tokens)
                live += [step.step_ms for step in result.step_log]
                ids = torch.as_tensor(prompt.ids, dtype=torch.int64).reshape(-1)
                steps = fixed_context_steps(decoder, [tree], ids, [len(ids)])
                fixed += [steps.time(("tree", 0, len(ids))) for _ in range(FIXED_STEPS)]
                growing += growing_steps(decoder, ids, tree, args.max_new_tokens // 2)
            live_ms, fixed_ms = statistics.mean(live), statistics.mean(fixed)
            print(f"{round_index:>5} {name:>8} {live_ms:>8.1f} {fixed_ms:>9.1f} "
                  f"{statistics.mean(growing):>11.1f} {latency.tree_ms(tree):>9.1f} "
                  f"{fixed_ms / live_ms:>10.3f}")

if __name__ == "__main__":
    main()
