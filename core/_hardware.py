"""The one description of the machine a latency model (or a benchmark row) was measured on.

``describe_machine`` is what every latency file stores about the machine, whichever command
measured it (``calibrate``, ``entmtp latency``, ``bench``), so that two files from one machine
say so in the same words. A CPU's marketing name does not tell two CPUs apart ("AMD EPYC" names
several generations), so the record also keeps its signature from /proc/cpuinfo, as lscpu
reports it: vendor, family, model and stepping on x86; implementer, architecture, variant, part
and revision on Arm. Readers must treat every field as optional: older files lack some.

torch is imported only to name a CUDA device; the caller passes torch's thread count in.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
# The keys of ``describe_machine``'s record: the same on every latency file of one machine.
MACHINE_KEYS = ("device", "device_name", "cpu_name", "cpu_signature", "cpu_count",
                "torch_threads")
SYNTHETIC_LABEL = "synthetic, not measured"

# /proc/cpuinfo keys that hold a CPU's name (x86; some Arm, MIPS and other kernels).
_NAME_KEYS = ("model name", "hardware", "cpu model")
# (label, /proc/cpuinfo key) of a signature, x86 first, then Arm.
_X86_SIGNATURE = (("family", "cpu family"), ("model", "model"), ("stepping", "stepping"))
_ARM_SIGNATURE = (("architecture", "cpu architecture"), ("variant", "cpu variant"),
                  ("part", "cpu part"), ("revision", "cpu revision"))


@dataclass(frozen=True)
class CpuInfo:
    name: str  # the marketing name, e.g. "AMD EPYC"
    signature: str | None  # e.g. "AuthenticAMD family 26 model 2 stepping 1"; None: unknown


def parse_cpuinfo(text: str) -> CpuInfo | None:
    """The first processor's name and signature in /proc/cpuinfo ``text``; None without a name
    and a signature."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        key = key.strip().lower()
        if colon and key and key not in fields:
            fields[key] = value.strip()
    name = next((fields[key] for key in _NAME_KEYS if fields.get(key)), "")
    signature = None
    for vendor_key, parts in (("vendor_id", _X86_SIGNATURE), ("cpu implementer", _ARM_SIGNATURE)):
        if all(fields.get(key) for _, key in parts):
            vendor = fields.get(vendor_key, "")
            if vendor_key == "cpu implementer" and vendor:
                vendor = f"implementer {vendor}"
            words = [vendor] if vendor else []
            words += [f"{label} {fields[key]}" for label, key in parts]
            signature = " ".join(words)
            break
    if not name and signature is None:
        return None
    return CpuInfo(name=name or _platform_cpu_name(), signature=signature)


def _platform_cpu_name() -> str:
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_info(path: str | os.PathLike = CPUINFO) -> CpuInfo:
    """This machine's CPU from /proc/cpuinfo; its platform name where that file is missing."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return parse_cpuinfo(text) or CpuInfo(name=_platform_cpu_name(), signature=None)


def cpu_name() -> str:
    """This machine's CPU model name (``AMD EPYC``)."""
    return cpu_info().name


def device_name(device: str) -> str:
    """The GPU's name for ``cuda[:N]`` (through torch, imported here), else the CPU's."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def describe_machine(device: str, *, torch_threads: int | None) -> dict[str, Any]:
    """The machine record of a measurement on ``device`` (``cpu``, ``cuda``, ``cuda:N``) with
    torch running ``torch_threads`` intra-op threads; its keys are ``MACHINE_KEYS``."""
    cpu = cpu_info()
    return {
        "device": device.split(":")[0],
        "device_name": device_name(device) if device.startswith("cuda") else cpu.name,
        "cpu_name": cpu.name,
        "cpu_signature": cpu.signature,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch_threads,
    }


def hardware_slug(hardware: Mapping[str, Any]) -> str:
    """A folder-name tag for a latency model: ``nvidia-h200-bfloat16``, ``synthetic-gpu``."""
    parts = [str(hardware.get("device_name") or hardware.get("kind") or "")]
    if hardware.get("dtype"):
        parts.append(str(hardware["dtype"]))
    slug = re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")[:60].strip("-")
    return slug or "retargeted"


def hardware_label(hw: Mapping[str, Any], fallback: str) -> str:
    """``NVIDIA H200, bfloat16, SmolLM2-...``; synthetic models say that they are synthetic."""
    if str(hw.get("kind", "")).startswith("synthetic"):
        return f"{hw['kind']} ({SYNTHETIC_LABEL})"
    pieces = [str(hw.get("device_name") or fallback)]
    if hw.get("dtype"):
        pieces.append(str(hw["dtype"]))
    if hw.get("device") == "cpu" and hw.get("torch_threads"):
        pieces.append(f"{hw['torch_threads']} thread{'s' if hw['torch_threads'] != 1 else ''}")
    if hw.get("model"):
        pieces.append(str(hw["model"]))
    return ", ".join(pieces)
