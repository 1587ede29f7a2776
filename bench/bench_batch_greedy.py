"""Batched greedy generation (head data, profiles): the static-shape loop vs transformers' cached
forward, side by side on this machine.

    .venv/bin/python bench/bench_batch_greedy.py --data mix.jsonl.gz [--prompts 128]
        [--batch 64] [--max-new-tokens 128] [--rounds 3] [--dtype fp32|bf16|fp16]
        [--threads N] [--json out.json]
    .venv/bin/python bench/bench_batch_greedy.py --tiny --rounds 1   # checks the script only

The prompts (``--data``: a head-data JSONL, e.g. ``bench/train_heads.py --write-jsonl``; the
self-distilled lines, i.e. those without an answer) are sorted by length and generated in
batches of ``--batch`` as ``entmtp heads data`` does, once per loop and round, the loop that
goes first alternating. Prints each loop's generated positions per second (the median round),
the static / transformers time ratio with its min..max over rounds, and how many rows decoded
identically (in fp32 all but a rounding tie; in bf16 a wider batch's kernels round differently
in both loops). Run it on a quiet machine: figures taken beside other jobs mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from entmtp.core import DTYPE_ALIASES, cpu_name
from entmtp.evaluation import run_record
from entmtp.model import _greedy, resolve_dtype

LOOPS = ("transformers", "static")


def tiny_setup(count: int, dtype: torch.dtype):
    """A tiny random Llama and random prompts: checks that the script runs, nothing else."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=48, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (int(n),), generator=generator).tolist()
               for n in torch.randint(2, 40, (count,), generator=generator)]
    return model, prompts, [], "tiny random Llama"


def model_setup(data: Path, count: int, dtype: torch.dtype):
    from entmtp.calibrate import encode_item, read_jsonl_items
    from entmtp.model import load_base

    base = load_base(None, dtype=dtype)
    rows = [row for row in read_jsonl_items(data) if row[1] is None][:count]
    prompts = [encode_item(base, prompt, None, source, max_answer_tokens=1).prompt_ids
               for prompt, _, source in rows]
    return base.model, prompts, base.eos_token_ids, base.name


def generate(model, prompts, loop: str, batch: int, max_new_tokens: int, eos):
    """(seconds, generated positions, token lists) of generating ``prompts`` with ``loop``."""
    sorted_prompts = sorted(prompts, key=len)
    real = _greedy.batch_greedy_steps
    if loop == "transformers":
        _greedy.batch_greedy_steps = lambda model, prompts, _: _greedy.greedy_steps(model, prompts)
    try:
        start = time.perf_counter()
        runs = [run for first in range(0, len(sorted_prompts), batch) for run in
                _greedy.greedy_generate(model, sorted_prompts[first:first + batch],
                                        max_new_tokens=max_new_tokens, eos_token_ids=eos)]
        seconds = time.perf_counter() - start
    finally:
        _greedy.batch_greedy_steps = real
    return seconds, sum(len(run.tokens) for run in runs), [run.tokens for run in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_ALIASES))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tiny", action="store_true",
                        help="tiny random model: check that the script runs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.data is None and not args.tiny:
        parser.error("give --data (a head-data JSONL) or --tiny")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
    if args.tiny:
        model, prompts, eos, model_name = tiny_setup(args.prompts, dtype)
    else:
        model, prompts, eos, model_name = model_setup(args.data, args.prompts, dtype)
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"model {model_name} in {dtype}; {len(prompts)} prompts in batches of {args.batch}, "
          f"at most {args.max_new_tokens} new tokens, {args.rounds} interleaved rounds")
    for loop in LOOPS:  # first calls (allocation, kernel selection) are not timed
        generate(model, prompts[:2], loop, args.batch, 2, eos)
    seconds: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    positions: dict[str, int] = {}
    outputs: dict[str, list[list[int]]] = {}
    for round_index in range(args.rounds):
        for loop in LOOPS if round_index % 2 == 0 else LOOPS[::-1]:
            elapsed, positions[loop], outputs[loop] = generate(
                model, prompts, loop, args.batch, args.max_new_tokens, eos)
            seconds[loop].append(elapsed)
    ratios = [s / t for s, t in zip(seconds["static"], seconds["transformers"], strict=True)]
    identical = sum(a == b for a, b in zip(outputs["static"], outputs["transformers"],
                                           strict=True))
    row = {
        "positions": positions,
        "positions_per_s": {loop: positions[loop] / statistics.median(seconds[loop])
                            for loop in LOOPS},
        "seconds": seconds,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "identical_rows": identical,
        "rows": len(prompts),
    }
    for loop in LOOPS:
        print(f"{loop:13s} {row['positions_per_s'][loop]:8.1f} positions/s "
              f"(median of {args.rounds} rounds, {positions[loop]} positions)")
    print(f"static / transformers time: {row['ratio_median']:.3f}x "
          f"({row['ratio_min']:.3f}..{row['ratio_max']:.3f}); rows decoded identically: "
          f"{identical} of {len(prompts)}")
    if args.json:
        meta = run_record(model, model=model_name, batch=args.batch,
                          max_new_tokens=args.max_new_tokens, rounds=args.rounds,
                          data=None if args.data is None else args.data.name)
        Path(args.json).write_text(json.dumps({"meta": meta, "result": row}, indent=1) + "\n")


if __name__ == "__main__":
    main()
