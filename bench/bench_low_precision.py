"""Greedy losslessness in low precision: where a bundle's decoding departs from plain greedy.

    .venv/bin/python bench/bench_low_precision.py --bundle trees/bundles/code-hydra-h200.json \
        [--bundle ...] [--dtype bf16 --dtype fp16] [--device cuda] [--prompts 10] \
        [--max-new-tokens 128] [--json low-precision.json]

For each dtype, the model (once) and each bundle's heads are loaded in it (the CLI's own loading and
bundle check), each held-out prompt is decoded with the bundle's schedule
(``SpeculativeDecoder.generate``) and by plain greedy decoding (``autoregressive_generate``) in
that same dtype, and the first position where the two outputs differ is judged with
``entmtp.evaluation._departures``: the plain decoder's logits there are recomputed and the gap
between its token and the decoder's token is given in units of the dtype's resolution at the
top logit (a near-tie when at most ``NEAR_TIE_ULPS``). Prints one row per bundle and dtype;
with ``--json``, every departure (position, the step and tree that emitted it, the gaps).
fp32 may be given as a control: there the outputs must be identical.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from entmtp.cli._live import check_bundle_fits, encode_prompts, load_task_prompts, read_bundle
from entmtp.evaluation import NEAR_TIE_ULPS, check_departure
from entmtp.model import load_base, load_heads_for
from entmtp.runtime import BundleScheduler, SpeculativeDecoder, autoregressive_generate


def emitting_step(step_log, position: int) -> dict[str, Any]:
    """The step that emitted generated token ``position`` (the prefill emits token 0)."""
    for index, step in enumerate(step_log):
        if step.position < position <= step.position + step.accept_length:
            offset = position - step.position
            return {"step": index, "tree_index": step.tree_index, "num_nodes": step.num_nodes,
                    "token_in_step": offset, "bonus_token": offset == step.accept_length}
    return {"step": None, "tree_index": None, "num_nodes": None, "token_in_step": 0,
            "bonus_token": False}


def run_bundle(args: argparse.Namespace, base, heads, bundle, dtype: str) -> dict[str, Any]:
    check_bundle_fits(bundle, base, heads)
    task = args.task or bundle.task
    prompts = encode_prompts(base, load_task_prompts(
        task=task, data=args.data, split=args.split, num_prompts=args.prompts, seed=args.seed),
        args.max_new_tokens)
    decoder = SpeculativeDecoder(base.model, heads, topk=bundle.heads.topk)
    eos = sorted(base.eos_token_ids)
    rows = []
    for prompt in prompts:
        decoded = decoder.generate(prompt.ids, BundleScheduler(bundle.schedule()),
                                   max_new_tokens=args.max_new_tokens, eos_token_ids=eos)
        plain = autoregressive_generate(base.model, prompt.ids,
                                        max_new_tokens=args.max_new_tokens, eos_token_ids=eos)
        departure = check_departure(base.model, prompt.ids, decoded.tokens, plain.tokens)
        row: dict[str, Any] = {"prompt_id": prompt.prompt_id, "tokens": len(plain.tokens),
                               "departed": departure is not None}
        if departure is not None:
            row["departure"] = {**departure.to_dict(),
                                **emitting_step(decoded.step_log, departure.position)}
        rows.append(row)
    departures = [row["departure"] for row in rows if row["departed"]]
    gaps = [d["gap_decoded_ulps"] for d in departures]
    return {
        "dtype": dtype,
        "head_type": heads.head_type,
        "task": task,
        "prompts": len(rows),
        "departed": len(departures),
        "departed_fraction": len(departures) / len(rows) if rows else 0.0,
        "all_near_ties": all(d["near_tie"] for d in departures),
        "not_near_ties": [row["prompt_id"] for row in rows
                          if row["departed"] and not row["departure"]["near_tie"]],
        "positions": [d["position"] for d in departures],
        "median_position": statistics.median(d["position"] for d in departures)
        if departures else None,
        "max_gap_ulps": max(gaps) if gaps else None,
        "gaps_ulps": gaps,
        "plain_logits_consistent": all(d["top1_token"] == d["plain_token"] for d in departures),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", action="append", required=True,
                        help="bundle.json or a run folder (repeatable)")
    parser.add_argument("--dtype", action="append", help="bf16, fp16, fp32 (repeatable; "
                        "default: bf16 and fp16)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None)
    parser.add_argument("--heads", default=None)
    parser.add_argument("--task", default=None, help="default: the bundle's task")
    parser.add_argument("--data", default=None)
    parser.add_argument("--split", default="heldout")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    bundles = [read_bundle(Path(source)) for source in args.bundle]
    results = []
    for dtype in args.dtype or ["bf16", "fp16"]:
        base = load_base(args.model, device=args.device, dtype=dtype)  # once per dtype
        heads_by_key: dict[tuple[str, str], Any] = {}
        for path, bundle in bundles:
            key = (bundle.heads.type, bundle.heads.sha256)
            if key not in heads_by_key:
                heads_by_key[key] = load_heads_for(base, args.heads, bundle.heads.type, args.model,
                                                   bundle.heads.sha256)
            result = run_bundle(args, base, heads_by_key[key], bundle, dtype)
            results.append({"bundle": str(path), **result})
    print("first departure from plain greedy decoding in the same dtype (near-tie: gap <= "
          f"{NEAR_TIE_ULPS:g} units of the dtype's resolution at the top logit)")
    print(f"{'bundle':>28} {'dtype':>6} {'prompts':>7} {'departed':>8} {'median pos':>10} "
          f"{'max gap ulps':>12} {'all near-ties':>13}")
    for r in results:
        median = "-" if r["median_position"] is None else f"{r['median_position']:g}"
        gap = "-" if r["max_gap_ulps"] is None else f"{r['max_gap_ulps']:.2f}"
        print(f"{Path(r['bundle']).stem[:28]:>28} {r['dtype']:>6} {r['prompts']:>7} "
              f"{r['departed']:>8} {median:>10} {gap:>12} {str(r['all_near_ties']):>13}")
    if args.json is not None:
        report = {"device": args.device, "max_new_tokens": args.max_new_tokens,
                  "split": args.split, "prompts": args.prompts,
                  "near_tie_ulps": NEAR_TIE_ULPS, "command": " ".join(sys.argv),
                  "results": results}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
