"""A bundle of one tree against the same tree as a static scheduler, on one decoder, A/B.

    .venv/bin/python bench/bench_bundle_path.py trees/bundles/code-medusa-cpu2-zen4.json \
        --prompts 4 --rounds 6 --max-new-tokens 96 --json bench/results/bundle-path.json

`entmtp bench` runs a bundle's `best-static` and `entmtp` rows as two of its methods in a
carryover-balanced order over prompts; with few prompts on a shared machine the two rows of the
same tree can differ by more than the machine's drift. Here nothing else changes between the two
arms: the same decoder and prompt, back to back, the order alternating every round (ABBA), so a
real per-step cost of the bundle path shows as a paired ratio away from 1 in every round, and
noise as a spread around 1. Prints per-arm tokens/s and the paired ratio bundle / static (median,
quartiles, geometric mean); checks that both arms emit the same tokens and run the same step
objects.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from entmtp.calibrate import load_prompts
from entmtp.core import atomic_write_json, cpu_info
from entmtp.evaluation import quartiles
from entmtp.model import load_base, load_heads_for
from entmtp.runtime import BundleScheduler, SpeculativeDecoder, StaticScheduler
from entmtp.treesearch import load_bundle, runtime_padding


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    bundle = load_bundle(args.bundle)
    if len(bundle.trees) != 1:
        print(f"{args.bundle} switches between {len(bundle.trees)} trees: give a one-tree bundle",
              file=sys.stderr)
        return 2
    base = load_base(None)
    heads = load_heads_for(base, None, bundle.heads.type, None, bundle.heads.sha256)
    decoder = SpeculativeDecoder(base.model, heads, topk=bundle.heads.topk,
                                 padded_nodes=runtime_padding(bundle.latency, pad=True))
    tree = bundle.trees[0]
    arms = {"static": lambda: StaticScheduler(tree),
            "bundle": lambda: BundleScheduler(bundle.schedule())}
    prompts = load_prompts(bundle.task, split="heldout", seed=0)[: args.prompts]
    encoded = [base.encode_task_prompt(p) for p in prompts]
    eos = sorted(base.eos_token_ids)
    longest = max(len(ids) for ids in encoded) + args.max_new_tokens
    for make in arms.values():
        decoder.warm_up(make(), max_context=longest)

    steps_used: dict[str, set[int]] = {name: set() for name in arms}
    current = [""]  # the arm running now, for the step spy
    engine = decoder.static_engine
    if engine is not None:
        run = engine.run

        def spy(step, past_len, _run=run):
            steps_used[current[0]].add(id(step))
            return _run(step, past_len)

        engine.run = spy
    rates: dict[str, list[float]] = {name: [] for name in arms}
    ratios: list[float] = []
    for round_index in range(args.rounds):
        tokens: dict[str, int] = dict.fromkeys(arms, 0)
        ms: dict[str, float] = dict.fromkeys(arms, 0.0)
        for prompt_index, ids in enumerate(encoded):
            outputs = {}
            order = list(arms) if (round_index + prompt_index) % 2 == 0 else list(arms)[::-1]
            for name in order:
                current[0] = name
                result = decoder.generate(ids, arms[name](), max_new_tokens=args.max_new_tokens,
                                          eos_token_ids=eos)
                outputs[name] = result.tokens
                tokens[name] += result.decode_tokens
                ms[name] += result.decode_ms
            if outputs["static"] != outputs["bundle"]:
                print("the two arms emitted different tokens", file=sys.stderr)
                return 1
        for name in arms:
            rates[name].append(1000.0 * tokens[name] / ms[name])
        ratios.append(rates["bundle"][-1] / rates["static"][-1])
        print(f"round {round_index}: static {rates['static'][-1]:.2f} tok/s, bundle "
              f"{rates['bundle'][-1]:.2f} tok/s, bundle/static {ratios[-1]:.3f}", flush=True)
    same_steps = steps_used["static"] == steps_used["bundle"]
    q1, median, q3 = quartiles(ratios)
    geometric = math.exp(statistics.fmean(math.log(r) for r in ratios))
    cpu = cpu_info()
    print(f"{cpu.name} ({cpu.signature}): bundle/static median {median:.3f} "
          f"[{q1:.3f}, {q3:.3f}], geometric mean {geometric:.3f} over {len(ratios)} rounds; same "
          f"step objects: {same_steps}")
    if args.json is not None:
        atomic_write_json(args.json, {
            "bundle": str(args.bundle), "prompts": args.prompts, "rounds": args.rounds,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads,
            "machine": {"cpu": cpu.name, "cpu_signature": cpu.signature},
            "tokens_per_second": rates, "ratio_bundle_over_static": ratios,
            "median": median, "quartiles": [q1, q3], "geometric_mean": geometric,
            "same_step_objects": same_steps,
            "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime())})
    return 0 if same_steps else 1


if __name__ == "__main__":
    sys.exit(main())
