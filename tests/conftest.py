"""Shared fixtures: where the shared datasets are, and tiny random models for unit tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from oracle_support import rt  # noqa: F401 - the decoding tests' fixture

from support import (
    make_tiny_heads_dir,
    make_tiny_llama,
    make_tiny_model_dir,
    shared_dir,
)


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    root = shared_dir()
    if root is None:
        pytest.skip("needs ../shared/datasets (present in CI; absent on a fresh clone)")
    return root / "datasets"


@pytest.fixture
def tiny_llama():
    return make_tiny_llama()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def tiny_medusa_dir(tiny_model_dir, tmp_path_factory) -> Path:
    return make_tiny_heads_dir(tiny_model_dir, tmp_path_factory.mktemp("heads") / "medusa")


@pytest.fixture(scope="session")
def tiny_hydra_dir(tiny_model_dir, tmp_path_factory) -> Path:
    return make_tiny_heads_dir(tiny_model_dir, tmp_path_factory.mktemp("heads") / "hydra",
                               head_type="hydra")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Run torch on one intra-op thread in tests that use it.

    The tests' models are tiny (or the default model on a 2-core machine): a second thread
    only adds synchronisation cost, and on a busy machine several times more. Tests that never
    import torch are left alone.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
