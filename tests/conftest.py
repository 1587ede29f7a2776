"""Shared fixtures: where the shared datasets are, and tiny random models for unit tests."""

from __future__ import annotations

import os
from pathlib import Path

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


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    root = shared_dir()
    if root is None:
        pytest.skip("needs ../shared/datasets (present in CI; absent on a fresh clone)")
    return root / "datasets"


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


@pytest.fixture
def tiny_llama():
    return make_tiny_llama()
