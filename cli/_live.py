"""Shared pieces of the live-decoding commands (validate, bench, decode): loading a bundle (or
picking a shipped one with --task) with its model and heads, encoding prompts, a progress bar
for the side-by-side runs, measured speed beside the bundle's prediction, and the JSON
report. What they run and compare is ``entmtp.evaluation._validation``'s."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from entmtp.core import (
    CpuInfo,
    EntmtpError,
    atomic_write_json,
    cpu_info,
    cpu_model,
    timing_machine,
)
from entmtp.evaluation import DRIFT_LIMIT, EncodedPrompt, RunProgress
from entmtp.treesearch import Bundle, load_bundle

from ._model_setup import (  # noqa: F401 - re-exported for the live commands
    HEAD_TYPES,
    load_base,
    load_heads_for,
    quiet_transformers,
)


# -- loading ----------------------------------------------------------------------------------
def read_bundle(source: Path) -> tuple[Path, Bundle]:
    from ._export import resolve_bundle_path  # command modules import `app`: not at import time

    path = resolve_bundle_path(Path(source))
    return path, load_bundle(path)


def bundle_source(source: Path | None, task: str | None, head_type: str | None, *,
                  model: str | None, device: str, dtype: str) -> tuple[Path, Bundle, bool]:
    """(path, bundle, picked) of what a live command decodes: ``source`` (a bundle.json or run
    folder), else the shipped bundle that ``task`` picks for this machine (announced on
    stderr). One-line errors without either, and for --task with --model (the shipped bundles
    are the default model's)."""
    if source is not None:
        path, bundle = read_bundle(source)
        # before the model loads: a synthetic bundle, or one of another head type than asked
        bundle.check_compatible(head_type=head_type)
        return path, bundle, False
    if task is None:
        raise EntmtpError("give a bundle (a bundle.json or run folder) or --task TASK to pick "
                          "the shipped one for this machine (`entmtp bundles` lists them)")
    if model is not None:
        raise EntmtpError("--task picks a shipped bundle, made for the default model: with "
                          "--model, give the bundle calibrated for that model")
    from ._bundles import pick_shipped

    path = pick_shipped(task, head_type, device=device, dtype=dtype)
    return (*read_bundle(path), True)


def check_bundle_fits(bundle: Bundle, base, heads, *, hardware_warnings: bool = True) -> bool:
    """One-line ``EntmtpError`` when the bundle was calibrated for another model or head set; a
    warning when its latency model timed steps on another device type, dtype or CPU model than
    this run's (its trees were chosen for other step costs; it decodes correctly all the same).
    ``hardware_warnings=False``: not those warnings (a picked bundle's line said it already).
    Returns whether its step times were timed on a machine like this one (or are not timed)."""
    bundle.check_compatible(
        vocab_size=base.vocab_size,
        hidden_size=base.hidden_size,
        head_type=heads.head_type,
        num_heads=heads.num_heads,
        heads_sha256=heads.sha256(),
    )
    weight = next(base.model.parameters())
    mismatches = [m for m in (latency_mismatch(bundle, weight),
                              cpu_mismatch(bundle, weight.device.type, cpu_info()))
                  if m is not None]
    if hardware_warnings:
        from ._progress import warn

        for mismatch in mismatches:
            warn(mismatch)
    return not mismatches


def latency_mismatch(bundle: Bundle, weight) -> str | None:
    """Why the bundle's latency model does not describe steps of a model whose weights are like
    ``weight`` (a tensor: its device type and dtype), or None (also for untimed bundles)."""
    hardware = bundle.latency.hardware if bundle.latency is not None else {}
    if hardware.get("kind") != "measured":
        return None
    timed = (str(hardware.get("device") or "cpu").split(":")[0],
             str(hardware.get("dtype") or "float32"))
    running = (weight.device.type, str(weight.dtype).removeprefix("torch."))
    if timed == running:
        return None
    return (f"the bundle was searched under {timed[1]} steps on {timed[0]} but this run "
            f"decodes in {running[1]} on {running[0]}: its trees were chosen for other step "
            "costs (pick the bundle made for this device and --dtype, or retarget one)")


def cpu_mismatch(bundle: Bundle, device_type: str, machine: CpuInfo) -> str | None:
    """Why the bundle's CPU step times are not this CPU's (another CPU model: family and model
    differ, the stepping aside), or None (also for untimed bundles, GPU runs and files that do
    not record the CPU)."""
    hardware = bundle.latency.hardware if bundle.latency is not None else {}
    timed_on = hardware.get("cpu_signature")
    if (hardware.get("kind") != "measured" or device_type != "cpu" or not timed_on
            or not machine.signature
            or str(hardware.get("device") or "cpu").split(":")[0] != "cpu"):
        return None
    if cpu_model(str(timed_on)) == cpu_model(machine.signature):
        return None
    return (f"the bundle's step times were measured on {hardware.get('cpu_name', 'a CPU')} "
            f"({timed_on}) but this machine is {machine.name} ({machine.signature}): its trees "
            "were chosen for that CPU's step costs (pick the bundle made for this CPU: "
            "`entmtp bundles` marks it, or `--task` picks it; or measure this one with "
            "`entmtp latency` and `entmtp retarget` the run)")


def check_head_type(head_type: str | None) -> None:
    if head_type is not None and head_type not in HEAD_TYPES:
        raise EntmtpError(f"--head-type {head_type!r}: use one of {', '.join(HEAD_TYPES)}")


# -- speed in context -------------------------------------------------------------------------
@dataclass(frozen=True)
class PredictedSpeed:
    """A bundle's prediction: the replay of its calibration prompts under its latency model,
    on the machine that model was timed on."""

    tokens_per_second: float
    mean_accept_length: float
    autoregressive_tokens_per_second: float | None  # None: not known
    timed_on: str  # "AMD EPYC family 25 model 17 in float32"; "a synthetic latency model"
    measured: bool  # a latency model measured on a machine (not synthetic, not absent)


def predicted_speed(bundle: Bundle) -> PredictedSpeed:
    latency = bundle.latency
    hardware = latency.hardware if latency is not None else bundle.hardware
    predicted = bundle.predicted
    autoregressive = None
    if latency is not None and latency.autoregressive_ms > 0:
        autoregressive = 1000.0 / latency.autoregressive_ms
    elif predicted.speedup_vs_autoregressive:
        autoregressive = predicted.tokens_per_second / predicted.speedup_vs_autoregressive
    measured = hardware.get("kind") == "measured"
    timed_on = (f"{timing_machine(hardware)} in {hardware.get('dtype') or 'float32'}"
                if measured else "a synthetic latency model (not measured)")
    return PredictedSpeed(predicted.tokens_per_second, predicted.mean_accept_length,
                          autoregressive, timed_on, measured)


def speed_line(bundle: Bundle, tokens_per_second: float, prefill_tokens_per_second: float) -> str:
    """Measured decoding speed beside the bundle's prediction and autoregressive decoding's."""
    p = predicted_speed(bundle)
    ar = ("" if p.autoregressive_tokens_per_second is None
          else f", autoregressive decoding {p.autoregressive_tokens_per_second:.2f}")
    return (f"speed: {tokens_per_second:.2f} tokens/s decoding ({prefill_tokens_per_second:.2f} "
            f"with the prefill); predicted {p.tokens_per_second:.2f}{ar} on {p.timed_on}")


def slow_warning(bundle: Bundle, tokens_per_second: float, mean_accept_length: float, *,
                 timed_here: bool) -> str | None:
    """Why measured decoding ran far below the bundle's prediction, or None. Accept lengths
    vary by prompt, so steps per second are compared (tokens/s over accept length), held to
    the benchmark's drift limit (``entmtp.evaluation.DRIFT_LIMIT``). None for a bundle without
    a measured latency model (its prediction is no machine's). ``timed_here``: the bundle was
    timed on a machine like this one (``check_bundle_fits``), so the fix is not another one."""
    p = predicted_speed(bundle)
    values = (tokens_per_second, mean_accept_length, p.tokens_per_second, p.mean_accept_length)
    if not p.measured or not all(math.isfinite(v) and v > 0 for v in values):
        return None
    steps = tokens_per_second / mean_accept_length
    predicted_steps = p.tokens_per_second / p.mean_accept_length
    pace = steps / predicted_steps
    if pace >= 1.0 - DRIFT_LIMIT:
        return None
    fix = ("rerun while it is quiet" if timed_here else
           "use the bundle made for this machine (`entmtp bundles`), or rerun while it is quiet")
    return (f"decoding steps ran at {pace:.2f}x the bundle's predicted pace ({steps:.1f} "
            f"against {predicted_steps:.1f} steps/s: {tokens_per_second:.2f} tokens/s at accept "
            f"length {mean_accept_length:.2f}, predicted {p.tokens_per_second:.2f} at "
            f"{p.mean_accept_length:.2f} on {p.timed_on}), more than {DRIFT_LIMIT:.0%} slower: "
            f"this machine is busy or slower than the one the bundle was timed on; {fix}")


# -- prompts ----------------------------------------------------------------------------------
def task_for(task: str | None, data: str | None, fallback: str | None) -> str:
    """The task to load: the option, else the bundle's task; any valid name labels ``--data``."""
    from entmtp.calibrate import TASKS

    if task is not None:
        if task not in TASKS:
            raise EntmtpError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
        return task
    if fallback in TASKS:
        return str(fallback)
    if data is not None:
        return TASKS[0]
    raise EntmtpError(
        f"the bundle's task {fallback!r} is not a built-in task: pass --task "
        f"({', '.join(TASKS)}) or --data FILE.jsonl"
    )


def load_task_prompts(*, task: str, data: str | None, split: str, num_prompts: int,
                      seed: int) -> list[Any]:
    """TaskPrompts (loaded before the model, so that bad prompt options fail fast)."""
    from entmtp.calibrate import load_prompts

    return load_prompts(task, data=data, split=split, num_prompts=num_prompts, seed=seed)


def encode_prompts(base, prompts: Sequence[Any], max_new_tokens: int) -> list[EncodedPrompt]:
    """Token ids of each TaskPrompt, as the profiler encodes them."""
    encoded = []
    for prompt in prompts:
        ids = base.encode_task_prompt(prompt)
        if not ids:
            raise EntmtpError(f"prompt {prompt.prompt_id} encodes to no tokens: drop it")
        base.check_fits_context(prompt.prompt_id, len(ids), max_new_tokens)
        encoded.append(EncodedPrompt(prompt.index, prompt.prompt_id, list(ids)))
    return encoded


def check_max_new_tokens(max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise EntmtpError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")


# -- measuring ------------------------------------------------------------------------------
@contextmanager
def run_progress(console: Console, description: str, total: int) -> Iterator[RunProgress]:
    """A progress bar of ``total`` runs, fed by ``run_side_by_side``'s ``progress``."""
    from ._progress import progress_bar

    with progress_bar(console) as bar:
        job = bar.add_task(description, total=total, rate="")

        def advance(tokens_per_second: float) -> None:
            rate = f"{tokens_per_second:.1f} tok/s" if math.isfinite(tokens_per_second) else ""
            bar.update(job, advance=1, rate=rate)

        yield advance


# -- output -----------------------------------------------------------------------------------
def write_json(path: Path | None, payload: dict[str, Any], console: Console) -> None:
    if path is None:
        return
    try:
        atomic_write_json(path, _finite(payload))
    except OSError as err:
        raise EntmtpError(f"cannot write {path}: {err.strerror}; choose another --json") from err
    console.print(f"wrote {path}")


def _finite(value: Any) -> Any:
    """JSON has no NaN / Infinity: write them as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
