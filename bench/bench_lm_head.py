"""The vocabulary projection of a few rows: ``F.linear`` vs ``project_rows`` (``weight @ x.T``,
a single row duplicated to two), the kernel every linear layer uses on CPU (``_row_gemm``).

    .venv/bin/python bench/bench_lm_head.py [--vocab 49152] [--hidden 576] [--rounds 200]
                                            [--threads 2]

The default shape is the default model's lm_head (SmolLM2-135M: vocab 49152, hidden 576, fp32);
weights are random (a matmul's time does not depend on the values). Both kernels run in
interleaved rounds; each row prints each one's trimmed mean ms (the latency profiler's
``trimmed_mean``), their ratio, and the largest absolute difference of their results.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from entmtp.evaluation import trimmed_mean
from entmtp.model import project_rows

ROW_COUNTS = (1, 2, 3, 4, 5, 8, 16, 32, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, generator=generator) / args.hidden ** 0.5
    print(f"lm_head [{args.vocab}, {args.hidden}] fp32, {args.threads} torch threads, "
          f"{args.rounds} interleaved rounds")
    header = ("rows", "F.linear ms", "project_rows ms", "ratio", "max |diff|")
    print("{:>5} {:>12} {:>16} {:>7} {:>11}".format(*header))
    with torch.inference_mode():
        for rows in ROW_COUNTS:
            x = torch.randn(rows, args.hidden, generator=generator)
            calls = {"linear": lambda x=x: F.linear(x, weight),
                     "rows": lambda x=x: project_rows(x, weight, None)}
            for call in calls.values():  # warm-up
                call()
            times: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, call in calls.items():
                    start = time.perf_counter()
                    call()
                    times[name].append(time.perf_counter() - start)
            diff = float((calls["linear"]() - calls["rows"]()).abs().max())
            linear, fast = (1000.0 * trimmed_mean(times[name]) for name in ("linear", "rows"))
            print(f"{rows:5d} {linear:12.2f} {fast:16.2f} {linear / fast:6.2f}x {diff:11.2e}")


if __name__ == "__main__":
    main()
