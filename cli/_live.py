"""Shared pieces of the live-decoding commands (validate, bench, decode): loading a bundle with
its model and heads, encoding prompts, a progress bar for the side-by-side runs and the JSON
report. What they run and compare is ``entmtp.evaluation._validation``'s."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from entmtp.core import CpuInfo, EntmtpError, atomic_write_json, cpu_info
from entmtp.evaluation import EncodedPrompt, RunProgress
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


def check_bundle_fits(bundle: Bundle, base, heads) -> None:
    """One-line ``EntmtpError`` when the bundle was calibrated for another model or head set; a
    warning when its latency model timed steps on another device type or dtype than this run's
    (its trees were chosen for other step costs; it decodes correctly all the same)."""
    bundle.check_compatible(
        vocab_size=base.vocab_size,
        hidden_size=base.hidden_size,
        head_type=heads.head_type,
        num_heads=heads.num_heads,
        heads_sha256=heads.sha256(),
    )
    weight = next(base.model.parameters())
    for mismatch in (latency_mismatch(bundle, weight),
                     cpu_mismatch(bundle, weight.device.type, cpu_info())):
        if mismatch is not None:
            from ._progress import warn

            warn(mismatch)


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
    if _cpu_model(str(timed_on)) == _cpu_model(machine.signature):
        return None
    return (f"the bundle's step times were measured on {hardware.get('cpu_name', 'a CPU')} "
            f"({timed_on}) but this machine is {machine.name} ({machine.signature}): its trees "
            "were chosen for that CPU's step costs (pick the bundle made for this CPU, or "
            "measure this one with `entmtp latency` and `entmtp retarget` the run)")


def _cpu_model(signature: str) -> str:
    """``GenuineIntel family 6 model 167``: a signature without its stepping."""
    return signature.split(" stepping")[0]


def check_head_type(head_type: str | None) -> None:
    if head_type is not None and head_type not in HEAD_TYPES:
        raise EntmtpError(f"--head-type {head_type!r}: use one of {', '.join(HEAD_TYPES)}")


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
