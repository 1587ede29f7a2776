"""The live benchmark (``entmtp bench``): autoregressive decoding, each head set with Medusa's
reference tree, and each bundle's best static tree and schedule, measured side by side on the
same prompts; one row per method with its speedups over its baselines (and their 95% paired
intervals over prompts); per bundle the prediction check (``_prediction``).

Rows: ``autoregressive``; ``medusa-mc_sim_7b_63`` / ``hydra-mc_sim_7b_63``; per bundle (at most
one per head type) ``best-static[TYPE]`` and ``entmtp[TYPE]`` on the head set the bundle was
calibrated for (with one bundle: plain ``best-static`` / ``entmtp``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entmtp.core import HEAD_TYPES
from entmtp.treesearch import Bundle, Profile, runtime_padding

from ._paired import paired_ratio_interval
from ._prediction import PredictionCheck, check_prediction
from ._validation import (
    REFERENCE_TOPK,
    EncodedPrompt,
    Method,
    MethodRuns,
    autoregressive_method,
    bundle_topk,
    profile_live_trajectories,
    ratio,
    reference_for_heads,
    speculative_method,
    step_spread,
    tree_info,
)

REFERENCE_TREE = "mc_sim_7b_63"
# Row roles (``role`` in each JSON row): which rows are baselines of which.
AUTOREGRESSIVE, REFERENCE, BEST_STATIC, ENTMTP = ("autoregressive", "reference", "best-static",
                                                  "entmtp")
REFERENCE_ROWS = tuple(f"{kind}-{REFERENCE_TREE}" for kind in HEAD_TYPES)


@dataclass
class BundleArm:
    """A bundle with the loaded head set it runs on and the names of its two rows."""

    path: Path
    bundle: Bundle
    heads: Any  # DraftHeads of the bundle's type
    tagged: bool  # several bundles: row names carry the head type

    @property
    def head_type(self) -> str:
        return self.bundle.heads.type

    def row_name(self, role: str) -> str:
        return f"{role}[{self.head_type}]" if self.tagged else role

    @property
    def label(self) -> str:
        return self.row_name(ENTMTP)


@contextmanager
def torch_threads(count: int | None) -> Iterator[int]:
    """Torch's intra-op threads set to ``count`` (None: unchanged) inside; restored after."""
    import torch

    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


# -- methods and rows -----------------------------------------------------------------------
def _is_baseline_of(baseline: MethodRuns, run: MethodRuns) -> bool:
    """AR and the reference-tree rows are every row's baselines; a best-static row is the
    baseline of the rows of its head type (and of AR)."""
    if baseline is run:
        return False
    role = baseline.method.info["role"]
    if role in (AUTOREGRESSIVE, REFERENCE):
        return True
    mine = run.method.info.get("heads")
    return role == BEST_STATIC and mine in (None, baseline.method.info.get("heads"))


def speedup_interval(run: MethodRuns, baseline: MethodRuns) -> list[float] | None:
    """95% paired bootstrap interval (over prompts) of ``run``'s speedup over ``baseline``;
    None when a prompt has no decoding time (nothing to compare)."""
    mine, theirs = run.per_prompt(), baseline.per_prompt()
    times = mine["decode_ms"] + theirs["decode_ms"]
    if not times or min(times) <= 0:
        return None
    return list(paired_ratio_interval(mine["decode_tokens"], mine["decode_ms"],
                                      theirs["decode_tokens"], theirs["decode_ms"]))


def bench_rows(runs: Sequence[MethodRuns]) -> list[dict[str, Any]]:
    """One JSON row per measured method, with speedups as ratios to each of its baselines (and
    their 95% intervals over prompts)."""
    reference = runs[0]  # autoregressive: the lossless reference output
    rows = []
    for run in runs:
        baselines = [b for b in runs if _is_baseline_of(b, run)]
        rows.append({
            "name": run.name,
            "heads": None,
            **run.method.info,
            "tokens_per_second": run.tokens_per_second,
            "end_to_end_tokens_per_second": run.end_to_end_tokens_per_second,
            "mean_accept_length": run.mean_accept_length,
            "tokens": run.tokens,
            "decode_tokens": run.decode_tokens,
            "steps": run.steps,
            "step_ms": step_spread(run.results).to_json(),
            "lossless": not run.identical_to(reference),
            "speedup": {b.name: ratio(run.tokens_per_second, b.tokens_per_second)
                        for b in baselines},
            "speedup_ci95": {b.name: speedup_interval(run, b) for b in baselines},
            "per_prompt": run.per_prompt(),
        })
    return rows


