"""A random-weights model is the real model's architecture with other weights."""

from __future__ import annotations

import pytest
import torch

from entmtp.core import EntmtpError
from entmtp.model._random_model import model_config, random_model

# Bookkeeping fields that say where or how a config was saved, not what the model is.
_NOT_ARCHITECTURE = {"_name_or_path", "transformers_version", "dtype", "torch_dtype"}


def _architecture(config) -> dict:
    return {k: v for k, v in config.to_dict().items() if k not in _NOT_ARCHITECTURE}


@pytest.fixture(scope="module")
def real_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def test_same_config_and_shapes_other_weights(tiny_model_dir, real_model):
    built = random_model(tiny_model_dir, seed=1)
    assert built.name == tiny_model_dir.resolve().name
    assert type(built.model) is type(real_model)
    assert _architecture(built.model.config) == _architecture(real_model.config)
    real_state, random_state = real_model.state_dict(), built.model.state_dict()
    assert list(random_state) == list(real_state)
    for key, tensor in real_state.items():
        assert random_state[key].shape == tensor.shape, key
        assert random_state[key].dtype == tensor.dtype, key
    matrices = [key for key, tensor in real_state.items() if tensor.ndim >= 2]
    assert matrices
    for key in matrices:
        assert not torch.equal(random_state[key], real_state[key]), key
    # tied embeddings stay tied, as in the real model
    assert (built.model.get_output_embeddings().weight.data_ptr()
            == built.model.get_input_embeddings().weight.data_ptr()) == \
        (real_model.get_output_embeddings().weight.data_ptr()
         == real_model.get_input_embeddings().weight.data_ptr())


def test_forward_has_the_real_models_output_shape(tiny_model_dir, real_model):
    built = random_model(tiny_model_dir, seed=2)
    ids = torch.arange(3, 12).unsqueeze(0)
    with torch.no_grad():
        real_logits = real_model(ids).logits
        random_logits = built.model(ids).logits
    assert random_logits.shape == real_logits.shape
    assert torch.isfinite(random_logits).all()


def test_seed_decides_the_weights(tiny_model_dir):
    first = random_model(tiny_model_dir, seed=3).model.state_dict()
    again = random_model(tiny_model_dir, seed=3).model.state_dict()
    other = random_model(tiny_model_dir, seed=4).model.state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_dtype_and_global_rng_untouched(tiny_model_dir):
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    built = random_model(tiny_model_dir, dtype="bf16")
    assert torch.equal(torch.rand(4), expected)  # building a model does not move the caller's RNG
    assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}


def test_config_only_folder_is_enough(tiny_model_dir, tmp_path):
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    found = model_config(tmp_path)
    assert _architecture(found.config) == _architecture(model_config(tiny_model_dir).config)
    random_model(tmp_path)  # no weight files, no tokenizer


@pytest.mark.parametrize("kind", ["missing", "empty_folder", "not_gguf"])
def test_bad_model_specs_are_one_line_errors(tmp_path, kind):
    spec = {"missing": tmp_path / "nope.gguf", "empty_folder": tmp_path,
            "not_gguf": tmp_path / "weights.bin"}[kind]
    if kind == "not_gguf":
        spec.write_bytes(b"x")
    with pytest.raises(EntmtpError) as err:
        model_config(spec)
    assert "\n" not in str(err.value)
    assert str(spec) in str(err.value)


@pytest.mark.integration
def test_default_gguf_config_from_metadata_matches_the_cache():
    """The GGUF metadata (no dequantization) and the dequantized cache give one architecture."""
    from transformers import AutoConfig

    from entmtp.model import _random_model
    from entmtp.model._base_model import default_gguf_path

    path = default_gguf_path().resolve()
    cached = _random_model._cached_gguf_folder(path)
    if cached is None:
        pytest.skip("the default model has not been dequantized into the cache yet")
    from_metadata = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    found = model_config(None)
    assert found.name == path.stem
    assert _architecture(found.config) == _architecture(AutoConfig.from_pretrained(cached))
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "tie_word_embeddings"):
        assert getattr(found.config, key) == getattr(from_metadata, key), key


@pytest.mark.integration
def test_shipped_config_copy_is_the_default_models_architecture():
    """trees/latency/ ships the default model's config so a GPU machine without the GGUF
    package builds the same architecture (entmtp latency --random-weights --model)."""
    from importlib import resources

    shipped = resources.files("entmtp.trees").joinpath("latency", "SmolLM2-135M-Instruct.Q4_1")
    found = model_config(str(shipped))
    default = model_config(None)
    assert found.name == default.name
    assert _architecture(found.config) == _architecture(default.config)
