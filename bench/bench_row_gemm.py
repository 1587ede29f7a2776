"""A decoding step of the default model's architecture on each CPU linear kernel, side by side.

    .venv/bin/python bench/bench_row_gemm.py [--model trees/latency/SmolLM2-135M-Instruct.Q4_1]
        [--tokens 1,2,3,4,5,6,8,12,16,24,32,64,256] [--context 256] [--rounds 30] [--threads 2]
        [--dtype fp32|bf16]

Runs the backbone plus lm_head over ``q`` new tokens after ``--context`` cached ones (a plain
step is q = 1; verifying a tree of n nodes is q = n + 1) with every linear layer on
``F.linear``, on the few-row kernel and on the packed oneDNN kernel (``model/_row_gemm.py``;
the last is what entmtp uses on a CPU), in interleaved rounds of the same random-weight model
(``random_model``: the step time does not depend on the weights' values). Prints each one's
trimmed mean ms (the latency profiler's ``trimmed_mean``), the packed kernel's speed-up over each
other one with the interquartile range of the per-round ratios, and the largest logit difference
from ``F.linear``. With ``--dtype bf16`` the three run on a bfloat16 copy of the weights, and
the float32 model's packed step runs beside them ("fp32 packed"): what decoding in bfloat16 saves
on this CPU. Names the CPU; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import numpy as np
import torch

from entmtp.core import cpu_name
from entmtp.evaluation import trimmed_mean
from entmtp.model import _row_gemm, random_model
from entmtp.runtime import forward_tokens, new_cache, truncate_cache

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
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not _row_gemm.packing_available():
        raise SystemExit("this torch has no oneDNN packed linear: nothing to compare")
    if args.dtype == "bf16" and not _row_gemm.bf16_packing_available():
        raise SystemExit("oneDNN has no bfloat16 inner product on this CPU: nothing to compare")
    model = random_model(args.model).model  # loads with the row kernels on CPU
    # (label, model, kernel): in bf16 the float32 model's packed step runs beside, as the
    # reference a bf16 step is an alternative to
    runs = [(name, model, name) for name in KERNELS]
    if args.dtype == "bf16":
        low = random_model(args.model, dtype="bfloat16").model
        low.load_state_dict(model.state_dict())  # the same weights, rounded
        runs = [(name, low, name) for name in KERNELS] + [("fp32 packed", model, "packed")]
    print(f"{args.model}: random weights, {args.dtype}, {cpu_name()}, {args.threads} torch "
          f"threads, context {args.context}, {args.rounds} interleaved rounds")
    others = [label for label, _, _ in runs if label != "packed"]
    print(f"{'tokens':>6} " + " ".join(f"{label + ' ms':>14}" for label, _, _ in runs) + " "
          + " ".join(f"{label + '/packed [IQR]':>28}" for label in others) + f" {'max |diff|':>10}")
    with torch.inference_mode():
        caches = {}
        for m in {id(m): m for _, m, _ in runs}.values():
            caches[id(m)] = new_cache(m)
            forward_tokens(m, caches[id(m)], torch.arange(args.context).unsqueeze(0) % 1000)
        for q in (int(t) for t in args.tokens.split(",")):
            ids = (torch.arange(q) + 7).unsqueeze(0)
            times: dict[str, list[float]] = {label: [] for label, _, _ in runs}
            logits: dict[str, torch.Tensor] = {}
            for round_index in range(args.rounds + 1):  # round 0 warms up (and packs)
                for label, m, name in runs:
                    cache = caches[id(m)]
                    with kernel(name):
                        start = time.perf_counter()
                        _, logits[label] = forward_tokens(m, cache, ids)
                        elapsed = time.perf_counter() - start
                    truncate_cache(cache, args.context)
                    if round_index:
                        times[label].append(elapsed)
            ms = {label: 1000.0 * trimmed_mean(times[label]) for label in times}
            packed = np.array(times["packed"])
            spans = []
            for label in others:
                ratios = np.array(times[label]) / packed
                low_q, high_q = np.percentile(ratios, [25, 75])
                spans.append(f"{ms[label] / ms['packed']:.2f}x [{low_q:.2f}-{high_q:.2f}]")
            diff = max(float((logits[name].float() - logits["F.linear"].float()).abs().max())
                       for name in ("few-row", "packed"))
            print(f"{q:6d} " + " ".join(f"{ms[label]:14.1f}" for label, _, _ in runs) + " "
                  + " ".join(f"{span:>28}" for span in spans) + f" {diff:10.2e}", flush=True)


if __name__ == "__main__":
    main()
