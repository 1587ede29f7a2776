"""validate, bench, decode and heads train through Typer's CliRunner on tiny random models.

The main bundle is calibrated (``entmtp calibrate``) for a tiny Llama whose untied random lm_head
gives varied greedy continuations and entropies, with zero-initialised Medusa heads (each head
then ranks the true token by the base distribution: a mix of hits and misses), so that accept
lengths vary and the calibrated schedule switches between trees.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.evaluation import DRIFT_LIMIT
from entmtp.treesearch import LatencyModel, Profile, Schedule, load_bundle, replay, save_bundle
from entmtp.treesearch._bundle import HeadsInfo
from support import make_char_tokenizer, make_tiny_llama, save_untied_tiny_llama

runner = CliRunner()

PROMPTS = [
    "def add(a, b):",
    "Once upon a time",
    "The quick brown fox",
    "x = [1, 2, 3]",
    "import numpy as np",
    "Dear Sir or Madam,",
]
MAX_NEW_TOKENS = 20




def invoke(args: list[str]):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    # before the error, at most the line that says the model is loading
    assert all(line.startswith("loading model ") for line in lines[:-1]), result.output
    assert lines[-1].startswith("entmtp: error:"), result.output
    for needle in needles:
        assert needle in lines[-1], result.output


def write_prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


@pytest.fixture(scope="module")
def varied(tmp_path_factory) -> SimpleNamespace:
    from entmtp.model import new_heads, save_heads

    root = tmp_path_factory.mktemp("varied")
    model = make_tiny_llama(0)
    generator = torch.Generator().manual_seed(1000)
    model.lm_head.weight = torch.nn.Parameter(
        torch.randn(model.lm_head.weight.shape, generator=generator) * 2.0)
    model.config.tie_word_embeddings = False
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    make_char_tokenizer(model.config.vocab_size).save_pretrained(model_dir)
    heads = {}
    for head_type in ("medusa", "hydra"):
        heads[head_type] = root / head_type
        save_heads(new_heads(model, head_type=head_type, num_heads=3), heads[head_type],
                   dtype=None)
    data = write_prompts(root / "prompts.jsonl", PROMPTS)
    latency = LatencyModel.cpu_like().save(root / "latency.json")
    run = root / "run"
    result = invoke(["calibrate", "--model", model_dir, "--heads", heads["medusa"],
                     "--data", data, "--split", "all", "--prompts", len(PROMPTS),
                     "--max-new-tokens", MAX_NEW_TOKENS, "--schedule-trials", 8,
                     "--latency", latency, "--out", run])
    assert result.exit_code == 0, result.output
    return SimpleNamespace(root=root, model=model_dir, medusa=heads["medusa"],
                           hydra=heads["hydra"], data=data, run=run)


def model_args(varied, heads: Path | None = None) -> list:
    return ["--model", varied.model, "--heads", heads or varied.medusa, "--data", varied.data,
            "--split", "all"]


def test_validate_is_lossless_and_replays_the_calibration_profile_exactly(varied, tmp_path):
    out = tmp_path / "validate.json"
    result = invoke(["validate", varied.run, *model_args(varied), "--prompts", len(PROMPTS),
                     "--max-new-tokens", MAX_NEW_TOKENS, "--json", out])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    bundle = load_bundle(varied.run / "bundle.json")
    assert report["prompts"] == len(PROMPTS)
    assert report["lossless"] is True and report["not_lossless_prompts"] == []
    assert report["replay_step_agreement"] == 1.0 and report["mismatches"] == []
    assert report["steps_compared"] == report["entmtp"]["steps"] == report["replayed_steps"]
    assert report["entmtp"]["decode_tokens"] == report["replayed_decode_tokens"]
    assert report["measured_mean_accept_length"] == report["replayed_mean_accept_length"]
    assert report["predicted_mean_accept_length"] == bundle.predicted.mean_accept_length
    assert report["predicted_tokens_per_second"] == bundle.predicted.tokens_per_second
    assert report["measured_speedup"] == pytest.approx(
        report["measured_tokens_per_second"] / report["autoregressive_tokens_per_second"])
    assert sum(report["tree_usage"].values()) == report["entmtp"]["steps"]

    # Independently: calibrate profiled the same prompts (its own batched greedy generation), so
    # replaying the bundle on that profile books exactly the live steps, and (the bundle was
    # calibrated on all these prompts) its prediction is the measured mean accept length.
    profile = Profile.load(varied.run / "profile.npz")
    schedule = Schedule(tuple(bundle.trees), tuple(bundle.thresholds), bundle.entropy.estimator)
    replayed = replay(profile, schedule, bundle.latency)
    assert report["entmtp"]["steps"] == replayed.steps
    assert report["entmtp"]["tokens"] == profile.num_positions
    assert report["entmtp"]["decode_tokens"] == replayed.tokens
    assert report["measured_mean_accept_length"] == replayed.mean_accept_length
    assert report["predicted_mean_accept_length"] == report["measured_mean_accept_length"]
    assert report["replayed_tokens_per_second"] == bundle.predicted.tokens_per_second
    assert "lossless" in result.output and "replay check" in result.output
    # the results on stdout; the model loading, progress and notes on stderr
    assert "lossless" in result.stdout and "replay check" in result.stdout
    assert result.stderr.startswith(f"loading model {varied.model} ...\n")
    assert "decoding: " in result.stderr and "decoding: " not in result.stdout
    assert "static-shape runtime" in result.stderr
    # the prediction, with autoregressive decoding's, of the bundle's (synthetic) latency model
    assert report["predicted_autoregressive_tokens_per_second"] == pytest.approx(
        1000.0 / bundle.latency.autoregressive_ms)
    assert "synthetic" in report["predicted_on"]
    ar_row = next(line for line in result.stdout.splitlines()
                  if line.lstrip("│| ").startswith("autoregressive tokens/s"))
    assert f"{report['predicted_autoregressive_tokens_per_second']:.2f}" in ar_row
    assert "warning" not in result.output  # no prediction of a machine's speed to fall short of
    runtime = report["runtime"]  # a Llama on the CPU: the static engine, nothing captured
    assert runtime["engine"] == "auto" and runtime["graphs"] is True
    assert "static-shape runtime (no graphs on cpu)" in runtime["runtime_note"]
    assert runtime["graph_captures"] == 0 and runtime["captures"] == []
    assert result.output.count("static-shape runtime") == 1


def test_validate_on_the_eager_engine_is_lossless_and_says_so(varied, tmp_path):
    out = tmp_path / "validate.json"
    result = invoke(["validate", varied.run, *model_args(varied), "--prompts", 2,
                     "--max-new-tokens", MAX_NEW_TOKENS, "--json", out, "--engine", "eager",
                     "--no-replay"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["lossless"] is True
    assert report["runtime"]["engine"] == "eager"
    assert "eager runtime" in report["runtime"]["runtime_note"]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_bench_has_every_row_with_consistent_ratios(varied, tmp_path):
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    result = invoke(["bench", "--bundle", varied.run, *model_args(varied), "--prompts", 3,
                     "--max-new-tokens", 12, "--json", out, "--plot", plot])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["autoregressive", "medusa-mc_sim_7b_63", "best-static", "entmtp"]
    baselines = ["autoregressive", "medusa-mc_sim_7b_63", "best-static"]
    for name, row in rows.items():
        assert row["lossless"] is True, name
        assert row["tokens"] == rows["autoregressive"]["tokens"]
        assert set(row["speedup"]) == set(baselines) - {name}
        for base, value in row["speedup"].items():
            assert value == pytest.approx(row["tokens_per_second"] /
                                          rows[base]["tokens_per_second"])
    assert rows["autoregressive"]["mean_accept_length"] == 1.0
    # Medusa's default tree is 4 deep; the tiny heads draft 3, so it is cut to depth 3.
    assert rows["medusa-mc_sim_7b_63"]["depth"] == 3
    assert rows["medusa-mc_sim_7b_63"]["cut_to_depth"] == 3
    (oracle,) = (p["oracle"] for p in report["predictions"].values())
    assert oracle["measured"] is False
    assert oracle["tokens_per_second"] >= oracle["entmtp_replayed_tokens_per_second"]
    assert 0 < oracle["entmtp_fraction_of_oracle"] <= 1
    width, height = _png_size(plot)
    assert width > 200 and height > 200
    runtime = report["runtime"]
    assert runtime["engine"] == "auto" and runtime["graphs"] is True
    assert "static-shape runtime" in runtime["runtime_note"]
    assert result.output.count("static-shape runtime") == 1  # the note, once


def test_decode_prints_the_greedy_text_and_stats(varied):
    from entmtp.model._base_model import load_base_model
    from entmtp.runtime._decode import autoregressive_generate

    prompt, max_new = "Hello there", 12
    result = invoke(["decode", varied.run, "--prompt", prompt, "--max-new-tokens", max_new,
                     "--model", varied.model, "--heads", varied.medusa])
    assert result.exit_code == 0, result.output
    base = load_base_model(varied.model)
    greedy = autoregressive_generate(base.model, base.encode_prompt(prompt),
                                     max_new_tokens=max_new,
                                     eos_token_ids=sorted(base.eos_token_ids))
    text = base.tokenizer.decode(greedy.tokens, skip_special_tokens=True)
    assert text.strip() and result.stdout == text + "\n"  # the generated text alone
    err = result.stderr
    assert err.startswith(f"loading model {varied.model} ...\n")
    assert "mean accept length" in err and "trees used" in err
    bundle = load_bundle(varied.run / "bundle.json")
    speed = next(line for line in err.splitlines() if line.startswith("speed: "))
    assert "tokens/s decoding" in speed
    assert f"predicted {bundle.predicted.tokens_per_second:.2f}" in speed
    assert f"autoregressive decoding {1000.0 / bundle.latency.autoregressive_ms:.2f}" in speed
    assert "synthetic latency model" in speed


def test_decode_batch_size_decodes_copies_of_the_prompt_as_one_batch(varied):
    """--batch-size: the text once on stdout (every row decodes it greedily), the batch's speed
    on stderr; validate --batch-size runs the batch sweep at that size, lossless."""
    from entmtp.model._base_model import load_base_model
    from entmtp.runtime._decode import autoregressive_generate

    prompt, max_new = "Hello there", 12
    result = invoke(["decode", varied.run, "--prompt", prompt, "--max-new-tokens", max_new,
                     "--model", varied.model, "--heads", varied.medusa, "--batch-size", 3])
    assert result.exit_code == 0, result.output
    base = load_base_model(varied.model)
    greedy = autoregressive_generate(base.model, base.encode_prompt(prompt),
                                     max_new_tokens=max_new,
                                     eos_token_ids=sorted(base.eos_token_ids))
    assert result.stdout == base.tokenizer.decode(greedy.tokens, skip_special_tokens=True) + "\n"
    assert "batch of 3:" in result.stderr and "tokens/s for the whole batch" in result.stderr
    assert_one_line_error(invoke(["decode", varied.run, "--prompt", prompt, "--model",
                                  varied.model, "--heads", varied.medusa, "--batch-size", 0]),
                          "--batch-size")
    result = invoke(["validate", varied.run, *model_args(varied), "--prompts", 3,
                     "--max-new-tokens", 8, "--batch-size", 2])
    assert result.exit_code == 0, result.output
    assert "batch size 2 (2 batches)" in result.stdout and " NO " not in result.stdout


def _timed(varied, path: Path, tokens_per_second: float) -> Path:
    """The calibrated bundle as if its latency model had been measured on a CPU like this
    one, predicting ``tokens_per_second``."""
    bundle = load_bundle(varied.run / "bundle.json")
    hardware = {**bundle.latency.hardware, "kind": "measured", "device": "cpu",
                "dtype": "float32"}
    return save_bundle(dataclasses.replace(
        bundle, latency=dataclasses.replace(bundle.latency, hardware=hardware),
        predicted=dataclasses.replace(bundle.predicted, tokens_per_second=tokens_per_second)),
        path)


@pytest.mark.parametrize("command", ["decode", "validate"])
def test_decoding_far_below_the_prediction_warns_in_one_line(varied, tmp_path, command):
    """A prediction no machine reaches (a billion tokens/s) warns; one any machine beats
    (a token in a million seconds) does not."""
    def run(bundle: Path):
        args = ([command, bundle, "--model", varied.model, "--heads", varied.medusa,
                 "--max-new-tokens", 8])
        args += (["--prompt", "Hello there"] if command == "decode" else
                 ["--data", varied.data, "--split", "all", "--prompts", 1, "--no-replay"])
        result = invoke(args)
        assert result.exit_code == 0, result.output
        return result

    result = run(_timed(varied, tmp_path / "fast.json", 1e9))
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith("entmtp: warning: decoding steps ran at 0.00x the bundle's "
                                  "predicted pace")
    assert f"more than {DRIFT_LIMIT:.0%} slower" in warnings[0]
    assert "rerun while it is quiet" in warnings[0]
    assert "warning" not in result.stdout
    result = run(_timed(varied, tmp_path / "slow.json", 1e-6))
    assert "warning" not in result.output


def test_heads_train_writes_a_loadable_heads_folder(tiny_model_dir, tmp_path):
    from entmtp.model import load_heads
    from entmtp.model._base_model import load_base_model

    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:4])
    out = tmp_path / "heads"
    result = invoke(["heads", "train", "--type", "hydra", "--model", tiny_model_dir,
                     "--data", data, "--split", "all", "--prompts", 4, "--num-heads", 2,
                     "--epochs", 1, "--batch-size", 16, "--max-new-tokens", 8,
                     "--heldout-fraction", 0.25, "--out", out])
    assert result.exit_code == 0, result.output
    heads = load_heads(out, load_base_model(tiny_model_dir).model)
    assert heads.head_type == "hydra" and heads.num_heads == 2
    training = json.loads((out / "config.json").read_text())["training"]
    assert training["prompts"] == 4 and training["heldout_trajectories"] == 1
    accuracy = training["heldout"]
    assert [a["depth"] for a in accuracy] == [1, 2]
    for acc in accuracy:
        assert 0 <= acc["top1"] <= acc["top5"] <= 1
        assert f"{acc['top1']:.3f}" in result.output and f"{acc['top5']:.3f}" in result.output


def other_medusa_heads(model_dir: Path, folder: Path) -> Path:
    """Medusa heads of the same shape as the bundle's but other (perturbed) weights."""
    from entmtp.model import load_heads, save_heads
    from entmtp.model._base_model import load_base_model

    heads = load_heads(folder.parent / "medusa", load_base_model(model_dir).model)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.01 * torch.randn(parameter.shape, generator=generator))
    return save_heads(heads, folder, dtype=None)


