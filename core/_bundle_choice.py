"""Which bundle's step times describe this machine best.

A bundle's trees were chosen for the step costs of the machine its latency model was timed on.
Given bundles as their JSON objects and the machine that will decode, ``rank_bundles`` orders
them best first, each with its reason in words, and ``pick_bundle`` chooses a task's bundle
(and, unless told, its head type). The order: the same device (CPU or GPU) first, then the same
dtype, then how close the timing machine is: this CPU model (its signature without the
stepping) or this GPU, then this CPU's vendor and family, then its vendor, then any CPU.

Pure: JSON objects in, nothing read, no torch. The hardware record read is the latency model's
(``latency.hardware``, what the step times describe), else the bundle's own ``hardware``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import EntmtpError
from ._hardware import CpuInfo

# How close the machine a bundle was timed on is to this one; greater is closer.
OTHER_DEVICE, SAME_DEVICE, SAME_VENDOR, SAME_FAMILY, SAME_MODEL = range(5)

# The words of a CPU signature (``core/_hardware.parse_cpuinfo``) that label a value: x86, Arm.
_SIGNATURE_LABELS = ("family", "model", "stepping", "architecture", "variant", "part",
                     "revision")
# Parts of a signature that tell two samples of one CPU model apart, not their step costs.
_MINOR_LABELS = ("stepping", "revision")


@dataclass(frozen=True)
class Machine:
    """The machine that will decode, as the bundles' hardware records describe one."""

    device: str  # "cpu" or "cuda" (an index such as cuda:1 is dropped)
    dtype: str  # torch's name: "float32", "bfloat16" or "float16"
    cpu: CpuInfo
    gpu_name: str | None = None  # on "cuda": the GPU's name, when known

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", self.device.split(":")[0])

    def label(self) -> str:
        """``cpu, float32, AMD EPYC family 25 model 17``."""
        where = (self.gpu_name or "a GPU") if self.device == "cuda" else cpu_label(
            self.cpu.name, self.cpu.signature)
        return f"{self.device}, {self.dtype}, {where}"


@dataclass(frozen=True)
class BundleFit:
    """One bundle against the machine: how close its timing machine is, and why in words."""

    name: str  # the caller's key for the bundle (its path)
    task: str
    head_type: str
    level: int  # OTHER_DEVICE .. SAME_MODEL
    same_dtype: bool
    reason: str  # "timed on this CPU model (AMD EPYC family 25 model 17)"
    timed_on: str  # "AMD EPYC family 25 model 17", "NVIDIA H200"
    dtype: str  # the dtype its steps were timed in
    tokens_per_second: float | None  # its prediction, on the machine it was timed on
    speedup: float | None  # its predicted speedup over autoregressive decoding there
    closeness: tuple[Any, ...]  # the sort key of the fit alone; greater is closer

    @property
    def exact(self) -> bool:
        """Timed on this CPU model or GPU, in this dtype: its prediction is this machine's."""
        return self.level == SAME_MODEL and self.same_dtype

    @property
    def order(self) -> tuple[Any, ...]:
        """Best first when sorted in reverse: the fit, then the faster prediction."""
        return (*self.closeness, self.tokens_per_second or 0.0)


@dataclass(frozen=True)
class Pick:
    """The bundle chosen for a task, and why its head type when the caller did not name one."""

    fit: BundleFit
    head_note: str | None  # None: the caller named the head type

    def describe(self) -> str:
        """The reason, with the head type's where it was chosen here."""
        return self.fit.reason + (f"; {self.head_note}" if self.head_note else "")


# -- signatures -------------------------------------------------------------------------------
def _signature_parts(signature: str) -> tuple[str, list[tuple[str, str]]]:
    """(vendor, [(label, value), ...]) of a signature: ``AuthenticAMD family 25 model 17
    stepping 1`` -> ("AuthenticAMD", [("family", "25"), ("model", "17"), ("stepping", "1")])."""
    words = signature.split()
    start = next((i for i, w in enumerate(words) if w in _SIGNATURE_LABELS), len(words))
    pairs = [(words[i], words[i + 1]) for i in range(start, len(words) - 1, 2)]
    return " ".join(words[:start]), pairs


