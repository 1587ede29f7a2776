"""Which one estimate a batch step should choose its tree from: the rows' mean (the runtime's
rule, ``treesearch.batch_estimate``), their median, the most confident row (min) or the least
(max), compared by the exact batched replay of switching schedules on calibration profiles.

    python bench/bench_batch_rule.py --latency LATENCY.json [--runs RUN ...] [--sizes 2,4,8,16]
        [--json OUT.json]

``--latency``: a latency file with a batch axis (``entmtp latency --batch-sizes``); ``--runs``:
run folders (profile.npz + bundle.json) whose schedules switch (default: the shipped profiles
with the shipped ``*-h200`` bundles' schedules, which switch; the CPU ones are one tree each).
For each run, size and rule: the replayed
tokens/s of the run's batch-1 schedule in batches of that size, and each rule over the mean's.
The replay is exact under the latency model, so the ratios are the rules' own effect (no live
timing; nothing else need be quiet).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from entmtp.treesearch import (
    BatchLatency,
    Profile,
    Replayer,
    batch_estimate,
    batch_replay,
    load_bundle,
)

RULES = {
    "mean": batch_estimate,
    "median": lambda values: float(statistics.median(values)),
    "min": lambda values: float(min(values)),
    "max": lambda values: float(max(values)),
}
SHIPPED = [(f"trees/profiles/{task}-{kind}", f"trees/bundles/{task}-{kind}-h200.json")
           for task in ("code", "math", "chat", "lit") for kind in ("medusa", "hydra")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", required=True, type=Path)
    parser.add_argument("--runs", nargs="*", type=Path, default=None)
    parser.add_argument("--sizes", default="2,4,8,16")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    latencies = BatchLatency.load(args.latency)
    sizes = [int(s) for s in args.sizes.split(",")]
    pairs = ([(run, run / "bundle.json") for run in args.runs] if args.runs
             else [(Path(p), Path(b)) for p, b in SHIPPED])
    rows = []
    for profile_dir, bundle_path in pairs:
        schedule = load_bundle(bundle_path).schedule()
        if len(schedule.trees) == 1:
            print(f"{bundle_path}: one tree, no rule to compare")
            continue
        profile = Profile.load(profile_dir / "profile.npz")
        for size in sizes:
            replayer = Replayer(profile, schedule.trees, latencies.for_batch(size))
            rates = {name: batch_replay(replayer, schedule, size, rule=rule).tokens_per_second
                     for name, rule in RULES.items()}
            rows.append({"run": str(profile_dir), "bundle": str(bundle_path), "batch_size": size,
                         "tokens_per_second": rates,
                         "over_mean": {n: rates[n] / rates["mean"] for n in RULES}})
            print(f"{profile_dir.name:12s} batch {size:3d}: "
                  + ", ".join(f"{n} {rates[n] / rates['mean']:.3f}x" for n in RULES))
    if args.json is not None:
        args.json.write_text(json.dumps({"latency": str(args.latency), "rows": rows}, indent=2)
                             + "\n")


if __name__ == "__main__":
    main()
