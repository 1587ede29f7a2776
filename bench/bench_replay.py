"""How fast is exact replay? Prints ms per call over a ~100k-position synthetic profile.

    .venv/bin/python bench/bench_replay.py [--traces 250] [--positions 400] [--repeat 5]

Rows: the estimator alone, one full ``replay`` of a 3-tree schedule (accept lengths computed
from scratch), the same schedule's total time on a prepared ``Replayer`` (what each step of the
schedule search pays), and the hindsight oracle.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from entmtp.treesearch import (
    EntropyEstimator,
    LatencyModel,
    Replayer,
    Schedule,
    best_tree,
    replay,
    synthetic_profile,
)


def best_ms(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000.0 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=250)
    parser.add_argument("--positions", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    profile = synthetic_profile(num_traces=args.traces, positions=args.positions, seed=0)
    ranks = profile.ranks()
    trees = tuple(best_tree(ranks, n) for n in (3, 15, 63))
    estimator = EntropyEstimator.ema(0.2)
    schedule = Schedule(trees[::-1], (0.8, 2.0), estimator)
    latency = LatencyModel.cpu_like()
    replayer = Replayer(profile, trees, latency)
    tree_at = replayer.schedule_tree_at(estimator, (0.8, 2.0), (2, 1, 0))
    entropy = profile.entropy()
    starts = replayer.starts

    rows = [
        ("ema estimates", lambda: estimator.estimates(entropy, trace_starts=starts)),
        (
            "window(32) estimates",
            lambda: EntropyEstimator.window(32).estimates(entropy, trace_starts=starts),
        ),
        ("replay(schedule) from scratch", lambda: replay(profile, schedule, latency)),
        ("Replayer.time_ms(schedule)", lambda: replayer.time_ms(tree_at)),
        ("Replayer.oracle()", replayer.oracle),
    ]
    result = replay(profile, schedule, latency)
    print(
        f"profile: {len(profile.traces)} traces, {profile.num_positions} positions "
        f"({result.tokens} decode tokens); schedule: {result.steps} steps, mean accept length "
        f"{result.mean_accept_length:.3f}, {result.tokens_per_second:.2f} tokens/s modelled"
    )
    for name, call in rows:
        ms = best_ms(call, args.repeat)
        per_k = 1000.0 * ms / profile.num_positions
        print(f"{name:32s} {ms:9.2f} ms   ({per_k:.3f} ms per 1k positions)")


if __name__ == "__main__":
    main()
