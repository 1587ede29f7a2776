import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from entmtp.calibrate import _row_gemm
from entmtp.calibrate._model import load_base_model
from entmtp.calibrate._random_model import random_model
from entmtp.calibrate._row_gemm import (
    FEW_ROWS,
    project_rows,
    use_few_row_kernel,
    uses_few_row_kernel,
)
from tests.support import make_tiny_llama


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 5, 17, FEW_ROWS, FEW_ROWS + 1, 100])
@pytest.mark.parametrize("with_bias", [False, True])
def test_project_rows_is_f_linear(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 48, generator=generator)
    bias = torch.randn(300, generator=generator) if with_bias else None
    features = torch.randn(rows, 48, generator=generator)
    out = project_rows(features, weight, bias)
    assert out.shape == (rows, 300)
    torch.testing.assert_close(out, F.linear(features, weight, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(48,), (1, 1, 48), (2, 3, 48), (1, 7, 48)])
def test_project_rows_keeps_leading_dimensions(shape):
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(20, 48, generator=generator)
    features = torch.randn(*shape, generator=generator)
    out = project_rows(features, weight, None)
    assert out.shape == (*shape[:-1], 20)
    torch.testing.assert_close(out, F.linear(features, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 5, 64, 65])
def test_project_rows_returns_contiguous_rows(rows):
    # A transposed result sends SDPA to its slow math path (and slows elementwise ops).
    out = project_rows(torch.randn(1, rows, 48), torch.randn(20, 48), torch.randn(20))
    assert out.is_contiguous()


def test_project_rows_keeps_autograd():
    weight = torch.randn(10, 6, requires_grad=True)
    features = torch.randn(3, 6)
    project_rows(features, weight, None).sum().backward()
    torch.testing.assert_close(weight.grad, features.sum(0).expand(10, 6))


def _count_linear_calls(monkeypatch) -> dict[str, int]:
    calls = {"F.linear": 0}
    original = _row_gemm.F.linear

    def counting_linear(*args, **kwargs):
        calls["F.linear"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(_row_gemm.F, "linear", counting_linear)
    return calls


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_parameters_take_the_kernel_when_no_gradient_is_recorded(monkeypatch, mode):
    # nn.Parameter requires grad even under no_grad; the kernel must still be used there.
    layer = nn.Linear(16, 8)
    calls = _count_linear_calls(monkeypatch)
    with mode():
        out = project_rows(torch.randn(3, 16), layer.weight, layer.bias)
    assert calls["F.linear"] == 0 and out.shape == (3, 8)


def test_recorded_products_keep_f_linear(monkeypatch):
    layer = nn.Linear(16, 8)
    calls = _count_linear_calls(monkeypatch)
    project_rows(torch.randn(3, 16), layer.weight, layer.bias)
    assert calls["F.linear"] == 1


@torch.inference_mode()
def test_a_patched_model_step_never_calls_f_linear(monkeypatch):
    model = make_tiny_llama(seed=5)
    use_few_row_kernel(model)
    calls = _count_linear_calls(monkeypatch)
    model(torch.arange(3, 8).unsqueeze(0))
    assert calls["F.linear"] == 0


def _linear_layers(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if type(m) is nn.Linear]


@torch.inference_mode()
def test_patched_model_matches_and_decodes_the_same():
    reference = make_tiny_llama(seed=3)
    model = copy.deepcopy(reference)
    assert use_few_row_kernel(model) == len(_linear_layers(model)) > 0
    assert use_few_row_kernel(model) == len(_linear_layers(model))  # idempotent
    assert all(uses_few_row_kernel(m) for m in _linear_layers(model))
    assert not any(uses_few_row_kernel(m) for m in _linear_layers(reference))
    assert model.state_dict().keys() == reference.state_dict().keys()
    for length in (1, 2, 5, 70):
        ids = torch.arange(3, 3 + length).unsqueeze(0) % 128
        torch.testing.assert_close(model(ids).logits, reference(ids).logits,
                                   rtol=1e-5, atol=1e-5)
    prompt = torch.tensor([[5, 9, 17]])
    kwargs = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(model.generate(prompt, **kwargs), reference.generate(prompt, **kwargs))


@torch.inference_mode()
def test_a_deep_copy_computes_with_its_own_weights():
    model = make_tiny_llama(seed=4)
    use_few_row_kernel(model)
    clone = copy.deepcopy(model)
    layer = clone.lm_head
    assert uses_few_row_kernel(layer)
    hidden = torch.randn(2, layer.in_features)
    before = model.lm_head(hidden)
    layer.weight.mul_(2.0)
    torch.testing.assert_close(layer(hidden), 2.0 * before)


def test_subclasses_of_linear_keep_their_forward():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 3.0 * super().forward(x)

    model = nn.Sequential(nn.Linear(4, 4), Scaled(4, 4))
    assert use_few_row_kernel(model) == 1
    assert not uses_few_row_kernel(model[1])


def test_loaders_use_the_kernel_on_cpu(tiny_model_dir, tiny_medusa_dir):
    from entmtp.calibrate._heads import load_heads, new_heads

    base = load_base_model(tiny_model_dir)
    assert uses_few_row_kernel(base.model.get_output_embeddings())
    heads = load_heads(tiny_medusa_dir, base)
    assert _linear_layers(heads) and all(uses_few_row_kernel(m) for m in _linear_layers(heads))
    model = random_model(tiny_model_dir).model
    assert all(uses_few_row_kernel(m) for m in _linear_layers(model))
    for head_type in ("medusa", "hydra"):  # random heads time the latency model
        fresh = new_heads(model, head_type=head_type, num_heads=2)
        assert _linear_layers(fresh) and all(uses_few_row_kernel(m) for m in _linear_layers(fresh))