def cpu_model(signature: str) -> str:
    """A CPU signature without its stepping or revision: CPUs with equal ones are one model
    (``GenuineIntel family 6 model 167``)."""
    vendor, pairs = _signature_parts(signature)
    kept = [f"{label} {value}" for label, value in pairs if label not in _MINOR_LABELS]
    return " ".join([vendor, *kept] if vendor else kept)


def cpu_label(name: str | None, signature: str | None) -> str:
    """``AMD EPYC family 25 model 17``: a CPU's name and model, without the vendor word."""
    if not signature:
        return name or "an unknown CPU"
    _, pairs = _signature_parts(signature)
    model = " ".join(f"{label} {value}" for label, value in pairs if label not in _MINOR_LABELS)
    return f"{name} {model}".strip() if name else cpu_model(signature)


def _family(signature: str) -> str:
    """The vendor and the first labelled part: x86's family, Arm's architecture."""
    vendor, pairs = _signature_parts(signature)
    return " ".join([vendor, *(f"{label} {value}" for label, value in pairs[:1])])


def _number(signature: str, label: str) -> int | None:
    value = dict(_signature_parts(signature)[1]).get(label)
    try:
        return int(value, 0) if value is not None else None
    except ValueError:
        return None


def _distance(a: str, b: str, label: str) -> int:
    """How far apart two signatures' numbered part is (0 where either has none)."""
    x, y = _number(a, label), _number(b, label)
    return abs(x - y) if x is not None and y is not None else 0


