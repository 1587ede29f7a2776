"""What does profiling cost on top of generating the trajectories? Prints the ratio.

    .venv/bin/python bench/bench_profiler.py [--task chat] [--prompts 4] [--max-new-tokens 32]
                                             [--batch-size 4] [--heads 4] [--head-type medusa]
                                             [--threads N]

On the default model (SmolLM2-135M-Instruct) with freshly initialised heads (their cost does not
depend on training): the same prompts are (a) only generated greedily, batched as the profiler
does, then (b) profiled end to end (generation + teacher-forced scoring + head ranks). Also
reports how often the teacher-forced argmax disagrees with the cached greedy token (float
differences between the two forward paths).
"""

from __future__ import annotations

import argparse
import time

import torch

from entmtp.calibrate import load_prompts, profile_prompts
from entmtp.core import HEAD_TYPES
from entmtp.model import greedy_generate, load_base_model, new_heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="chat")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-type", default="medusa", choices=HEAD_TYPES)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    base = load_base_model()
    heads = new_heads(base.model, head_type=args.head_type, num_heads=args.heads)
    prompts = load_prompts(args.task, num_prompts=args.prompts)
    ids = sorted((base.encode_task_prompt(p) for p in prompts), key=len)  # as the profiler does
    eos = sorted(base.eos_token_ids)

    with torch.inference_mode():
        start = time.perf_counter()
        generated = []
        for i in range(0, len(ids), args.batch_size):
            generated += [run.tokens for run in greedy_generate(
                base.model, ids[i : i + args.batch_size], max_new_tokens=args.max_new_tokens,
                eos_token_ids=eos)]
        generate_s = time.perf_counter() - start

    start = time.perf_counter()
    profile = profile_prompts(base, heads, prompts, max_new_tokens=args.max_new_tokens,
                              batch_size=args.batch_size)
    profile_s = time.perf_counter() - start

    tokens = sum(len(g) for g in generated)
    mismatches = _argmax_mismatches(base, ids, generated)
    print(f"model {base.name}, {args.head_type} x{args.heads}, task {args.task}, "
          f"{len(prompts)} prompts, {tokens} generated tokens, batch {args.batch_size}, "
          f"threads {torch.get_num_threads()}")
    print(f"{'generate only':<16}{generate_s:9.2f} s {tokens / generate_s:9.1f} tokens/s")
    print(f"{'profile':<16}{profile_s:9.2f} s {profile.num_positions / profile_s:9.1f} tokens/s")
    print(f"profile / generate: {profile_s / generate_s:.2f}x")
    print(f"teacher-forced argmax != greedy token: {mismatches} of {tokens} positions")


def _argmax_mismatches(base, prompt_ids, generated) -> int:
    count = 0
    with torch.inference_mode():
        for prompt, gen in zip(prompt_ids, generated, strict=True):
            logits = base.model(torch.tensor([prompt + gen])).logits[0]
            chosen = logits[len(prompt) - 1 : len(prompt) - 1 + len(gen)].argmax(-1)
            count += int((chosen != torch.tensor(gen)).sum())
    return count


if __name__ == "__main__":
    main()
