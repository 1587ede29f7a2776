"""Which bundle fits this machine (``entmtp.core``'s ``rank_bundles`` and ``pick_bundle``),
against hand-written bundle metadata: the device first, then the dtype, then this CPU model,
then its vendor and family, then its vendor, then any CPU; a head type chosen unless named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entmtp.core import (
    CpuInfo,
    EntmtpError,
    Machine,
    cpu_model,
    pick_bundle,
    picks_by_head_type,
    rank_bundles,
    timing_machine,
)
from entmtp.core._bundle_choice import (
    SAME_DEVICE,
    SAME_FAMILY,
    SAME_MODEL,
    SAME_VENDOR,
    cpu_label,
    fit_bundle,
)

ZEN4 = "AuthenticAMD family 25 model 17 stepping 1"
ZEN5 = "AuthenticAMD family 26 model 2 stepping 1"
XEON = "GenuineIntel family 6 model 167 stepping 1"


def meta(task: str = "code", head_type: str = "medusa", *, device: str = "cpu",
         cpu_name: str = "AMD EPYC", signature: str | None = ZEN4, dtype: str = "float32",
         gpu: str | None = None, tokens_per_second: float = 40.0) -> dict:
    """A bundle's JSON object, as much of it as the matching reads."""
    hardware = {"kind": "measured", "device": device, "dtype": dtype,
                "device_name": gpu if device == "cuda" else cpu_name}
    if device == "cpu":
        hardware.update(cpu_name=cpu_name, cpu_signature=signature)
    return {"task": task, "heads": {"type": head_type},
            "predicted": {"tokens_per_second": tokens_per_second,
                          "speedup_vs_autoregressive": 1.5},
            "hardware": {"device": device}, "latency": {"hardware": hardware}}


def cpu(signature: str | None, name: str = "AMD EPYC", dtype: str = "float32") -> Machine:
    return Machine(device="cpu", dtype=dtype, cpu=CpuInfo(name, signature))


SHIPPED_LIKE = {
    "code-medusa-zen5.json": meta(signature=ZEN5),
    "code-medusa-zen4.json": meta(signature=ZEN4),
    "code-medusa-xeon.json": meta(cpu_name="Intel(R) Xeon(R) Processor", signature=XEON),
    "code-medusa-xeon-bf16.json": meta(cpu_name="Intel(R) Xeon(R) Processor", signature=XEON,
                                       dtype="bfloat16"),
    "code-medusa-h200.json": meta(device="cuda", gpu="NVIDIA H200", dtype="bfloat16"),
}


def test_signatures_name_a_cpu_model_without_its_stepping():
    assert cpu_model(ZEN4) == "AuthenticAMD family 25 model 17"
    arm = "implementer 0x41 architecture 8 variant 0x3 part 0xd0c revision 1"
    assert cpu_model(arm) == "implementer 0x41 architecture 8 variant 0x3 part 0xd0c"
    assert cpu_label("AMD EPYC", ZEN4) == "AMD EPYC family 25 model 17"
    assert cpu_label("AMD EPYC", None) == "AMD EPYC"
    assert timing_machine({"device": "cpu", "cpu_name": "AMD EPYC", "cpu_signature": ZEN5}) \
        == "AMD EPYC family 26 model 2"
    assert timing_machine({"device": "cuda:0", "device_name": "NVIDIA H200"}) == "NVIDIA H200"


def test_the_bundle_timed_on_this_cpu_model_is_picked_and_said_so():
    pick = pick_bundle(SHIPPED_LIKE, cpu(ZEN4.replace("stepping 1", "stepping 0")),
                       task="code", head_type="medusa")
    assert pick.fit.name == "code-medusa-zen4.json" and pick.fit.exact
    assert pick.describe() == "timed on this CPU model (AMD EPYC family 25 model 17)"
    assert pick.head_note is None  # the caller named the head type