def test_a_bundle_for_other_heads_is_a_one_line_error(varied, tmp_path):
    bundle = load_bundle(varied.run / "bundle.json")
    perturbed = other_medusa_heads(varied.model, varied.root / "medusa-perturbed")
    hydra_sha = json.loads((varied.hydra / "config.json").read_text())["sha256"]
    hydra_bundle = save_bundle(
        dataclasses.replace(bundle, heads=HeadsInfo("hydra", 3, 10, hydra_sha)),
        tmp_path / "hydra.json")
    args = ["--prompts", 1, "--max-new-tokens", 4]
    # A bundle for the Hydra heads with the Medusa heads.
    assert_one_line_error(invoke(["validate", hydra_bundle, *model_args(varied), *args]),
                          "searched for hydra heads but the heads loaded are medusa")
    assert_one_line_error(invoke(["bench", "--bundle", hydra_bundle, *model_args(varied),
                                  *args]), "hydra")
    # The Medusa bundle with other Medusa weights of the same shape.
    assert_one_line_error(invoke(["validate", varied.run,
                                  *model_args(varied, heads=perturbed), *args]), "sha256")
    assert_one_line_error(invoke(["decode", varied.run, "--prompt", "hi", "--model",
                                  varied.model, "--heads", perturbed]), "sha256")


