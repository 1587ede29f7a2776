"""Every weight matrix of one decoding step over a few rows: few-row, oneDNN and packed oneDNN.

    .venv/bin/python bench/bench_linear_kernels.py [--rows 1,2,3,4,5,6,7,8,12,16] [--rounds 12]
                                                   [--threads 2]

Multiplies ``q`` rows by every matrix of the default model's architecture (SmolLM2-135M: 30
layers of q, k, v, o, gate, up, down, then the 49152 x 576 lm_head; random fp32 weights, which
do not change a matmul's time) once per round, with the matrices streamed from memory as in a
real step. Kernels (``model/_row_gemm.py``): the few-row kernel (``project_rows`` of a
weight used once), ``torch.ops.mkldnn._linear_pointwise`` on the plain weight (oneDNN), and
the packed kernel every CPU linear uses (``project_rows(..., reused=True)``: oneDNN over a copy
of the weight packed once, before the first round). Interleaved rounds; prints each kernel's
trimmed mean ms per step (the latency profiler's ``trimmed_mean``), the ratios to the packed
kernel, and the largest difference of the lm_head's output from the few-row kernel's.
"""

from __future__ import annotations

import argparse
import time

import torch

from entmtp.core import cpu_name
from entmtp.evaluation import trimmed_mean
from entmtp.model import project_rows, row_kernel

HIDDEN, KV, INTERMEDIATE, VOCAB, LAYERS = 576, 192, 1536, 49152, 30


def step_shapes() -> list[tuple[int, int]]:
    layer = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN),
             (INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
    return layer * LAYERS + [(VOCAB, HIDDEN)]


def onednn_linear(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(rows, weight, None, "none", [], "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,3,4,5,6,7,8,12,16")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(*shape, generator=generator) * 0.02 for shape in step_shapes()]
    kernels = {"few-row": lambda x, w: project_rows(x, w, None), "oneDNN": onednn_linear,
               "packed": lambda x, w: project_rows(x, w, None, reused=True)}
    print(f"{len(weights)} matrices a step, fp32, {cpu_name()}, {args.threads} torch threads, "
          f"{args.rounds} interleaved rounds, packed kernel: {row_kernel(weights[0])}")
    print("{:>4} {:>11} {:>10} {:>10} {:>15} {:>14} {:>11}".format(
        "rows", "few-row ms", "oneDNN ms", "packed ms", "few-row/packed", "oneDNN/packed",
        "max |diff|"))
    with torch.inference_mode():
        for count in (int(r) for r in args.rows.split(",")):
            inputs = [torch.randn(count, w.shape[1], generator=generator) for w in weights]
            times: dict[str, list[float]] = {name: [] for name in kernels}
            for round_index in range(args.rounds + 1):  # round 0 warms up (and packs)
                for name, kernel in kernels.items():
                    start = time.perf_counter()
                    for x, w in zip(inputs, weights, strict=True):
                        kernel(x, w)
                    if round_index:
                        times[name].append((time.perf_counter() - start) * 1000.0)
            reference = kernels["few-row"](inputs[-1], weights[-1])
            diff = max((kernels[name](inputs[-1], weights[-1]) - reference).abs().max().item()
                       for name in ("oneDNN", "packed"))
            ms = {name: trimmed_mean(times[name]) for name in kernels}
            print(f"{count:>4} {ms['few-row']:>11.1f} {ms['oneDNN']:>10.1f} {ms['packed']:>10.1f} "
                  f"{ms['few-row'] / ms['packed']:>14.2f}x {ms['oneDNN'] / ms['packed']:>13.2f}x "
                  f"{diff:>11.2e}")


if __name__ == "__main__":
    main()
