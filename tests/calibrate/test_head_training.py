"""Head training as a library call: `entmtp heads train` writes what ``train_heads_run`` writes,
the call reports its stages through the callback and prints nothing, and a bad argument is one
``EntmtpError`` line before the model loads or anything is written."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entmtp.calibrate import TrainArguments, train_heads_run
from entmtp.core import EntmtpError

PROMPTS = ["def add(a, b):", "Once upon a time", "What is 2 + 3?", "The quick brown fox",
           "Name a colour.", "import numpy as np"]
ROWS = [{"prompt": "def add(a, b):", "source": "code"},
        {"prompt": "What is 2 + 3?", "answer": "2 + 3 = 5.", "source": "math"},
        {"prompt": "Once upon a time", "source": "lit"},
        {"prompt": "Name a colour.", "answer": "Blue.", "source": "chat"}]
# run-to-run timings in the training record
TIMES = ("generation_seconds", "training_seconds", "wall_seconds")


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def invoke(args: list) -> object:
    from entmtp.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def written(folder: Path) -> tuple[bytes, dict]:
    """(the weights' bytes, the config without its timings)."""
    config = json.loads((folder / "config.json").read_text())
    for key in TIMES:
        del config["training"][key]
    return (folder / "heads.safetensors").read_bytes(), config


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_the_command_writes_what_the_library_writes(tiny_model_dir, prompts_file, tmp_path,
                                                    head_type):
    options = ["--type", head_type, "--model", tiny_model_dir, "--data", prompts_file,
               "--split", "all", "--prompts", 6, "--num-heads", 2, "--epochs", 2,
               "--batch-size", 8, "--max-new-tokens", 6, "--heldout-fraction", 0.34,
               "--loss", "batch", "--seed", 3]
    result = invoke(["heads", "train", *options, "--out", tmp_path / "command"])
    assert result.exit_code == 0, result.output
    trained = train_heads_run(TrainArguments(
        head_type=head_type, out=tmp_path / "library", model=str(tiny_model_dir),
        data=str(prompts_file), split="all", prompts=6, num_heads=2, epochs=2, batch_size=8,
        max_new_tokens=6, heldout_fraction=0.34, loss="batch", seed=3))
    assert trained.path == tmp_path / "library"
    assert written(tmp_path / "command") == written(trained.path)
    config = json.loads((trained.path / "config.json").read_text())
    assert config["training"] == json.loads(json.dumps(trained.record))
    assert (trained.heads.head_type, trained.heads.num_heads) == (head_type, 2)
    report = trained.report
    assert (report.head_type, report.num_heads, report.softmax_vocab) == (head_type, 2, "batch")
    assert report.heldout_trajectories == 2 and len(report.heldout) == 2


def test_from_data_the_command_writes_what_the_library_writes(tiny_model_dir, tmp_path):
    rows = tmp_path / "mix.jsonl.gz"
    with gzip.open(rows, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in ROWS)
    folder = tmp_path / "data"
    made = invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                   "--max-new-tokens", 5, "--shard-size", 2, "--out", folder])
    assert made.exit_code == 0, made.output
    result = invoke(["heads", "train", "--type", "hydra", "--model", tiny_model_dir,
                     "--from-data", folder, "--from-shard", 1, "--num-heads", 2, "--epochs", 1,
                     "--batch-size", 4, "--heldout-fraction", 0, "--out", tmp_path / "command"])
    assert result.exit_code == 0, result.output
    trained = train_heads_run(TrainArguments(
        head_type="hydra", out=str(tmp_path / "library"), model=str(tiny_model_dir),
        from_data=[str(folder)], from_shard=[1], num_heads=2, epochs=1, batch_size=4,
        heldout_fraction=0.0))
    assert written(tmp_path / "command") == written(trained.path)
    assert trained.record["mode"] == "head-data" and trained.record["heldout"] == []
    assert [entry["first_shard"] for entry in trained.record["head_data"]] == [1]


def test_the_library_reports_its_stages_through_the_callback_and_prints_nothing(
        tiny_model_dir, prompts_file, tmp_path, capfd):
    events: list[tuple[str, int, int]] = []
    trained = train_heads_run(
        TrainArguments(head_type="medusa", out=tmp_path / "heads", model=str(tiny_model_dir),
                       data=str(prompts_file), split="all", prompts=4, num_heads=2, epochs=1,
                       batch_size=8, max_new_tokens=4, heldout_fraction=0.0),
        progress=lambda stage, done, total: events.append((stage, done, total)))
    stages = [stage for stage, _, _ in events]
    assert stages == ["generate"] * stages.count("generate") + ["train"] * stages.count("train")
    for stage in ("generate", "train"):
        last = [event for event in events if event[0] == stage][-1]
        assert last[1] == last[2] > 0, events
    assert trained.report.heldout == [] and trained.record["prompts"] == 4
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.parametrize(("changes", "needle"), [
    ({"head_type": "eagle"}, "--head-type 'eagle'"),
    ({"device": "tpu"}, "--device"),
    ({"dtype": "int8"}, "--dtype"),
    ({"max_seconds": 0.0}, "--max-seconds"),
    ({"num_heads": 0}, "--num-heads"),
    ({"lr": float("nan")}, "--lr nan"),
    ({"heldout_fraction": 1.0}, "--heldout-fraction"),
    ({"loss": "topk"}, "--loss 'topk'"),
    ({"distill": 4, "loss": "seen"}, "--distill 4"),
    ({"hidden_cache": ["cache.safetensors"]}, "give both"),
    ({"from_data": ["a", "b"], "from_shard": [0]}, "--from-shard values"),
    ({"init_heads": "nowhere"}, "is not a folder"),
    ({"tasks": ["poetry"]}, "unknown task"),
])
def test_a_bad_argument_is_one_line_before_the_model_loads(tmp_path, monkeypatch, changes,
                                                           needle):
    import entmtp.calibrate._head_training as head_training

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded although an argument is bad")

    monkeypatch.setattr(head_training, "load_base", no_load)
    monkeypatch.chdir(tmp_path)
    arguments = {"head_type": "medusa", "out": tmp_path / "heads", **changes}
    with pytest.raises(EntmtpError) as refused:
        train_heads_run(TrainArguments(**arguments))
    message = str(refused.value)
    assert needle in message and "\n" not in message
    assert sorted(tmp_path.iterdir()) == []


def test_importing_the_library_call_imports_neither_the_cli_nor_torch():
    code = ("import sys\n"
            "from entmtp.calibrate import TrainArguments, TrainedHeads, train_heads_run\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'typer', 'rich') or m.startswith('entmtp.cli')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"