def test_bad_input_is_a_one_line_error(varied, tmp_path):
    missing = tmp_path / "nope.json"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    heads = model_args(varied)[:4]
    cases = [
        (["validate", missing, *heads], "does not exist"),
        (["bench", "--bundle", missing, *heads], "does not exist"),
        (["decode", missing, "--prompt", "hi", *heads], "does not exist"),
        (["validate", tmp_path, *heads], "no bundle.json"),
        (["validate", varied.run, *heads, "--task", "poetry"], "unknown task"),
        (["bench", *heads, "--task", "poetry"], "unknown task"),
        (["validate", varied.run, *heads, "--data", empty], "no prompts"),
        (["bench", *heads, "--data", empty], "no prompts"),
        (["validate", varied.run, *heads, "--data", varied.data, "--max-new-tokens", 0],
         "--max-new-tokens"),
        (["decode", varied.run, "--prompt", "  ", *heads], "--prompt"),
        (["decode", varied.run, "--prompt", "hi", *heads, "--dtype", "int8"], "--dtype"),
        (["bench", *heads, "--data", varied.data, "--device", "tpu"], "--device"),
        (["validate", varied.run, *heads, "--device", "cuda:x"], "--device"),
        (["heads", "train", "--type", "eagle", "--out", tmp_path / "h"], "--type"),
        (["heads", "train", "--type", "medusa", "--task", "poetry", "--out", tmp_path / "h"],
         "unknown task"),
    ]
    for args, needle in cases:
        assert_one_line_error(invoke(args), needle)
    assert not (tmp_path / "h").exists()


