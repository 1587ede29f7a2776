"""The one hardware description: /proc/cpuinfo parsing, the machine record, labels, and the
shipped latency files (written before the record had a CPU signature) still load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from entmtp.core import (
    cpu_info,
    cpu_name,
    describe_machine,
    device_name,
    hardware_label,
    hardware_slug,
)
from entmtp.core._hardware import MACHINE_KEYS, CpuInfo, parse_cpuinfo
from entmtp.treesearch import LatencyModel

REPO = Path(__file__).resolve().parents[2]

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu vme

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 0
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""


def test_x86_name_and_signature_come_from_the_first_processor():
    assert parse_cpuinfo(X86) == CpuInfo(
        name="AMD EPYC", signature="AuthenticAMD family 26 model 2 stepping 1")


def test_two_cpus_of_one_marketing_name_have_different_signatures():
    other = X86.replace("cpu family\t: 26", "cpu family\t: 25", 1)
    assert parse_cpuinfo(other).name == parse_cpuinfo(X86).name
    assert parse_cpuinfo(other).signature != parse_cpuinfo(X86).signature


def test_arm_signature_is_implementer_architecture_variant_part_revision(monkeypatch):
    monkeypatch.setattr("platform.processor", lambda: "")
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    info = parse_cpuinfo(ARM)
    assert info == CpuInfo(name="aarch64", signature="implementer 0x41 architecture 8 "
                                                     "variant 0x3 part 0xd0c revision 1")


def test_without_cpuinfo_the_platform_names_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr("platform.processor", lambda: "")
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert parse_cpuinfo("") is None
    assert cpu_info(tmp_path / "missing") == CpuInfo(name="x86_64", signature=None)
    monkeypatch.setattr("platform.machine", lambda: "")
    assert cpu_info(tmp_path / "missing").name == "unknown CPU"


def test_machine_record_of_the_cpu():
    record = describe_machine("cpu", torch_threads=3)
    assert tuple(record) == MACHINE_KEYS
    assert record["device"] == "cpu" and record["device_name"] == cpu_name()
    assert record["cpu_name"] == cpu_info().name and record["cpu_signature"] == cpu_info().signature
    assert record["torch_threads"] == 3 and record["cpu_count"] >= 1


def test_a_cuda_device_is_named_by_torch(monkeypatch):
    asked = []
    fake_torch = SimpleNamespace(
        device=lambda name: f"device({name})",
        cuda=SimpleNamespace(get_device_name=lambda d: asked.append(d) or "NVIDIA H200"))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert device_name("cuda:1") == "NVIDIA H200" and asked == ["device(cuda:1)"]
    record = describe_machine("cuda:1", torch_threads=None)
    assert (record["device"], record["device_name"]) == ("cuda", "NVIDIA H200")
    assert record["cpu_name"] == cpu_name()  # the host CPU is recorded too


def test_describing_the_cpu_imports_no_torch():
    code = ("import sys; from entmtp.core import describe_machine; "
            "describe_machine('cpu', torch_threads=1); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_labels_and_slugs():
    cpu = {"device": "cpu", "device_name": "AMD EPYC", "dtype": "float32", "torch_threads": 1,
           "model": "m"}
    assert hardware_label(cpu, "?") == "AMD EPYC, float32, 1 thread, m"
    assert hardware_label({}, "fallback") == "fallback"
    assert hardware_label({"kind": "synthetic-gpu"}, "?") == (
        "synthetic-gpu (synthetic, not measured)")
    assert hardware_slug({"device_name": "NVIDIA H200", "dtype": "bfloat16"}) == (
        "nvidia-h200-bfloat16")
    assert hardware_slug({}) == "retargeted"


SHIPPED_LATENCY = sorted([*REPO.glob("trees/latency/*.json"),
                          *REPO.glob("bench/results/latency-*.json")])


@pytest.mark.parametrize("path", SHIPPED_LATENCY, ids=lambda p: p.name)
def test_shipped_latency_files_still_load(path):
    model = LatencyModel.load(path)
    assert hardware_label(model.hardware, "?").startswith(model.hardware["device_name"])
    assert hardware_slug(model.hardware) != "retargeted"


def test_a_latency_file_without_any_machine_field_loads(tmp_path):
    data = json.loads(SHIPPED_LATENCY[0].read_text())
    for key in MACHINE_KEYS:
        data["hardware"].pop(key, None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    model = LatencyModel.load(path)
    assert not set(MACHINE_KEYS) & set(model.hardware)
    assert hardware_label(model.hardware, "old.json").startswith("old.json")


def test_there_are_shipped_latency_files():
    assert len(SHIPPED_LATENCY) >= 4