def bench_methods(base, head_sets, arms: Sequence[BundleArm], *, engine: str = "auto",
                  graphs: bool = True, pad: bool = True) -> tuple[list[Method], list[Any]]:
    """AR, each head set with the reference tree, then each bundle's best static tree and
    schedule; and the decoders they run on (``engine`` / ``graphs``: their runtime; ``pad``:
    a bundle's trees at its latency model's padded widths, the reference trees unpadded)."""
    from entmtp.runtime import BundleScheduler, SpeculativeDecoder, StaticScheduler

    eos = sorted(base.eos_token_ids)
    decoders = []

    def new_decoder(heads, topk, padded_nodes=None):
        decoders.append(SpeculativeDecoder(base.model, heads, topk=topk, engine=engine,
                                           graphs=graphs, padded_nodes=padded_nodes))
        return decoders[-1]

    methods = [autoregressive_method(base.model, eos=eos, engine=engine, graphs=graphs)]
    methods[0].info["role"] = AUTOREGRESSIVE
    for draft_heads in head_sets:
        tree, cut = reference_for_heads(REFERENCE_TREE, draft_heads.num_heads)
        decoder = new_decoder(draft_heads, REFERENCE_TOPK)
        info = {"role": REFERENCE, "heads": draft_heads.head_type, **tree_info(tree)}
        if cut:
            info["cut_to_depth"] = draft_heads.num_heads
        methods.append(speculative_method(f"{draft_heads.head_type}-{REFERENCE_TREE}", decoder,
                                          StaticScheduler(tree), eos=eos, info=info))
    for arm in arms:
        decoder = new_decoder(arm.heads, arm.bundle.heads.topk,
                              runtime_padding(arm.bundle.latency, pad=pad))
        info = {"role": ENTMTP, "heads": arm.head_type, "trees": len(arm.bundle.trees)}
        bundle_method = speculative_method(arm.row_name(ENTMTP), decoder,
                                           BundleScheduler(arm.bundle.schedule()), eos=eos,
                                           info=info)
        if arm.bundle.best_static is not None:
            static = arm.bundle.best_static.tree
            methods.append(speculative_method(
                arm.row_name(BEST_STATIC), decoder, StaticScheduler(static), eos=eos,
                info={"role": BEST_STATIC, "heads": arm.head_type, **tree_info(static)}))
            # one measurement: measured twice at two moments of a shared machine the two rows
            # would differ by its drift alone
            if arm.bundle.schedule_is_best_static:
                bundle_method.same_as = methods[-1].name
                bundle_method.info["same_runs_as"] = methods[-1].name
        methods.append(bundle_method)
    return methods, decoders


# -- predictions ----------------------------------------------------------------------------
def profile_per_head_set(base, arms: Sequence[BundleArm], prompts: Sequence[EncodedPrompt],
                         reference: MethodRuns) -> dict[str, Profile]:
    """The AR trajectories profiled once per head set the bundles use (with the largest top-k
    any of its bundles drafts)."""
    topk: dict[str, int] = {}
    for arm in arms:
        topk[arm.head_type] = max(topk.get(arm.head_type, 0), bundle_topk(arm.bundle.heads.topk))
    heads = {arm.head_type: arm.heads for arm in arms}
    profiles = {}
    for kind, k in topk.items():
        profiles[kind] = profile_live_trajectories(base, heads[kind], prompts, reference, topk=k)
    return profiles


def bundle_prediction(arm: BundleArm, profile: Profile, runs: Sequence[MethodRuns],
                      rows: Sequence[dict[str, Any]], prompt_ids: Sequence[str]
                      ) -> PredictionCheck:
    """The bundle's prediction check on these prompts, against its measured rows."""
    by_name = {run.name: run for run in runs}
    row = next(r for r in rows if r["name"] == arm.row_name(ENTMTP))
    autoregressive = next(run for run in runs if run.method.info["role"] == AUTOREGRESSIVE)
    return check_prediction(
        arm.bundle, profile, by_name[row["name"]], autoregressive=autoregressive,
        best_static=by_name.get(arm.row_name(BEST_STATIC)), speedups=row["speedup"],
        speedup_intervals=row["speedup_ci95"], reference_rows=REFERENCE_ROWS,
        prompt_ids=prompt_ids, bundle_path=str(arm.path), oracle_name=arm.row_name("oracle"))
