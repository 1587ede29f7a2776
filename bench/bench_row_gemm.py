"""A decoding step of the default model's architecture, ``F.linear`` vs the few-row kernel.

    .venv/bin/python bench/bench_row_gemm.py [--model trees/latency/SmolLM2-135M-Instruct.Q4_1]
        [--tokens 1,2,3,4,5,6,8,12,16,24,32,64] [--context 256] [--rounds 30] [--threads 2]

Runs the backbone plus lm_head over ``q`` new tokens after ``--context`` cached ones (a plain
step is q = 1; verifying a tree of n nodes is q = n + 1), once with every linear layer on
``F.linear`` and once on ``calibrate._row_gemm.project_rows``, in interleaved rounds of the same
random-weight model (``random_model``: the step time does not depend on the weights' values).
Prints each one's trimmed mean ms (the latency profiler's ``trimmed_mean``), their ratio and the
largest logit difference.
"""

from __future__ import annotations

import argparse
import time

import torch

from entmtp.calibrate import _row_gemm, random_model
from entmtp.runtime import forward_tokens, new_cache, trimmed_mean, truncate_cache

DEFAULT_MODEL = "trees/latency/SmolLM2-135M-Instruct.Q4_1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--tokens", default="1,2,3,4,5,6,8,12,16,24,32,64")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = random_model(args.model).model  # loads with the few-row kernel on CPU
    few_rows = _row_gemm.FEW_ROWS
    kernels = {"F.linear": 0, "few-row": few_rows}  # value: FEW_ROWS while timing that kernel
    print(f"{args.model}: random weights, fp32, {args.threads} torch threads, context "
          f"{args.context}, {args.rounds} interleaved rounds")
    header = ("tokens", "F.linear ms", "few-row ms", "ratio", "max |diff|")
    print("{:>6} {:>12} {:>11} {:>7} {:>11}".format(*header))
    with torch.inference_mode():
        cache = new_cache(model)
        forward_tokens(model, cache, torch.arange(args.context).unsqueeze(0) % 1000)
        for q in (int(t) for t in args.tokens.split(",")):
            ids = (torch.arange(q) + 7).unsqueeze(0)
            times: dict[str, list[float]] = {name: [] for name in kernels}
            logits: dict[str, torch.Tensor] = {}
            for round_index in range(args.rounds + 1):  # round 0 warms up
                for name, limit in kernels.items():
                    _row_gemm.FEW_ROWS = limit
                    start = time.perf_counter()
                    _, logits[name] = forward_tokens(model, cache, ids)
                    elapsed = time.perf_counter() - start
                    truncate_cache(cache, args.context)
                    if round_index:
                        times[name].append(elapsed)
            _row_gemm.FEW_ROWS = few_rows
            linear, fast = (1000.0 * trimmed_mean(times[name]) for name in kernels)
            diff = float((logits["F.linear"] - logits["few-row"]).abs().max())
            print(f"{q:6d} {linear:12.1f} {fast:11.1f} {linear / fast:6.2f}x {diff:11.2e}",
                  flush=True)


if __name__ == "__main__":
    main()
