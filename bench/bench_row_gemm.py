"""A decoding step of the default model's architecture on each CPU linear kernel, side by side.

    .venv/bin/python bench/bench_row_gemm.py [--model trees/latency/SmolLM2-135M-Instruct.Q4_1]
        [--tokens 1,2,3,4,5,6,8,12,16,24,32,64,256] [--context 256] [--rounds 30] [--threads 2]

Runs the backbone plus lm_head over ``q`` new tokens after ``--context`` cached ones (a plain
step is q = 1; verifying a tree of n nodes is q = n + 1) with every linear layer on
``F.linear``, on the few-row kernel and on the packed oneDNN kernel (``calibrate/_row_gemm.py``;
the last is what entmtp uses on a CPU), in interleaved rounds of the same random-weight model
(``random_model``: the step time does not depend on the weights' values). Prints each one's
trimmed mean ms (the latency profiler's ``trimmed_mean``), the packed kernel's speed-up over each
other one with the interquartile range of the per-round ratios, and the largest logit difference
from ``F.linear``. Names the CPU; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import numpy as np
import torch

from entmtp.calibrate import _row_gemm, random_model
from entmtp.core import cpu_name
from entmtp.runtime import forward_tokens, new_cache, trimmed_mean, truncate_cache

DEFAULT_MODEL = "trees/latency/SmolLM2-135M-Instruct.Q4_1"
KERNELS = ("F.linear", "few-row", "packed")


@contextmanager
def kernel(name: str):
    """Every routed linear on ``name`` while inside (module switches; restored after)."""
    few_rows, available = _row_gemm.FEW_ROWS, _row_gemm.packing_available
    if name == "F.linear":
        _row_gemm.FEW_ROWS = 0
    if name != "packed":
        _row_gemm.packing_available = lambda: False
    try:
        yield
    finally:
        _row_gemm.FEW_ROWS, _row_gemm.packing_available = few_rows, available


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--tokens", default="1,2,3,4,5,6,8,12,16,24,32,64,256")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not _row_gemm.packing_available():
        raise SystemExit("this torch has no oneDNN packed linear: nothing to compare")
    model = random_model(args.model).model  # loads with the row kernels on CPU
    print(f"{args.model}: random weights, fp32, {cpu_name()}, {args.threads} torch threads, "
          f"context {args.context}, {args.rounds} interleaved rounds")
    print("{:>6} {:>11} {:>10} {:>9} {:>22} {:>22} {:>10}".format(
        "tokens", "F.linear ms", "few-row ms", "packed ms", "F.linear/packed [IQR]",
        "few-row/packed [IQR]", "max |diff|"))
    with torch.inference_mode():
        cache = new_cache(model)
        forward_tokens(model, cache, torch.arange(args.context).unsqueeze(0) % 1000)
        for q in (int(t) for t in args.tokens.split(",")):
            ids = (torch.arange(q) + 7).unsqueeze(0)
            times: dict[str, list[float]] = {name: [] for name in KERNELS}
            logits: dict[str, torch.Tensor] = {}
            for round_index in range(args.rounds + 1):  # round 0 warms up (and packs)
                for name in KERNELS:
                    with kernel(name):
                        start = time.perf_counter()
                        _, logits[name] = forward_tokens(model, cache, ids)
                        elapsed = time.perf_counter() - start
                    truncate_cache(cache, args.context)
                    if round_index:
                        times[name].append(elapsed)
            ms = {name: 1000.0 * trimmed_mean(times[name]) for name in KERNELS}
            packed = np.array(times["packed"])
            spans = []
            for name in ("F.linear", "few-row"):
                ratios = np.array(times[name]) / packed
                low, high = np.percentile(ratios, [25, 75])
                spans.append(f"{ms[name] / ms['packed']:.2f}x [{low:.2f}-{high:.2f}]")
            diff = max(float((logits[name] - logits["F.linear"]).abs().max())
                       for name in ("few-row", "packed"))
            print(f"{q:6d} {ms['F.linear']:11.1f} {ms['few-row']:10.1f} {ms['packed']:9.1f} "
                  f"{spans[0]:>22} {spans[1]:>22} {diff:10.2e}", flush=True)


if __name__ == "__main__":
    main()
