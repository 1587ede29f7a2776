"""Does torch.compile make the static-shape runtime's CPU forward faster? Side by side, one process.

    .venv/bin/python bench/bench_compile_cpu.py [--rows 1 4 16 64] [--context 256]
        [--rounds 10] [--threads 2] [--json out.json]
    .venv/bin/python bench/bench_compile_cpu.py --tiny --rounds 2   # checks the script only

The static engine's CPU step is ``StaticLlama.backbone`` over the filled part of the cache plus
the lm_head rows, with the model's linears on its CPU row kernels. This times that forward for
``q`` rows (one token, or a tree of q-1 nodes) eager and compiled by inductor (``dynamic=True``:
on the CPU the attended length changes every step, so a graph per length would recompile every
step), in interleaved rounds at the same past length, and checks the compiled hidden states
against the eager ones. Prints per row count the median ms of each arm, the compiled / eager
ratio (median [min..max] over rounds) and the compile time. Random weights of the default
model's architecture (the time does not depend on their values). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from entmtp.core import describe_machine
from entmtp.model import StaticLlama, random_model

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "trees" / "latency" / "SmolLM2-135M-Instruct.Q4_1"


def tiny_model(folder: Path) -> torch.nn.Module:
    """A tiny random Llama built the way the real one is (row kernels included)."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(folder)
    return random_model(str(folder)).model


def forward(static: StaticLlama, cache: torch.Tensor, tokens: torch.Tensor,
            positions: torch.Tensor, slots: torch.Tensor, kv_len: int) -> torch.Tensor:
    """One verification forward: hidden states of every row, logits of every row."""
    hidden = static.backbone(cache, tokens, positions, slots, None, kv_len)
    return static.logits(hidden)


def inputs(rows: int, past: int, vocab: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(rows)
    tokens = torch.randint(0, vocab, (rows,), generator=generator)
    positions = torch.arange(past, past + rows)
    return tokens, positions, positions.clone()


def time_ms(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="tiny random Llama: checks the script")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.tiny:
        import tempfile

        model, what = tiny_model(Path(tempfile.mkdtemp())), "tiny random Llama"
    else:
        model, what = random_model(str(CONFIG)).model, "SmolLM2-135M shape, random"
    static = StaticLlama(model)
    vocab = model.config.vocab_size
    capacity = args.context + max(args.rows) + 8
    compiled = torch.compile(forward, dynamic=True)
    machine = describe_machine("cpu", torch_threads=args.threads)
    print(f"{machine['cpu_name']}, torch {torch.__version__}, {args.threads} threads; {what}, "
          f"fp32, past {args.context} tokens")
    results = []
    with torch.inference_mode():
        for rows in args.rows:
            cache = static.new_cache(capacity)
            cache.normal_()
            tokens, positions, slots = inputs(rows, args.context, vocab)
            start = time.perf_counter()
            # Two lengths first, so the graph is compiled once with a symbolic length.
            for past in (args.context - 2, args.context - 1):
                shifted = inputs(rows, past, vocab)
                compiled(static, cache, *shifted, past + rows)
            compile_s = time.perf_counter() - start
            eager_out = forward(static, cache, tokens, positions, slots, args.context + rows)
            compiled_out = compiled(static, cache, tokens, positions, slots, args.context + rows)
            error = float((eager_out - compiled_out).abs().max() / eager_out.abs().max())
            for _ in range(2):  # warm-up of both arms
                forward(static, cache, tokens, positions, slots, args.context + rows)
                compiled(static, cache, tokens, positions, slots, args.context + rows)
            eager_ms, compiled_ms, ratios = [], [], []
            for index in range(args.rounds):
                arms = [(forward, eager_ms), (compiled, compiled_ms)]
                if index % 2:
                    arms.reverse()
                for fn, sink in arms:
                    sink.append(time_ms(fn, static, cache, tokens, positions, slots,
                                        args.context + rows))
                ratios.append(compiled_ms[-1] / eager_ms[-1])
            row = {"rows": rows, "eager_ms": statistics.median(eager_ms),
                   "compiled_ms": statistics.median(compiled_ms),
                   "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                   "ratio_max": max(ratios), "compile_s": compile_s,
                   "max_relative_error": error}
            results.append(row)
            print(f"q={rows:3d}: eager {row['eager_ms']:8.2f} ms  compiled "
                  f"{row['compiled_ms']:8.2f} ms  compiled/eager {row['ratio_median']:.3f} "
                  f"[{row['ratio_min']:.3f}..{row['ratio_max']:.3f}]  compile "
                  f"{compile_s:5.1f} s  max rel. error {error:.1e}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": machine, "model": what, "context": args.context,
            "rounds": args.rounds, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