MODEL_COMMANDS = ["validate", "bench", "decode", "calibrate", "heads train", "latency"]


def model_command_args(varied, command: str, out: Path) -> list:
    heads = model_args(varied)[:4]
    return {"validate": ["validate", varied.run, *heads],
            "bench": ["bench", *heads, "--data", varied.data],
            "decode": ["decode", varied.run, "--prompt", "hi", *heads],
            "calibrate": ["calibrate", *model_args(varied), "--out", out],
            "heads train": ["heads", "train", "--type", "medusa", "--model", varied.model,
                            "--data", varied.data, "--out", out],
            "latency": ["latency", *heads, "--out", out]}[command]


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_cuda_on_a_machine_without_one_is_a_one_line_error(varied, command, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    args = model_command_args(varied, command, tmp_path / "out")
    assert_one_line_error(invoke([*args, "--device", "cuda", "--dtype", "bf16"]), "--device cuda")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", MODEL_COMMANDS)
@pytest.mark.parametrize(("option", "value"), [("--dtype", "int8"), ("--device", "tpu"),
                                               ("--device", "cuda:x")])
def test_bad_device_or_dtype_fails_before_any_side_effect(varied, command, option, value,
                                                          tmp_path, monkeypatch):
    import entmtp.model._base_model as model_module

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(model_module, "load_base_model", no_load)
    out = tmp_path / "out"
    assert_one_line_error(invoke([*model_command_args(varied, command, out), option, value]),
                          option)
    assert not out.exists()


@pytest.mark.parametrize(("dtype", "torch_dtype"), [("bf16", torch.bfloat16),
                                                    ("fp16", torch.float16)])
def test_calibrate_profiles_and_measures_latency_in_the_dtype_given(varied, tmp_path,
                                                                     monkeypatch, dtype,
                                                                     torch_dtype):
    import entmtp.evaluation._latency_profile as latency_profile

    timed = []

    def fake_profile_latency(model, heads, **options):  # timing is not what is tested here
        timed.append((next(model.parameters()).dtype, heads.dtype))
        return LatencyModel.cpu_like()

    monkeypatch.setattr(latency_profile, "profile_latency", fake_profile_latency)
    run = tmp_path / "run"
    result = invoke(["calibrate", *model_args(varied), "--prompts", 3, "--max-new-tokens", 8,
                     "--schedule-trials", 4, "--validation-folds", 0, "--dtype", dtype,
                     "--device", "cpu", "--out", run])
    assert result.exit_code == 0, result.output
    assert timed == [(torch_dtype, torch_dtype)]
    profile = Profile.load(run / "profile.npz")
    assert profile.meta.extra["dtype"] == str(torch_dtype).removeprefix("torch.")
    heads_sha256 = json.loads((varied.medusa / "config.json").read_text())["sha256"]
    assert profile.meta.heads_sha256 == heads_sha256  # the stored heads, loaded in bf16
    assert load_bundle(run / "bundle.json").heads.sha256 == heads_sha256


@pytest.mark.parametrize(("options", "engine", "graphs"), [
    (["--engine", "eager"], "eager", True),
    (["--engine", "static"], "static", True),
    (["--no-graphs"], "auto", False),
    (["--engine", "static", "--no-graphs"], "static", False),
])
def test_calibrate_measures_latency_on_the_engine_given(varied, tmp_path, monkeypatch, options,
                                                        engine, graphs):
    """--engine and --graphs/--no-graphs reach the latency stage's profiler: the run's latency
    file times the steps of the runtime the user chose."""
    import entmtp.evaluation._latency_profile as latency_profile

    timed = []

    def fake_profile_latency(model, heads, **kwargs):  # timing is not what is tested here
        timed.append((kwargs.get("engine", "auto"), kwargs.get("graphs", True)))
        return LatencyModel.cpu_like()

    monkeypatch.setattr(latency_profile, "profile_latency", fake_profile_latency)
    result = invoke(["calibrate", *model_args(varied), "--prompts", 3, "--max-new-tokens", 8,
                     "--schedule-trials", 4, "--validation-folds", 0, *options,
                     "--out", tmp_path / "run"])
    assert result.exit_code == 0, result.output
    assert timed == [(engine, graphs)]


def test_heads_train_runs_the_base_in_the_dtype_given(varied, tmp_path, monkeypatch):
    import entmtp.calibrate._head_training as heads_cmd
    from entmtp.model import load_heads
    from entmtp.model._base_model import load_base_model

    loaded = []
    real_load_base = heads_cmd.load_base

    def recording_load_base(*args, **kwargs):
        base = real_load_base(*args, **kwargs)
        loaded.append(next(base.model.parameters()).dtype)
        return base

    monkeypatch.setattr(heads_cmd, "load_base", recording_load_base)
    out = tmp_path / "heads"
    result = invoke(["heads", "train", "--type", "hydra", "--model", varied.model,
                     "--data", varied.data, "--split", "all", "--prompts", 4, "--num-heads", 2,
                     "--epochs", 1, "--batch-size", 16, "--max-new-tokens", 8,
                     "--heldout-fraction", 0.25, "--dtype", "bf16", "--out", out])
    assert result.exit_code == 0, result.output
    assert loaded == [torch.bfloat16]
    config = json.loads((out / "config.json").read_text())
    assert config["storage_dtype"] == "float16"
    assert (config["training"]["device"], config["training"]["dtype"]) == ("cpu", "bfloat16")
    heads = load_heads(out, load_base_model(varied.model, dtype="bfloat16").model)
    assert heads.num_heads == 2 and heads.sha256() == config["sha256"]


def test_heads_train_loads_the_base_on_the_device_given(varied, tmp_path, monkeypatch):
    """--device reaches the base model's loader. This machine may have no GPU, so the device
    check lets a CUDA name through and the loader stops the command once it has seen it."""
    import entmtp.calibrate._head_training as heads_cmd
    from entmtp.core import EntmtpError
    from entmtp.model import check_device_and_dtype

    loads = []

    def stop_at_the_load(model, **kwargs):
        loads.append(kwargs)
        raise EntmtpError("stopped at the load")

    monkeypatch.setattr(heads_cmd, "check_device_and_dtype",
                        lambda device, dtype: (device, check_device_and_dtype("cpu", dtype)[1]))
    monkeypatch.setattr(heads_cmd, "load_base", stop_at_the_load)
    result = invoke(["heads", "train", "--type", "medusa", "--model", varied.model, "--data",
                     varied.data, "--split", "all", "--prompts", 2, "--device", "cuda:1",
                     "--dtype", "fp16", "--out", tmp_path / "heads"])
    assert_one_line_error(result, "stopped at the load")
    assert loads == [{"device": "cuda:1", "dtype": "fp16"}]
    assert not (tmp_path / "heads").exists()


def test_dtype_puts_the_model_and_its_heads_in_that_precision(varied):
    from entmtp.model import load_model_and_heads

    base, heads = load_model_and_heads(str(varied.model), str(varied.medusa), "medusa",
                                       dtype="bf16")
    assert {p.dtype for p in base.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in heads.parameters()} == {torch.bfloat16}
    result = invoke(["decode", varied.run, "--prompt", "Hello there", "--max-new-tokens", 8,
                     "--model", varied.model, "--heads", varied.medusa, "--dtype", "bf16"])
    assert result.exit_code == 0, result.output
    assert "mean accept length" in result.output


@pytest.mark.parametrize("command", [["validate"], ["bench"], ["decode"], ["heads", "train"]])
def test_help_gives_an_example(command):
    result = invoke([*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example: entmtp " + " ".join(command) in result.output


@pytest.mark.integration
def test_validate_on_the_default_model_is_lossless_and_exact(tmp_path):
    """The default SmolLM2 model (no --model) with fresh 4-head Medusa heads and a two-tree
    entropy schedule written by hand for them."""
    from entmtp.model import new_heads, save_heads
    from entmtp.model._base_model import load_base_model
    from entmtp.treesearch import Bundle, EntropyEstimator, Tree
    from entmtp.treesearch._bundle import CreatedBy, EntropyInfo, ModelInfo, Predicted, TreeStats

    base = load_base_model()
    heads = new_heads(base.model, head_type="medusa", num_heads=4)
    heads_dir = save_heads(heads, tmp_path / "heads", dtype=None)
    trees = [Tree.from_paths([[0]]), Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]])]
    bundle = Bundle(
        model=ModelInfo(base.name, base.vocab_size, base.hidden_size),
        heads=HeadsInfo("medusa", 4, 10, heads.sha256()),
        task="chat",
        entropy=EntropyInfo("base_entropy", "nats", EntropyEstimator.ema(0.5)),
        thresholds=[1.0],
        trees=trees,
        tree_stats=[TreeStats(1.0, 1.0) for _ in trees],
        predicted=Predicted(1.0, 1.0, 1.0, 1.0),
        hardware={},
        created_by=CreatedBy("test", "test"),
        latency=LatencyModel.cpu_like(),
    )
    path = save_bundle(bundle, tmp_path / "bundle.json")
    data = write_prompts(tmp_path / "prompts.jsonl", ["Name three colours.", "What is 2 + 3?"])
    out = tmp_path / "validate.json"
    result = invoke(["validate", path, "--heads", heads_dir, "--data", data, "--split", "all",
                     "--prompts", 2, "--max-new-tokens", 16, "--json", out])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["lossless"] is True
    assert report["replay_step_agreement"] == 1.0, report["mismatches"]
    assert report["measured_mean_accept_length"] == report["replayed_mean_accept_length"]


