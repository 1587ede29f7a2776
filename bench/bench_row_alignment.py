"""How the few-row linear kernel's time depends on the row count (a draft tree's q) on this CPU.

    .venv/bin/python bench/bench_row_alignment.py [--threads 2]

Times ``project_rows`` (model/_row_gemm.py) for the default model's matrix shapes at every
row count 1..33 and a few larger ones, and prints, per shape, ms per product and the cheapest
row count at or above each count (what padding the rows to it would cost). Run it on a quiet
machine; it names the CPU.
"""

from __future__ import annotations

import argparse
import time

import torch

from entmtp.core import cpu_name
from entmtp.model import project_rows

# SmolLM2-135M's matrices: [out, in] and products per timing.
SHAPES = {"q_proj": (576, 576, 200), "k_proj": (192, 576, 200), "mlp_up": (1536, 576, 200),
          "mlp_down": (576, 1536, 200), "lm_head": (49152, 576, 10)}
ROWS = list(range(1, 34)) + [40, 47, 48, 56, 63, 64]


def ms_per_product(weight: torch.Tensor, rows: int, repeats: int) -> float:
    x = torch.randn(rows, weight.shape[1])
    for _ in range(3):
        project_rows(x, weight, None)
    start = time.perf_counter()
    for _ in range(repeats):
        project_rows(x, weight, None)
    return (time.perf_counter() - start) / repeats * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, threads {args.threads}")
    for name, (out, inp, repeats) in SHAPES.items():
        weight = torch.randn(out, inp)
        times = {rows: ms_per_product(weight, rows, repeats) for rows in ROWS}
        cheapest = {rows: min((r for r in ROWS if r >= rows), key=times.__getitem__)
                    for rows in ROWS}
        print(f"{name} {out}x{inp}: rows:ms(cheapest count >= rows)")
        print("  " + " ".join(f"{r}:{times[r]:.2f}({cheapest[r]})" for r in ROWS))


if __name__ == "__main__":
    main()