def test_the_exact_stepping_wins_among_bundles_of_one_cpu_model():
    bundles = {"a.json": meta(signature=ZEN4.replace("stepping 1", "stepping 0")),
               "b.json": meta(signature=ZEN4)}
    assert pick_bundle(bundles, cpu(ZEN4), task="code").fit.name == "b.json"


@pytest.mark.parametrize("signature,name,level,picked,words", [
    # another model of the Zen 4 family: the family-25 bundle, not the family-26 one
    ("AuthenticAMD family 25 model 1 stepping 1", "AMD EPYC", SAME_FAMILY,
     "code-medusa-zen4.json", "another model of this CPU family"),
    # an older AMD family: the nearest family number (25, not 26)
    ("AuthenticAMD family 23 model 49 stepping 0", "AMD EPYC", SAME_VENDOR,
     "code-medusa-zen4.json", "another AuthenticAMD CPU"),
    # another Intel model: the Xeon, in this run's float32 (not its bfloat16 twin)
    ("GenuineIntel family 6 model 143 stepping 8", "Intel Xeon", SAME_FAMILY,
     "code-medusa-xeon.json", "another model of this CPU family"),
    # a vendor no bundle was timed on: still a CPU bundle, never the GPU's
    ("HygonGenuine family 24 model 0 stepping 1", "Hygon C86", SAME_DEVICE, None,
     "another vendor's CPU"),
    # a machine that does not say its CPU model
    (None, "unknown CPU", SAME_DEVICE, None, "CPU model is not known"),
])
def test_a_cpu_without_its_own_bundle_gets_the_closest(signature, name, level, picked, words):
    machine = cpu(signature, name)
    pick = pick_bundle(SHIPPED_LIKE, machine, task="code", head_type="medusa")
    assert pick.fit.level == level and not pick.fit.exact
    assert pick.fit.dtype == "float32" and pick.fit.name != "code-medusa-h200.json"
    if picked is not None:
        assert pick.fit.name == picked
    assert words in pick.fit.reason
    if signature is not None:
        assert f"this machine: {cpu_label(name, signature)}" in pick.fit.reason


def test_the_dtype_outranks_the_cpu_model():
    # bfloat16 on Zen 4: the Xeon's bfloat16 bundle, not the Zen 4 float32 one
    pick = pick_bundle(SHIPPED_LIKE, cpu(ZEN4, dtype="bfloat16"), task="code")
    assert pick.fit.name == "code-medusa-xeon-bf16.json" and pick.fit.same_dtype
    # float16, which no bundle was timed in: the closest CPU, saying the dtype differs
    pick = pick_bundle(SHIPPED_LIKE, cpu(ZEN4, dtype="float16"), task="code")
    assert pick.fit.name == "code-medusa-zen4.json" and not pick.fit.exact
    assert pick.fit.reason.endswith("in float32 (this run: float16)")


def test_a_gpu_gets_its_own_gpu_then_any_gpu_bundle():
    h200 = Machine("cuda:1", "bfloat16", CpuInfo("AMD EPYC", ZEN4), gpu_name="NVIDIA H200")
    assert h200.device == "cuda"
    pick = pick_bundle(SHIPPED_LIKE, h200, task="code")
    assert pick.fit.name == "code-medusa-h200.json" and pick.fit.exact
    assert pick.fit.reason.startswith("timed on this GPU (NVIDIA H200)")
    h100 = Machine("cuda", "bfloat16", CpuInfo("AMD EPYC", ZEN4), gpu_name="NVIDIA H100")
    pick = pick_bundle(SHIPPED_LIKE, h100, task="code")
    assert pick.fit.name == "code-medusa-h200.json" and pick.fit.level == SAME_DEVICE
    assert "another GPU (NVIDIA H200; this machine: NVIDIA H100)" in pick.fit.reason
    # no GPU bundle at all: a CPU one, saying so
    cpu_only = {k: v for k, v in SHIPPED_LIKE.items() if "h200" not in k}
    pick = pick_bundle(cpu_only, h100, task="code")
    assert "not the cuda" in pick.fit.reason


