"""`entmtp heads data` then `entmtp heads train --from-data` on a tiny random model folder."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from entmtp.cli.app import app
from support import make_tiny_model_dir

runner = CliRunner()

ROWS = [
    {"prompt": "def add(a, b):", "source": "code"},
    {"prompt": "Once upon a time", "source": "lit"},
    {"prompt": "What is 2 + 3?", "answer": "2 + 3 = 5. The answer is 5.", "source": "gsm8k"},
    {"prompt": "The quick brown fox"},
    {"prompt": "Name a colour.", "answer": "Blue.", "source": "chat"},
]


def invoke(args: list) -> object:
    return runner.invoke(app, [str(a) for a in args])


def write_rows(path: Path) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in ROWS)
    return path


def make_data(model_dir: Path, tmp_path: Path, max_new_tokens: int) -> Path:
    """A head-data folder of ``ROWS`` for the tiny model."""
    rows = write_rows(tmp_path / "mix.jsonl.gz")
    folder = tmp_path / "data"
    made = invoke(["heads", "data", "--model", model_dir, "--data", rows,
                   "--max-new-tokens", max_new_tokens, "--out", folder])
    assert made.exit_code == 0, made.output
    return folder


def one_line_error(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    # before the error, at most the line that says the model is loading
    assert all(line.startswith("loading model ") for line in lines[:-1]), result.output
    assert lines[-1].startswith("entmtp: error:"), result.output
    assert needle in lines[-1], result.output


def test_data_then_train_from_data(tiny_model_dir, tmp_path):
    from entmtp.calibrate._headdata import read_head_data
    from entmtp.model import load_heads
    from entmtp.model._base_model import load_base_model

    rows = write_rows(tmp_path / "mix.jsonl.gz")
    folder = tmp_path / "data"
    made = invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                   "--max-new-tokens", 6, "--max-answer-tokens", 8, "--generation-batch", 2,
                   "--shard-size", 2, "--out", folder])
    assert made.exit_code == 0, made.output
    # the output is no terminal: progress as lines a log keeps, not a bar drawn at the end
    assert "generating trajectories: 3/3 (100%)" in made.output
    assert "generating trajectories ━" not in made.output
    base = load_base_model(tiny_model_dir)
    data = read_head_data(folder, base)
    assert [r.source for r in data.records] == ["code", "lit", "gsm8k", "mix", "chat"]
    assert data.index["num_shards"] == 3
    answer = base.tokenizer("Blue.", add_special_tokens=False)["input_ids"]
    chat = data.records[4]
    prompt = base.encode_prompt("Name a colour.")
    assert chat.tokens.tolist()[: len(prompt) + len(answer)] == prompt + answer
    assert chat.start == len(prompt) - 1
    again = invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                    "--max-new-tokens", 6, "--max-answer-tokens", 8, "--generation-batch", 2,
                    "--shard-size", 2, "--out", folder])
    assert again.exit_code == 0, again.output  # finished data: nothing to redo

    for head_type in ("medusa", "hydra"):
        out = tmp_path / head_type
        trained = invoke(["heads", "train", "--type", head_type, "--model", tiny_model_dir,
                          "--from-data", folder, "--num-heads", 2, "--epochs", 1,
                          "--batch-size", 8, "--heldout-fraction", 0.2, "--out", out])
        assert trained.exit_code == 0, trained.output
        assert any(line.startswith("training: ") and "(100%)" in line
                   for line in trained.output.splitlines()), trained.output
        heads = load_heads(out, base.model)
        training = json.loads((out / "config.json").read_text())["training"]
        assert heads.head_type == head_type and training["softmax_vocab"] == "full"
        assert [d["records"] for d in training["head_data"]] == [5]
        assert training["heldout_trajectories"] == 1


def test_max_seconds_shortens_the_training_and_still_writes_the_heads(tiny_model_dir,
                                                                     tmp_path):
    from entmtp.model import load_heads
    from entmtp.model._base_model import load_base_model

    folder = tmp_path / "data"
    made = invoke(["heads", "data", "--model", tiny_model_dir, "--data",
                   write_rows(tmp_path / "mix.jsonl.gz"), "--max-new-tokens", 6,
                   "--max-answer-tokens", 8, "--generation-batch", 2, "--shard-size", 2,
                   "--out", folder])
    assert made.exit_code == 0, made.output
    out = tmp_path / "heads"
    # a deadline that has passed by the first step: one step, then the heads as usual
    trained = invoke(["heads", "train", "--type", "hydra", "--model", tiny_model_dir,
                      "--from-data", folder, "--num-heads", 2, "--epochs", 3,
                      "--batch-size", 4, "--heldout-fraction", 0.2, "--max-seconds", 0.001,
                      "--out", out])
    assert trained.exit_code == 0, trained.output
    training = json.loads((out / "config.json").read_text())["training"]
    assert training["steps"] == 1 < training["planned_steps"]
    assert f"trained 1 of {training['planned_steps']} planned steps" in trained.output
    assert load_heads(out, load_base_model(tiny_model_dir).model).head_type == "hydra"


def test_hidden_cache_is_written_once_and_serves_later_runs(tiny_model_dir, tmp_path,
                                                            monkeypatch):
    """The first run writes the teacher-forced hidden states; a later run (same or other head
    type) reads them instead of running the base model, and trains exactly the same heads; a
    cache of other data is refused in one line."""
    from safetensors.torch import load_file

    from entmtp.calibrate import _headdata

    rows = write_rows(tmp_path / "mix.jsonl.gz")
    folder = tmp_path / "data"
    made = invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                   "--max-new-tokens", 6, "--generation-batch", 2, "--shard-size", 2,
                   "--out", folder])
    assert made.exit_code == 0, made.output
    cache = tmp_path / "hidden.safetensors"

    def train(out, head_type="medusa", extra=()):
        return invoke(["heads", "train", "--type", head_type, "--model", tiny_model_dir,
                       "--from-data", folder, "--num-heads", 2, "--epochs", 1, "--batch-size", 8,
                       "--heldout-fraction", 0.2, *extra, "--out", out])

    fresh = train(tmp_path / "fresh")
    assert fresh.exit_code == 0, fresh.output
    first = train(tmp_path / "first", extra=("--hidden-cache", cache))
    assert first.exit_code == 0 and cache.is_file(), first.output

    def no_forward(*args, **kwargs):
        raise AssertionError("the base model ran although the cache holds its states")

    monkeypatch.setattr(_headdata, "record_trajectories", no_forward)
    second = train(tmp_path / "second", extra=("--hidden-cache", cache))
    assert second.exit_code == 0, second.output
    weights = [load_file(tmp_path / name / "heads.safetensors")
               for name in ("fresh", "first", "second")]
    assert weights[0].keys() == weights[1].keys() == weights[2].keys()
    assert all(torch.equal(weights[0][k], w[k]) for w in weights[1:] for k in weights[0])
    hydra = train(tmp_path / "hydra", head_type="hydra", extra=("--hidden-cache", cache))
    assert hydra.exit_code == 0, hydra.output

    other = tmp_path / "other"
    made = invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                   "--max-new-tokens", 4, "--out", other])
    assert made.exit_code == 0, made.output
    one_line_error(invoke(["heads", "train", "--type", "medusa", "--model", tiny_model_dir,
                           "--from-data", other, "--hidden-cache", cache,
                           "--out", tmp_path / "h"]), "holds hidden states of other head data")
    assert not (tmp_path / "h").exists()
    one_line_error(invoke(["heads", "train", "--type", "medusa", "--model", tiny_model_dir,
                           "--hidden-cache", cache, "--out", tmp_path / "h"]), "give both")
    one_line_error(invoke(["heads", "train", "--type", "medusa", "--model", tiny_model_dir,
                           "--from-data", folder, "--hidden-cache", tmp_path,
                           "--out", tmp_path / "h"]), "is a folder")


def test_several_data_folders_train_together_each_with_its_cache(tiny_model_dir, tmp_path):
    """Repeated --from-data trains on every folder's trajectories (each recorded in the config),
    each folder's hidden states kept in its own --hidden-cache; a cache count that does not
    match, or a folder named twice, is a one-line error."""
    from safetensors.torch import load_file

    first = make_data(tiny_model_dir, tmp_path, max_new_tokens=6)
    second = tmp_path / "second"
    with gzip.open(tmp_path / "more.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"prompt": f"Count to {n}.", "source": "more"}) + "\n"
                          for n in range(3))
    made = invoke(["heads", "data", "--model", tiny_model_dir, "--data",
                   tmp_path / "more.jsonl.gz", "--max-new-tokens", 5, "--out", second])
    assert made.exit_code == 0, made.output
    caches = [tmp_path / "first.hidden", tmp_path / "second.hidden"]

    def train(out, *extra):
        return invoke(["heads", "train", "--type", "hydra", "--model", tiny_model_dir,
                       "--num-heads", 2, "--epochs", 1, "--batch-size", 8,
                       "--heldout-fraction", 0, *extra, "--out", out])

    both = train(tmp_path / "both", "--from-data", first, "--from-data", second,
                 "--hidden-cache", caches[0], "--hidden-cache", caches[1])
    assert both.exit_code == 0, both.output
    assert all(path.is_file() for path in caches)
    training = json.loads((tmp_path / "both" / "config.json").read_text())["training"]
    assert [d["records"] for d in training["head_data"]] == [5, 3]
    assert [d["sources"] for d in training["head_data"]][1] == ["more"]
    assert training["train_trajectories"] == 8
    again = train(tmp_path / "again", "--from-data", first, "--from-data", second,
                  "--hidden-cache", caches[0], "--hidden-cache", caches[1])
    assert again.exit_code == 0, again.output
    a, b = (load_file(tmp_path / name / "heads.safetensors") for name in ("both", "again"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # the caches hold what the forward gave
    one_line_error(train(tmp_path / "h", "--from-data", first, "--from-data", second,
                         "--hidden-cache", caches[0]), "give one file per folder")
    one_line_error(train(tmp_path / "h", "--from-data", first, "--from-data", first),
                   "names a folder twice")
    one_line_error(train(tmp_path / "h", "--from-data", first, "--from-data", second,
                         "--hidden-cache", caches[1], "--hidden-cache", caches[0]),
                   "holds hidden states of other head data")
    assert not (tmp_path / "h").exists()


def test_from_shard_trains_on_the_later_shards_and_keeps_the_whole_cache(tiny_model_dir,
                                                                         tmp_path):
    """--from-shard N trains on the records of shards N.. (recorded in the config), while
    --hidden-cache still covers every shard, so a later run from shard 0 reads it as is; a
    shard past the data, a negative one or a count that does not match --from-data is a
    one-line error that writes nothing."""
    rows = write_rows(tmp_path / "mix.jsonl.gz")
    folder = tmp_path / "data"
    assert invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                   "--max-new-tokens", 6, "--generation-batch", 2, "--shard-size", 2,
                   "--out", folder]).exit_code == 0
    cache = tmp_path / "hidden.safetensors"

    def train(out, *extra):
        return invoke(["heads", "train", "--type", "hydra", "--model", tiny_model_dir,
                       "--from-data", folder, "--num-heads", 2, "--epochs", 1,
                       "--batch-size", 8, "--heldout-fraction", 0, *extra, "--out", out])

    later = train(tmp_path / "later", "--from-shard", 1, "--hidden-cache", cache)
    assert later.exit_code == 0, later.output
    training = json.loads((tmp_path / "later" / "config.json").read_text())["training"]
    assert training["train_trajectories"] == 3  # shards of 2, 2 and 1 records: the last two
    assert [(d["first_shard"], d["records"]) for d in training["head_data"]] == [(1, 3)]
    every = train(tmp_path / "every", "--hidden-cache", cache)
    assert every.exit_code == 0, every.output
    training = json.loads((tmp_path / "every" / "config.json").read_text())["training"]
    assert training["train_trajectories"] == 5
    assert [(d["first_shard"], d["records"]) for d in training["head_data"]] == [(0, 5)]
    one_line_error(train(tmp_path / "h", "--from-shard", 3), "the data has 3 finished shards")
    one_line_error(train(tmp_path / "h", "--from-shard", -1), "at least 0")
    one_line_error(train(tmp_path / "h", "--from-shard", 1, "--from-shard", 0),
                   "give one per folder")
    assert not (tmp_path / "h").exists()


def test_init_heads_goes_on_from_given_heads(tiny_model_dir, tmp_path):
    """--init-heads starts from the folder's weights (a vanishing lr leaves them as they were),
    records where it started, and refuses heads of another type or shape in one line."""
    from safetensors.torch import load_file

    rows = write_rows(tmp_path / "mix.jsonl.gz")
    folder = tmp_path / "data"
    assert invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                   "--max-new-tokens", 6, "--out", folder]).exit_code == 0

    def train(out, *extra):
        return invoke(["heads", "train", "--type", "medusa", "--model", tiny_model_dir,
                       "--from-data", folder, "--epochs", 1, "--batch-size", 8,
                       "--heldout-fraction", 0.2, *extra, "--out", out])

    start = tmp_path / "start"
    assert train(start, "--num-heads", 2, "--num-layers", 2, "--seed", 5).exit_code == 0
    kept = train(tmp_path / "kept", "--init-heads", start, "--lr", 1e-12)
    assert kept.exit_code == 0, kept.output
    moved = train(tmp_path / "moved", "--init-heads", start, "--num-heads", 2, "--lr", 0.05)
    assert moved.exit_code == 0, moved.output
    before, after, trained = (load_file(tmp_path / name / "heads.safetensors")
                              for name in ("start", "kept", "moved"))
    assert before.keys() == after.keys() == trained.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(not torch.equal(before[k], trained[k]) for k in before)
    # a bf16 base: the heads start from their stored values, not rounded to bf16
    kept_bf16 = train(tmp_path / "kept-bf16", "--init-heads", start, "--lr", 1e-12,
                      "--dtype", "bf16")
    assert kept_bf16.exit_code == 0, kept_bf16.output
    after_bf16 = load_file(tmp_path / "kept-bf16" / "heads.safetensors")
    assert all(torch.equal(before[k], after_bf16[k]) for k in before)
    start_sha = json.loads((start / "config.json").read_text())["sha256"]
    record = json.loads((tmp_path / "kept" / "config.json").read_text())["training"]
    assert record["init_heads"] == {"sha256": start_sha}
    assert str(tmp_path) not in (tmp_path / "kept" / "config.json").read_text()

    distilled = train(tmp_path / "distilled", "--init-heads", start, "--distill", 4,
                      "--loss", "batch")
    assert distilled.exit_code == 0, distilled.output
    assert any(line.startswith("teacher distribution: ") and "(100%)" in line
               for line in distilled.output.splitlines()), distilled.output
    record = json.loads((tmp_path / "distilled" / "config.json").read_text())["training"]
    assert record["distill_topk"] == 4 and record["softmax_vocab"] == "batch"
    one_line_error(train(tmp_path / "h", "--distill", 4, "--loss", "seen"), "--distill 4")
    one_line_error(train(tmp_path / "h", "--distill", -1), "--distill -1")
    one_line_error(invoke(["heads", "train", "--type", "hydra", "--model", tiny_model_dir,
                           "--from-data", folder, "--init-heads", start,
                           "--out", tmp_path / "h"]), "holds medusa heads")
    one_line_error(train(tmp_path / "h", "--init-heads", start, "--num-layers", 1),
                   "--num-layers 1 differs")
    one_line_error(train(tmp_path / "h", "--init-heads", tmp_path / "nowhere"),
                   "is not a folder")
    assert not (tmp_path / "h").exists()


def test_other_models_data_and_bad_input_are_one_line_errors(tiny_model_dir, tmp_path):
    rows = write_rows(tmp_path / "mix.jsonl.gz")
    folder = tmp_path / "data"
    made = invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                   "--max-new-tokens", 3, "--out", folder])
    assert made.exit_code == 0, made.output
    other = make_tiny_model_dir(tmp_path / "other", seed=5)
    one_line_error(invoke(["heads", "train", "--type", "medusa", "--model", other,
                           "--from-data", folder, "--out", tmp_path / "h"]), "made for model")
    assert not (tmp_path / "h").exists()
    one_line_error(invoke(["heads", "train", "--type", "medusa", "--model", tiny_model_dir,
                           "--from-data", tmp_path, "--out", tmp_path / "h"]),
                   "no head-data folder")
    one_line_error(invoke(["heads", "data", "--model", tiny_model_dir, "--out", folder]),
                   "--task and/or --data")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"answer": "no prompt"}\n')
    one_line_error(invoke(["heads", "data", "--model", tiny_model_dir, "--data", bad,
                           "--out", tmp_path / "d2"]), "needs a non-empty string 'prompt'")
    one_line_error(invoke(["heads", "train", "--type", "medusa", "--model", tiny_model_dir,
                           "--from-data", folder, "--loss", "topk", "--out", tmp_path / "h"]),
                   "--loss")


def test_eval_reports_each_heads_accuracy_per_source(tiny_model_dir, tiny_medusa_dir,
                                                     tiny_hydra_dir, tmp_path):
    from entmtp.calibrate._accuracy import head_accuracy, head_ranks
    from entmtp.calibrate._headdata import read_head_data, record_trajectories
    from entmtp.model import load_heads
    from entmtp.model._base_model import load_base_model
    from entmtp.treesearch import expected_accept_length, reference_tree

    folder = make_data(tiny_model_dir, tmp_path, 5)
    rows = tmp_path / "mix.jsonl.gz"
    report = tmp_path / "eval.json"
    result = invoke(["heads", "eval", "--model", tiny_model_dir, "--from-data", folder,
                     "--heads", tiny_medusa_dir, "--heads", tiny_hydra_dir, "--json", report])
    assert result.exit_code == 0, result.output
    stored = json.loads(report.read_text())["heads"]
    base = load_base_model(tiny_model_dir)
    trajectories = record_trajectories(base, read_head_data(folder, base).records)
    for path in (tiny_medusa_dir, tiny_hydra_dir):
        heads = load_heads(path, base.model)
        rows_by_source = stored[str(path)]
        assert set(rows_by_source) == {"code", "lit", "gsm8k", "mix", "chat", "all"}
        expected = head_accuracy(heads, [t for t in trajectories if t.source == "gsm8k"])
        assert rows_by_source["gsm8k"] == [vars(a) for a in expected]
        assert rows_by_source["all"] == [vars(a) for a in head_accuracy(heads, trajectories)]
        accept = json.loads(report.read_text())["accept_length"][str(path)]["mc_sim_7b_63"]
        mc_sim = reference_tree("mc_sim_7b_63")
        gsm8k = head_ranks(heads, [t for t in trajectories if t.source == "gsm8k"], topk=10)
        assert accept["gsm8k"] == pytest.approx(expected_accept_length(mc_sim, gsm8k.ranks))
        assert accept["all"] == pytest.approx(
            head_ranks(heads, trajectories, topk=10).accept_length(mc_sim))
    assert "mc_sim_7b_63: mean accept length replayed" in result.output
    assert "x)" in result.output  # the second heads' ratio to the first
    one_line_error(invoke(["heads", "eval", "--model", tiny_model_dir, "--from-data", folder,
                           "--heads", tiny_medusa_dir, "--tree", "no_such_tree"]),
                   "no shipped reference tree 'no_such_tree'")
    # one new token: deeper heads have nothing to score on the self-distilled sources
    short = tmp_path / "short"
    assert invoke(["heads", "data", "--model", tiny_model_dir, "--data", rows,
                   "--max-new-tokens", 1, "--out", short]).exit_code == 0
    result = invoke(["heads", "eval", "--model", tiny_model_dir, "--from-data", short,
                     "--heads", tiny_medusa_dir, "--json", report])
    assert result.exit_code == 0, result.output
    code = json.loads(report.read_text())["heads"][str(tiny_medusa_dir)]["code"]
    assert code[0]["positions"] == 0 and code[0]["top1"] is None


def test_draft_vocab_gives_heads_the_most_frequent_targets_of_the_data(tiny_model_dir,
                                                                      tiny_hydra_dir, tmp_path):
    from entmtp.calibrate._head_examples import _examples, _prefixes
    from entmtp.calibrate._headdata import read_head_data, record_trajectories
    from entmtp.model import load_heads
    from entmtp.model._base_model import load_base_model
    from entmtp.model._draft_vocab import frequent_tokens, target_token_counts

    folder = make_data(tiny_model_dir, tmp_path, 8)
    out = tmp_path / "subset"
    result = invoke(["heads", "draft-vocab", "--model", tiny_model_dir, "--heads", tiny_hydra_dir,
                     "--from-data", folder, "--size", 70, "--out", out])
    assert result.exit_code == 0, result.output
    base = load_base_model(tiny_model_dir)
    counts = target_token_counts(((r.tokens, r.start) for r in read_head_data(folder).records),
                                 128)
    heads = load_heads(out, base.model)
    original = load_heads(tiny_hydra_dir, base.model)
    assert heads.draft_vocab.tolist() == frequent_tokens(counts, 70).tolist()
    assert heads.sha256() != original.sha256()
    for name, tensor in original.state_dict().items():  # the same weights
        assert torch.equal(heads.state_dict()[name], tensor), name
    config = json.loads((out / "config.json").read_text())
    old_config = json.loads((tiny_hydra_dir / "config.json").read_text())
    assert config["sha256"] == heads.sha256() and config["draft_vocab_size"] == 70
    assert config["storage_dtype"] == old_config["storage_dtype"]
    record = config["training"]["draft_vocab"]
    assert record["size"] == 70 and record["heads_sha256"] == original.sha256()
    assert not {"data", "heads"} & set(record)  # digests, not this machine's paths
    assert record["targets"] == int(counts.sum())
    assert record["coverage"] == pytest.approx(counts[heads.draft_vocab.numpy()].sum()
                                               / counts.sum())
    assert f"drafting over 70 of 128 tokens ({record['coverage']:.1%}" in result.output
    # heads trained on from them keep the subset, and the record of where it came from
    trained_on = invoke(["heads", "train", "--type", "hydra", "--model", tiny_model_dir,
                         "--from-data", folder, "--init-heads", out, "--epochs", 1,
                         "--batch-size", 8, "--out", tmp_path / "trained-on"])
    assert trained_on.exit_code == 0, trained_on.output
    later = json.loads((tmp_path / "trained-on" / "config.json").read_text())
    assert later["draft_vocab_size"] == 70 and later["training"]["draft_vocab"] == record
    assert torch.equal(load_heads(tmp_path / "trained-on", base.model).draft_vocab,
                       heads.draft_vocab)
    # eval ranks the new heads' targets among their subset: the full logits of the old heads
    # with every other token masked out (a target outside it is never a hit)
    report = tmp_path / "eval.json"
    assert invoke(["heads", "eval", "--model", tiny_model_dir, "--from-data", folder,
                   "--heads", tiny_hydra_dir, "--heads", out, "--json", report]).exit_code == 0
    accuracy = json.loads(report.read_text())["heads"][str(out)]["all"]
    trajectories = record_trajectories(base, read_head_data(folder).records)
    examples = _examples(trajectories, heads.num_heads)
    outside = torch.ones(128, dtype=torch.bool)
    outside[heads.draft_vocab] = False
    for depth in (1, 2):
        valid = examples.targets[:, depth - 1] >= 0
        rows = examples.rows[valid]
        with torch.no_grad():
            logits = original.head_logits(depth, examples.hidden[rows],
                                          _prefixes(examples, rows, depth))
        logits[:, outside] = float("-inf")
        top = torch.topk(logits, 5, dim=-1).indices
        target = examples.targets[valid, depth - 1]
        assert accuracy[depth - 1]["positions"] == len(rows)
        assert accuracy[depth - 1]["top1"] == pytest.approx(
            float((top[:, 0] == target).float().mean()))
        assert accuracy[depth - 1]["top5"] == pytest.approx(
            float((top == target[:, None]).any(-1).float().mean()))

    for size in (63, 129):
        one_line_error(invoke(["heads", "draft-vocab", "--model", tiny_model_dir, "--heads",
                               tiny_hydra_dir, "--from-data", folder, "--size", size,
                               "--out", tmp_path / "bad"]), "--size must be in 64..128")
    assert not (tmp_path / "bad").exists()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    one_line_error(invoke(["heads", "draft-vocab", "--model", tiny_model_dir, "--heads",
                           tiny_hydra_dir, "--from-data", folder, "--size", 70,
                           "--out", tmp_path / "taken"]), "holds 'notes.txt'")
    one_line_error(invoke(["heads", "draft-vocab", "--model", tiny_model_dir, "--heads",
                           tiny_hydra_dir, "--from-data", tmp_path, "--size", 70,
                           "--out", tmp_path / "bad"]), "no head-data folder")


def test_draft_vocab_into_its_own_source_heads_is_refused(tiny_model_dir, tiny_hydra_dir,
                                                          tmp_path):
    folder = make_data(tiny_model_dir, tmp_path, 4)
    source = tmp_path / "heads"
    shutil.copytree(tiny_hydra_dir, source)
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    result = invoke(["heads", "draft-vocab", "--model", tiny_model_dir, "--heads", source,
                     "--from-data", folder, "--size", 70, "--out", tmp_path / "." / "heads"])
    one_line_error(result, "is the source heads")
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