def test_low_precision_bench_reports_departures_per_bundle_and_dtype(varied, tmp_path):
    """bf16 and fp16 departures are judged near-ties; fp32 never departs. The calibrated
    bundle's tree is the empty one (plain decoding: it cannot depart) and the fixture's hidden-32
    model departed on none of 20 prompts in bf16, so this runs a 39-node tree (depth 3) on a
    hidden-64 model, measured to depart on 3 of these 6 prompts in bf16 and 2 in fp16."""
    from entmtp.model import new_heads, save_heads
    from entmtp.treesearch import reference_tree
    from entmtp.treesearch._bundle import TreeStats
    from entmtp.treesearch._tree import Tree

    model = save_untied_tiny_llama(tmp_path / "model", hidden_size=64)
    heads = new_heads(model, head_type="medusa", num_heads=3)
    save_heads(heads, tmp_path / "medusa", dtype=None)
    bundle = load_bundle(varied.run / "bundle.json")
    tree = Tree.from_paths([p for p in reference_tree("mc_sim_7b_63").paths if len(p) <= 3])
    one_tree = dataclasses.replace(
        bundle, model=dataclasses.replace(bundle.model, hidden_size=64),
        heads=dataclasses.replace(bundle.heads, sha256=heads.sha256()), trees=[tree],
        thresholds=[], best_static=None, tree_stats=[TreeStats(1.0, bundle.latency.tree_ms(tree))])
    script = Path(__file__).resolve().parents[2] / "bench" / "bench_low_precision.py"
    out = tmp_path / "low-precision.json"
    run = subprocess.run(
        [sys.executable, str(script), "--bundle", str(save_bundle(one_tree, tmp_path / "b.json")),
         "--model", str(tmp_path / "model"), "--heads", str(tmp_path / "medusa"), "--data",
         str(varied.data), "--split", "all", "--prompts", "6", "--max-new-tokens", "24",
         "--dtype", "bf16", "--dtype", "fp16", "--dtype", "fp32", "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    results = report["results"]
    assert [r["dtype"] for r in results] == ["bf16", "fp16", "fp32"]
    for r in results:
        assert r["prompts"] == 6 and len(r["rows"]) == 6 and r["head_type"] == "medusa"
        assert r["departed"] == sum(row["departed"] for row in r["rows"])
        assert r["all_near_ties"] and r["not_near_ties"] == [] and r["plain_logits_consistent"]
    for r in results[:2]:  # something to judge: departures, each a gap of a few units
        assert r["departed"] >= 1 and r["max_gap_ulps"] <= report["near_tie_ulps"]
    assert results[2]["departed"] == 0  # fp32: token-identical to plain greedy decoding


def test_dtype_bench_runs_both_dtypes_side_by_side_and_fp32_stays_exact(varied, tmp_path):
    script = Path(__file__).resolve().parents[2] / "bench" / "bench_cpu_dtypes.py"
    out = tmp_path / "dtypes.json"
    run = subprocess.run(
        [sys.executable, str(script), "--bundle-fp32", str(varied.run), "--bundle-bf16",
         str(varied.run), *map(str, model_args(varied)), "--prompts", "3",
         "--max-new-tokens", "12", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert set(rows) == {"fp32 autoregressive", "fp32 bundle", "bf16 autoregressive",
                         "bf16 bundle"}
    assert all(row["tokens_per_second"] > 0 for row in rows.values())
    assert rows["fp32 autoregressive"]["mean_accept_length"] == 1.0
    assert rows["fp32 bundle"]["prompts_departing_from_plain_greedy"] == []  # exact in fp32
    assert set(rows["bf16 bundle"]["prompts_departing_from_plain_greedy"]) <= {0, 1, 2}
    assert 0 <= report["bf16_greedy_departs_from_fp32_on"] <= 3
    for name, entry in report["ratios"].items():
        row, baseline = name.split(" / ")
        assert entry["ratio"] == pytest.approx(rows[row]["tokens_per_second"]
                                               / rows[baseline]["tokens_per_second"])
        assert entry["ci95"] is None or entry["ci95"][0] <= entry["ci95"][1]


@pytest.fixture(scope="module")
def padded_bundle(varied) -> Path:
    """The calibrated bundle switching between a 2-node chain and a 5-node tree (the tiny heads
    earn no tree under the CPU curve, so the search chose the empty one), its latency model
    padding them to 3 and 7 nodes (a table only a measurement derives)."""
    from entmtp.treesearch._bundle import TreeStats
    from entmtp.treesearch._tree import Tree

    bundle = load_bundle(varied.run / "bundle.json")
    trees = [Tree.from_paths([[0], [0, 0]]),
             Tree.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0]])]
    latency = dataclasses.replace(bundle.latency, padded_nodes=((2, 3), (5, 7)))
    padded = dataclasses.replace(
        bundle, trees=trees, thresholds=[1.0], best_static=None, latency=latency,
        tree_stats=[TreeStats(1.0, latency.tree_ms(t)) for t in trees])
    return save_bundle(padded, varied.root / "padded-bundle.json")


def test_bundles_verify_at_their_padded_widths_unless_told_not_to(varied, padded_bundle,
                                                                  tmp_path):
    bundle = load_bundle(padded_bundle)
    assert bundle.latency.padding == {2: 3, 5: 7}  # the table travels in the bundle
    out = tmp_path / "validate.json"
    result = invoke(["validate", padded_bundle, *model_args(varied), "--prompts", 3,
                     "--max-new-tokens", MAX_NEW_TOKENS, "--json", out])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["lossless"] is True and report["replay_step_agreement"] == 1.0
    note = report["runtime"]["runtime_note"]
    assert "trees verified at padded widths: 2->3, 5->7 nodes" in note
    unpadded = tmp_path / "unpadded.json"
    result = invoke(["validate", padded_bundle, *model_args(varied), "--prompts", 3,
                     "--max-new-tokens", MAX_NEW_TOKENS, "--json", unpadded, "--no-pad",
                     "--no-replay"])
    assert result.exit_code == 0, result.output
    assert "padded" not in json.loads(unpadded.read_text())["runtime"]["runtime_note"]
    result = invoke(["decode", padded_bundle, "--prompt", "Hello there", "--max-new-tokens", 12,
                     "--model", varied.model, "--heads", varied.medusa])
    assert result.exit_code == 0, result.output
    assert "padded widths" in result.output.replace("\n", " ")
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--bundle", padded_bundle, *model_args(varied), "--prompts", 2,
                     "--max-new-tokens", 12, "--json", out])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert all(row["lossless"] for row in report["rows"])
    notes = report["runtime"]["runtime_note"]  # the reference tree's decoder is unpadded
    assert isinstance(notes, list) and sum("padded widths" in n for n in notes) == 1


