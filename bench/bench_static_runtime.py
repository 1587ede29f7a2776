"""The static-shape runtime vs the eager one, side by side: per-step milliseconds on this CPU.

    .venv/bin/python bench/bench_static_runtime.py [--rounds 5] [--prompts 3]
        [--max-new-tokens 48] [--nodes 0 4 16 64] [--head-types medusa hydra] [--threads N]
        [--dtype fp32|bf16|fp16] [--json out.json]
    .venv/bin/python bench/bench_static_runtime.py --tiny --rounds 1   # checks the script only

For each head type and tree (budget trees of ``--nodes`` nodes plus Medusa's mc_sim_7b_63) and
for autoregressive decoding, both runtimes decode the same prompts greedily in interleaved
rounds (the engine that goes first alternates). A run's step time is its decode time over its
steps; each round gives the static / eager ratio of the mean step time over the prompts. Prints
the median ratio with its min..max over rounds, the median step ms of each runtime, and whether
the outputs were identical (in fp32 they must be; in bf16 / fp16 the two runtimes' kernels may
round a near-tie apart). Run it on a quiet machine: figures taken beside other jobs mean
nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
from importlib import resources
from pathlib import Path

import torch

from entmtp.core import DTYPE_ALIASES, HEAD_TYPES, cpu_name
from entmtp.evaluation import budget_tree, run_record
from entmtp.model import load_heads, new_heads, resolve_dtype
from entmtp.runtime import SpeculativeDecoder, StaticScheduler, autoregressive_generate
from entmtp.treesearch import reference_tree

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Solve: a train travels 60 km in 45 minutes. What is its speed in km/h?",
]
ENGINES = ("eager", "static")


def tiny_setup(head_types, dtype):
    """A tiny random Llama and random heads: checks that the script runs, nothing else."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype).eval()
    heads = {t: new_heads(model, head_type=t, num_heads=4, seed=0) for t in head_types}
    prompts = [[1] + [3 + (ord(c) % 250) for c in text[:20]] for text in PROMPTS]
    return model, heads, prompts, [], "tiny random Llama"


def model_setup(head_types, dtype):
    from entmtp.model import load_base_model

    base = load_base_model(dtype=dtype)
    shipped = Path(str(resources.files("entmtp.trees").joinpath("heads")))
    heads = {}
    for head_type in head_types:
        folders = [f for f in sorted(shipped.iterdir()) if f.is_dir() and head_type in f.name] \
            if shipped.is_dir() else []
        heads[head_type] = load_heads(folders[0], base.model) if folders else \
            new_heads(base.model, head_type=head_type, num_heads=4, seed=0)
    prompts = [base.encode_prompt(text) for text in PROMPTS]
    return base.model, heads, prompts, base.eos_token_ids, base.name


def run_arm(model, heads, tree, engine, prompts, max_new_tokens, eos, topk):
    """(mean step ms over the prompts, token lists) of one runtime."""
    step_ms, outputs = [], []
    if heads is None:
        for prompt in prompts:
            result = autoregressive_generate(model, prompt, max_new_tokens=max_new_tokens,
                                             eos_token_ids=eos,
                                             engine="eager" if engine == "eager" else "static")
            step_ms.append(result.decode_ms / max(result.steps, 1))
            outputs.append(result.tokens)
        return statistics.fmean(step_ms), outputs
    decoder = SpeculativeDecoder(model, heads, topk=topk,
                                 engine="eager" if engine == "eager" else "static")
    for prompt in prompts:
        result = decoder.generate(prompt, StaticScheduler(tree), max_new_tokens=max_new_tokens,
                                  eos_token_ids=eos)
        step_ms.append(result.decode_ms / max(result.steps, 1))
        outputs.append(result.tokens)
    return statistics.fmean(step_ms), outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--nodes", type=int, nargs="+", default=[0, 4, 16, 64])
    parser.add_argument("--head-types", nargs="+", default=list(HEAD_TYPES),
                        choices=HEAD_TYPES)
    parser.add_argument("--topk", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_ALIASES))
    parser.add_argument("--tiny", action="store_true",
                        help="tiny random model: check that the script runs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    dtype = resolve_dtype(args.dtype)
    setup = tiny_setup if args.tiny else model_setup
    model, heads, prompts, eos, model_name = setup(args.head_types, dtype)
    prompts = prompts[: args.prompts]
    arms = [("autoregressive", None, None)]
    for head_type in args.head_types:
        num_heads = heads[head_type].num_heads
        trees = [(f"{n} nodes", budget_tree(n, num_heads, topk=args.topk, num_heads=num_heads))
                 for n in args.nodes]
        if num_heads >= 4:
            trees.append(("mc_sim_7b_63", reference_tree("mc_sim_7b_63")))
        arms += [(f"{head_type} {label}", heads[head_type], tree) for label, tree in trees]
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"model {model_name} in {dtype}; {len(prompts)} prompts x {args.max_new_tokens} new "
          f"tokens, {args.rounds} interleaved rounds")
    warm = prompts[0][:4]
    for _, arm_heads, tree in arms:  # first calls (allocation, plan building) are not timed
        for engine in ENGINES:
            run_arm(model, arm_heads, tree, engine, [warm], 3, eos, args.topk)

    samples = {name: {e: [] for e in ENGINES} for name, _, _ in arms}
    identical = {name: True for name, _, _ in arms}
    for round_index in range(args.rounds):
        order = ENGINES if round_index % 2 == 0 else ENGINES[::-1]
        for name, arm_heads, tree in arms:
            outputs = {}
            for engine in order:
                ms, outputs[engine] = run_arm(model, arm_heads, tree, engine, prompts,
                                              args.max_new_tokens, eos, args.topk)
                samples[name][engine].append(ms)
            identical[name] &= outputs["eager"] == outputs["static"]

    rows = []
    print(f"\n{'arm':24s} {'eager ms':>9s} {'static ms':>9s} {'static/eager':>13s} "
          f"{'min..max':>13s} identical")
    for name, _, _ in arms:
        ratios = [s / e for s, e in zip(samples[name]["static"], samples[name]["eager"],
                                        strict=True)]
        row = {
            "arm": name,
            "eager_step_ms": statistics.median(samples[name]["eager"]),
            "static_step_ms": statistics.median(samples[name]["static"]),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "identical": identical[name],
        }
        rows.append(row)
        print(f"{name:24s} {row['eager_step_ms']:9.2f} {row['static_step_ms']:9.2f} "
              f"{row['ratio_median']:12.3f}x {row['ratio_min']:6.3f}..{row['ratio_max']:<6.3f} "
              f"{row['identical']}")
    if args.json:
        meta = run_record(model, model=model_name, prompts=len(prompts),
                          max_new_tokens=args.max_new_tokens, rounds=args.rounds)
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