# -- one bundle -------------------------------------------------------------------------------
def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def bundle_hardware(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """The hardware record of the bundle's step times: its latency model's, else its own."""
    latency = _dict(_dict(meta.get("latency")).get("hardware"))
    return latency or _dict(meta.get("hardware"))


def timing_machine(hardware: Mapping[str, Any]) -> str:
    """The machine of a hardware record in words: ``AMD EPYC family 25 model 17`` (a CPU, its
    model told apart), ``NVIDIA H200``."""
    device = str(hardware.get("device") or "cpu").split(":")[0]
    if device == "cpu":
        return cpu_label(hardware.get("cpu_name") or hardware.get("device_name"),
                         hardware.get("cpu_signature"))
    return str(hardware.get("device_name") or device)


def fit_bundle(name: str, meta: Mapping[str, Any], machine: Machine) -> BundleFit:
    """How well bundle ``meta`` (a bundle's JSON object) fits ``machine``."""
    hardware = bundle_hardware(meta)
    device = str(hardware.get("device") or "cpu").split(":")[0]
    dtype = str(hardware.get("dtype") or "float32")
    predicted = _dict(meta.get("predicted"))
    timed_on = timing_machine(hardware)
    level, closeness, reason = _closeness(hardware, device, timed_on, machine)
    same_dtype = dtype == machine.dtype
    if not same_dtype:
        reason += f", in {dtype} (this run: {machine.dtype})"
    return BundleFit(
        name=name,
        task=str(meta.get("task") or ""),
        head_type=str(_dict(meta.get("heads")).get("type") or ""),
        level=level,
        same_dtype=same_dtype,
        reason=reason,
        timed_on=timed_on,
        dtype=dtype,
        tokens_per_second=_float(predicted.get("tokens_per_second")),
        speedup=_float(predicted.get("speedup_vs_autoregressive")),
        closeness=(level > OTHER_DEVICE, same_dtype, *closeness),
    )


def _closeness(hardware: Mapping[str, Any], device: str, timed_on: str,
               machine: Machine) -> tuple[int, tuple[Any, ...], str]:
    """(level, its sort key, the reason) of a bundle timed on ``device`` (``timed_on``)."""
    if device != machine.device:
        return _level(OTHER_DEVICE, f"timed on the {device} ({timed_on}), not the "
                                    f"{machine.device}")
    if device != "cpu":
        gpu = machine.gpu_name
        if gpu and gpu == hardware.get("device_name"):
            return _level(SAME_MODEL, f"timed on this GPU ({timed_on})")
        return _level(SAME_DEVICE, f"timed on another GPU ({timed_on}; this machine: "
                                   f"{gpu or 'a GPU of unknown name'})")
    here = machine.cpu.signature
    there = hardware.get("cpu_signature")
    this_cpu = cpu_label(machine.cpu.name, here)
    if not here or not there:
        unknown = "this machine's" if not here else "the bundle's"
        return _level(SAME_DEVICE, f"timed on another CPU ({timed_on}; {unknown} CPU model is "
                                   "not known)")
    there = str(there)
    if cpu_model(there) == cpu_model(here):
        return _level(SAME_MODEL, f"timed on this CPU model ({timed_on})",
                      same_stepping=there == here)
    # among CPUs of one level, the nearest family number, then model number
    near = (-_distance(there, here, "family"), -_distance(there, here, "model"))
    if _family(there) == _family(here):
        return _level(SAME_FAMILY, f"timed on another model of this CPU family ({timed_on}; "
                                   f"this machine: {this_cpu})", near=near)
    vendor = _signature_parts(there)[0]
    if vendor and vendor == _signature_parts(here)[0]:
        return _level(SAME_VENDOR, f"timed on another {vendor} CPU ({timed_on}; this machine: "
                                   f"{this_cpu})", near=near)
    return _level(SAME_DEVICE, f"timed on another vendor's CPU ({timed_on}; this machine: "
                               f"{this_cpu})", near=near)


def _level(level: int, reason: str, *, same_stepping: bool = False,
           near: tuple[int, int] = (0, 0)) -> tuple[int, tuple[Any, ...], str]:
    return level, (level, same_stepping, *near), reason


# -- choosing ---------------------------------------------------------------------------------
def rank_bundles(bundles: Mapping[str, Mapping[str, Any]], machine: Machine) -> list[BundleFit]:
    """Every bundle's fit, best first (closest timing machine, then the faster prediction,
    then the name)."""
    fits = [fit_bundle(name, meta, machine) for name, meta in sorted(bundles.items())]
    return sorted(fits, key=lambda f: f.order, reverse=True)


def pick_bundle(bundles: Mapping[str, Mapping[str, Any]], machine: Machine, *, task: str,
                head_type: str | None = None) -> Pick:
    """The bundle of ``task`` (and ``head_type``; None: the best-fitting of the task's head
    types) whose step times describe ``machine`` best. A one-line ``EntmtpError`` when the task,
    or its head type, has no bundle."""
    fits = rank_bundles(bundles, machine)
    tasks = sorted({f.task for f in fits if f.task})
    of_task = [f for f in fits if f.task == task]
    if not of_task:
        raise EntmtpError(f"no shipped bundle for task {task!r}: bundles ship for "
                          f"{', '.join(tasks) or 'no task'} (`entmtp bundles` lists them)")
    types = sorted({f.head_type for f in of_task})
    if head_type is not None:
        chosen = [f for f in of_task if f.head_type == head_type]
        if not chosen:
            raise EntmtpError(f"no shipped {head_type} bundle for task {task!r}: its bundles "
                              f"are for {', '.join(types)} heads; pass --head-type "
                              f"{types[0]}")
        return Pick(chosen[0], None)
    best = of_task[0]
    return Pick(best, _head_note(best, of_task))


def _head_note(best: BundleFit, of_task: Sequence[BundleFit]) -> str:
    """Why ``best``'s head type, against the best bundle of each other head type."""
    others = {}
    for fit in of_task:
        if fit.head_type != best.head_type:
            others.setdefault(fit.head_type, fit)
    if not others:
        return f"{best.head_type} heads, the task's only head type"
    rival = max(others.values(), key=lambda f: f.order)
    switch = f"--head-type {rival.head_type} for the other"
    if rival.closeness == best.closeness and best.tokens_per_second and rival.tokens_per_second:
        return (f"{best.head_type} heads, predicted faster there than {rival.head_type} "
                f"({best.tokens_per_second:.1f} against {rival.tokens_per_second:.1f} tokens/s; "
                f"{switch})")
    return f"{best.head_type} heads, whose bundle fits this machine best ({switch})"


def picks_by_head_type(bundles: Mapping[str, Mapping[str, Any]], machine: Machine, *,
                       task: str) -> list[Pick]:
    """One pick per head type of ``task`` (head types in name order), for commands that run
    every head type side by side."""
    pick_bundle(bundles, machine, task=task)  # the one-line error of a task without bundles
    types = sorted({f.head_type for f in rank_bundles(bundles, machine) if f.task == task})
    return [pick_bundle(bundles, machine, task=task, head_type=t) for t in types]