@pytest.mark.parametrize("command", ["calibrate", "latency", "latency --random-weights"])
def test_device_reaches_the_model_loader(varied, tmp_path, monkeypatch, command):
    """--device reaches the loader of calibrate and latency (with loaded or random weights).
    This machine may have no GPU, so the device check lets a CUDA name through and the loader
    stops the command once it has seen it."""
    import entmtp.calibrate._pipeline as pipeline
    import entmtp.evaluation._measure as measure
    import entmtp.model._loading as loading
    import entmtp.model._random_model as random_model
    from entmtp.core import EntmtpError

    loads = []

    def stop_at_the_load(*args, device, dtype, **kwargs):
        loads.append({"device": device, "dtype": loading.resolve_dtype_name(dtype)})
        raise EntmtpError("stopped at the load")

    def lenient(device: str) -> str:
        return device if device.startswith("cuda") else loading.check_device(device)

    monkeypatch.setattr(loading, "check_device", lenient)
    monkeypatch.setattr(measure, "check_device", lenient)
    for module in (pipeline, measure):
        monkeypatch.setattr(module, "load_model_and_heads", stop_at_the_load)
    monkeypatch.setattr(random_model, "random_model", stop_at_the_load)
    out = tmp_path / "out"
    if command == "calibrate":
        args = ["calibrate", *model_args(varied), "--prompts", 3, "--out", out]
    else:
        args = ["latency", "--model", varied.model, "--heads", varied.medusa,
                *command.split()[1:], "--out", out / "latency.json"]
    result = invoke([*args, "--device", "cuda:1", "--dtype", "fp16"])
    assert_one_line_error(result, "stopped at the load")
    assert loads == [{"device": "cuda:1", "dtype": "float16"}]
    assert not (out / "bundle.json").exists() and not (out / "latency.json").exists()
