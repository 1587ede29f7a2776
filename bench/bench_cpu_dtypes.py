"""float32 against bfloat16 decoding on this CPU, side by side: each with its own bundle.

    .venv/bin/python bench/bench_cpu_dtypes.py \
        --bundle-fp32 trees/bundles/code-hydra-cpu2-xeon.json \
        --bundle-bf16 trees/bundles/code-hydra-cpu2-xeon-bf16.json \
        [--task code] [--split heldout] [--prompts 10] [--max-new-tokens 128] [--threads 2] \
        [--model M --heads H --data D] [--json out.json]

`entmtp bench` runs one dtype per process, so it cannot say what decoding in bfloat16 gains over
float32 on the same machine at the same moment. Here the model is loaded twice (float32 and
bfloat16, with the bundles' heads in each) and four rows run on the same prompts, interleaved per
prompt in a carryover-balanced order (``run_side_by_side``, as in `entmtp bench`): plain greedy
decoding and the float32 bundle in float32, plain greedy decoding and the bfloat16 bundle in
bfloat16. Prints each row's decode tokens/s, the ratios that matter with their paired 95%
intervals over prompts, on how many prompts each bundle's output departs from plain greedy
decoding in its own dtype, and on how many bfloat16 greedy decoding departs from float32's.
Names the CPU; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from entmtp.cli._live import check_bundle_fits, encode_prompts, load_task_prompts, read_bundle
from entmtp.core import cpu_name
from entmtp.evaluation import (
    autoregressive_method,
    ratio,
    run_side_by_side,
    speculative_method,
    speedup_interval,
)
from entmtp.model import load_base, load_heads_for
from entmtp.runtime import BundleScheduler, SpeculativeDecoder
from entmtp.treesearch import runtime_padding

# row name -> (dtype, whether the row decodes with that dtype's bundle)
ROWS = {"fp32 autoregressive": ("fp32", False), "fp32 bundle": ("fp32", True),
        "bf16 autoregressive": ("bf16", False), "bf16 bundle": ("bf16", True)}
# (row, baseline): the ratios printed
RATIOS = (("bf16 autoregressive", "fp32 autoregressive"), ("bf16 bundle", "fp32 bundle"),
          ("fp32 bundle", "fp32 autoregressive"), ("bf16 bundle", "bf16 autoregressive"),
          ("bf16 bundle", "fp32 autoregressive"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle-fp32", type=Path, required=True)
    parser.add_argument("--bundle-bf16", type=Path, required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--heads", default=None, help="default: the shipped heads the bundles name")
    parser.add_argument("--task", default=None, help="default: the bf16 bundle's task")
    parser.add_argument("--data", default=None)
    parser.add_argument("--split", default="heldout")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    bundles = {"fp32": read_bundle(args.bundle_fp32), "bf16": read_bundle(args.bundle_bf16)}
    task = args.task or bundles["bf16"][1].task
    prompts = load_task_prompts(task=task, data=args.data, split=args.split,
                                num_prompts=args.prompts, seed=args.seed)
    methods, encoded = [], None
    for dtype in ("fp32", "bf16"):
        path, bundle = bundles[dtype]
        base = load_base(args.model, device="cpu", dtype=dtype)
        heads = load_heads_for(base, args.heads, bundle.heads.type, args.model,
                               bundle.heads.sha256)
        check_bundle_fits(bundle, base, heads)  # warns if the bundle was timed in another dtype
        encoded = encoded or encode_prompts(base, prompts, args.max_new_tokens)
        eos = sorted(base.eos_token_ids)
        plain = autoregressive_method(base.model, eos=eos)
        plain.name = f"{dtype} autoregressive"
        decoder = SpeculativeDecoder(base.model, heads, topk=bundle.heads.topk,
                                     padded_nodes=runtime_padding(bundle.latency, pad=True))
        methods += [plain, speculative_method(f"{dtype} bundle", decoder,
                                              BundleScheduler(bundle.schedule()), eos=eos,
                                              info={"bundle": str(path)})]
    runs = {run.name: run for run in run_side_by_side(methods, encoded,
                                                       max_new_tokens=args.max_new_tokens)}

    print(f"{task}: {len(encoded)} {args.split} prompts x {args.max_new_tokens} new tokens, "
          f"{cpu_name()}, {args.threads} torch threads; rows interleaved per prompt")
    print(f"{'row':>20} {'tok/s':>7} {'accept':>7} {'prompts departing from plain greedy':>36}")
    departing = {}
    for name, (dtype, bundled) in ROWS.items():
        run = runs[name]
        if bundled:  # prompt indices whose output differs from plain greedy in the same dtype
            departing[name] = run.identical_to(runs[f"{dtype} autoregressive"])
        shown = f"{len(departing[name])} of {len(encoded)}" if bundled else "-"
        print(f"{name:>20} {run.tokens_per_second:7.2f} {run.mean_accept_length:7.3f} "
              f"{shown:>36}")
    ratios = {}
    for row, baseline in RATIOS:
        value = ratio(runs[row].tokens_per_second, runs[baseline].tokens_per_second)
        interval = speedup_interval(runs[row], runs[baseline])
        ratios[f"{row} / {baseline}"] = {"ratio": value, "ci95": interval}
        span = "" if interval is None else f" [{interval[0]:.2f}-{interval[1]:.2f}]"
        print(f"{row + ' / ' + baseline:>44}: {value:.2f}x{span}")
    apart = len(runs["bf16 autoregressive"].identical_to(runs["fp32 autoregressive"]))
    print(f"bf16 greedy decoding departs from fp32 greedy decoding on {apart} of "
          f"{len(encoded)} prompts")
    if args.json is not None:
        report = {"task": task, "split": args.split, "prompts": len(encoded),
                  "max_new_tokens": args.max_new_tokens, "cpu": cpu_name(),
                  "torch_threads": args.threads, "command": " ".join(sys.argv),
                  "bundles": {dtype: str(path) for dtype, (path, _) in bundles.items()},
                  "rows": {name: {"tokens_per_second": runs[name].tokens_per_second,
                                  "mean_accept_length": runs[name].mean_accept_length,
                                  "prompts_departing_from_plain_greedy": departing.get(name)}
                           for name in ROWS},
                  "ratios": ratios, "bf16_greedy_departs_from_fp32_on": apart}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
