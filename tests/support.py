"""Helpers shared by the tests (importable as ``support``; pyproject puts tests/ on the path).

Fixtures that wrap these live in tests/conftest.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path | None:
    """``../shared`` next to the checkout (or $ENTMTP_SHARED); None on a user's fresh clone."""
    candidate = Path(os.environ.get("ENTMTP_SHARED", REPO_ROOT.parent / "shared"))
    return candidate if (candidate / "datasets").is_dir() else None


requires_shared = pytest.mark.skipif(
    shared_dir() is None,
    reason="needs ../shared/datasets (present in CI; absent on a fresh clone)",
)


def load_bench_script(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as a module (the bench scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  REPO_ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


class SteppingClock:
    """A clock that advances ``per_call`` seconds at every read: deadlines without waiting."""

    def __init__(self, per_call: float) -> None:
        self.now, self.per_call = 0.0, per_call

    def __call__(self) -> float:
        self.now += self.per_call
        return self.now


def make_tiny_llama(seed: int = 0, *, vocab_size: int = 128, hidden_size: int = 32,
                    num_layers: int = 2, max_positions: int = 512):
    """A tiny random LlamaForCausalLM (fp32, eval mode) for fast unit tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    return model


def make_varied_tiny_llama(seed: int = 3):
    """``make_tiny_llama`` with its matrices scaled up 8x, so that greedy decoding of the random
    model does not collapse into one repeated token and trajectories have some variety."""
    import torch

    model = make_tiny_llama(seed=seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(8.0)
    return model


def make_char_tokenizer(vocab_size: int = 128):
    """A character-level fast tokenizer (printable ASCII + specials), no files needed."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    tokens = specials + chars
    tokens += [f"<extra_{i}>" for i in range(vocab_size - len(tokens))]
    vocab = {token: i for i, token in enumerate(tokens[:vocab_size])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    )


def make_tiny_model_dir(folder: Path, *, seed: int = 0, sharpen: float = 8.0) -> Path:
    """A tiny random Llama + char tokenizer saved as a HF model folder (``--model`` takes it).

    ``sharpen`` scales the tied embeddings so greedy decoding is not near-uniform noise.
    """
    import torch

    model = make_tiny_llama(seed)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(sharpen)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    make_char_tokenizer(model.config.vocab_size).save_pretrained(folder)
    return folder


def save_untied_tiny_llama(folder: Path, *, seed: int = 0, lm_head_seed: int = 1000,
                           lm_head_scale: float = 2.0, **config):
    """``make_tiny_llama(seed, **config)`` with its own random lm_head (``lm_head_scale`` x
    N(0, 1): sharp, untied from the embeddings), saved with the char tokenizer in ``folder``;
    returns the model."""
    import torch

    model = make_tiny_llama(seed, **config)
    generator = torch.Generator().manual_seed(lm_head_seed)
    model.lm_head.weight = torch.nn.Parameter(
        torch.randn(model.lm_head.weight.shape, generator=generator) * lm_head_scale)
    model.config.tie_word_embeddings = False
    model.save_pretrained(folder)
    make_char_tokenizer(model.config.vocab_size).save_pretrained(folder)
    return model


def make_tiny_heads_dir(model_dir: Path, folder: Path, *, head_type: str = "medusa",
                        num_heads: int = 3, seed: int = 0) -> Path:
    """Random entmtp-format heads for the tiny model folder (``--heads`` takes it)."""
    from transformers import AutoModelForCausalLM

    from entmtp.model import new_heads, save_heads

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    heads = new_heads(model, head_type=head_type, num_heads=num_heads, seed=seed)
    save_heads(heads, folder, dtype=None)
    return folder