def test_without_a_head_type_the_faster_prediction_of_equal_fits_wins():
    bundles = {"code-medusa.json": meta(head_type="medusa", tokens_per_second=39.7),
               "code-hydra.json": meta(head_type="hydra", tokens_per_second=43.0),
               "code-hydra-xeon.json": meta(head_type="hydra", signature=XEON,
                                            tokens_per_second=90.0)}
    pick = pick_bundle(bundles, cpu(ZEN4), task="code")
    assert pick.fit.name == "code-hydra.json"  # the Xeon's faster prediction is not this CPU's
    assert pick.head_note == ("hydra heads, predicted faster there than medusa (43.0 against "
                              "39.7 tokens/s; --head-type medusa for the other)")
    assert pick.describe().startswith("timed on this CPU model (AMD EPYC family 25 model 17); "
                                      "hydra heads")
    # a head type whose bundle fits better wins over a faster prediction
    bundles["code-hydra.json"] = meta(head_type="hydra", signature=ZEN5, tokens_per_second=99.0)
    pick = pick_bundle(bundles, cpu(ZEN4), task="code")
    assert pick.fit.name == "code-medusa.json"
    assert pick.head_note == ("medusa heads, whose bundle fits this machine best (--head-type "
                              "hydra for the other)")
    assert pick_bundle({"a.json": meta()}, cpu(ZEN4), task="code").head_note == (
        "medusa heads, the task's only head type")


def test_picks_by_head_type_give_one_bundle_per_type():
    bundles = {**SHIPPED_LIKE, "code-hydra-zen4.json": meta(head_type="hydra")}
    picks = picks_by_head_type(bundles, cpu(ZEN4), task="code")
    assert [p.fit.name for p in picks] == ["code-hydra-zen4.json", "code-medusa-zen4.json"]


def test_a_task_or_head_type_without_a_bundle_is_one_line_naming_those_that_have_one():
    bundles = {**SHIPPED_LIKE, "chat.json": meta(task="chat")}
    with pytest.raises(EntmtpError) as err:
        pick_bundle(bundles, cpu(ZEN4), task="poetry")
    assert str(err.value) == ("no shipped bundle for task 'poetry': bundles ship for chat, "
                              "code (`entmtp bundles` lists them)")
    with pytest.raises(EntmtpError, match="no shipped hydra bundle for task 'code'.*medusa"):
        pick_bundle(bundles, cpu(ZEN4), task="code", head_type="hydra")
    with pytest.raises(EntmtpError, match="poetry"):
        picks_by_head_type(bundles, cpu(ZEN4), task="poetry")


def test_ranking_is_best_first_and_reads_the_bundles_own_hardware_without_a_latency_model():
    old = meta(signature=ZEN4)
    old["hardware"] = old.pop("latency")["hardware"]  # a bundle without a latency model
    bundles = {"old.json": old, "xeon.json": meta(signature=XEON)}
    ranked = rank_bundles(bundles, cpu(ZEN4))
    assert [f.name for f in ranked] == ["old.json", "xeon.json"]
    assert ranked[0].level == SAME_MODEL and ranked[0].timed_on == "AMD EPYC family 25 model 17"
    assert fit_bundle("x", {}, cpu(ZEN4)).level == SAME_DEVICE  # nothing recorded: any CPU


def test_every_shipped_bundle_is_the_pick_on_the_machine_it_was_timed_on():
    """The shipped metadata is consistent: on its own machine, in its own dtype, each bundle
    is what --task and --head-type pick."""
    folder = Path(__file__).resolve().parents[2] / "trees" / "bundles"
    shipped = {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    assert shipped
    for name, bundle in shipped.items():
        hardware = bundle["latency"]["hardware"]
        machine = Machine(hardware["device"], hardware["dtype"],
                          CpuInfo(hardware.get("cpu_name", ""), hardware.get("cpu_signature")),
                          gpu_name=hardware["device_name"])
        pick = pick_bundle(shipped, machine, task=bundle["task"],
                           head_type=bundle["heads"]["type"])
        assert pick.fit.name == name and pick.fit.exact, (name, pick.fit.reason)
