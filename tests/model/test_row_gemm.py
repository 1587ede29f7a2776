import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from entmtp.model import _row_gemm
from entmtp.model._base_model import load_base_model
from entmtp.model._random_model import random_model
from entmtp.model._row_gemm import (
    FEW_ROWS,
    bf16_packing_available,
    linear_kernel,
    packing_available,
    project_rows,
    row_kernel,
    use_row_kernels,
)
from tests.support import make_tiny_llama

needs_packing = pytest.mark.skipif(not packing_available(),
                                   reason="this torch has no oneDNN packed linear")
needs_bf16_packing = pytest.mark.skipif(not bf16_packing_available(),
                                        reason="oneDNN has no bfloat16 inner product on this CPU")


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 5, 17, FEW_ROWS, FEW_ROWS + 1, 100])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("reused", [False, True])
def test_project_rows_is_f_linear(rows, with_bias, reused):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 48, generator=generator)
    bias = torch.randn(300, generator=generator) if with_bias else None
    features = torch.randn(rows, 48, generator=generator)
    out = project_rows(features, weight, bias, reused=reused)
    assert out.shape == (rows, 300)
    torch.testing.assert_close(out, F.linear(features, weight, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(48,), (1, 1, 48), (2, 3, 48), (1, 7, 48)])
@pytest.mark.parametrize("reused", [False, True])
def test_project_rows_keeps_leading_dimensions(shape, reused):
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(20, 48, generator=generator)
    features = torch.randn(*shape, generator=generator)
    out = project_rows(features, weight, None, reused=reused)
    assert out.shape == (*shape[:-1], 20)
    torch.testing.assert_close(out, F.linear(features, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 5, 64, 65])
@pytest.mark.parametrize("reused", [False, True])
def test_project_rows_returns_contiguous_rows(rows, reused):
    # A transposed result sends SDPA to its slow math path (and slows elementwise ops).
    out = project_rows(torch.randn(1, rows, 48), torch.randn(20, 48), torch.randn(20),
                       reused=reused)
    assert out.is_contiguous()


def test_non_contiguous_inputs_and_weights():
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(48, 30, generator=generator).T  # [30, 48], a transposed view
    features = torch.randn(9, 48, generator=generator)[::2]
    out = project_rows(features, weight, None, reused=True)
    torch.testing.assert_close(out, F.linear(features, weight), rtol=1e-5, atol=1e-5)


@needs_packing
@torch.inference_mode()
def test_packed_rows_are_bitwise_the_same_whatever_the_row_count():
    # A tree's node must compute what a one-token step computes at that token.
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(500, 64, generator=generator)
    bias = torch.randn(500, generator=generator)
    rows = torch.randn(40, 64, generator=generator)
    whole = project_rows(rows, weight, bias, reused=True)
    for count in (1, 2, 3, 5, 8, 16, 17, 33):
        part = project_rows(rows[:count], weight, bias, reused=True)
        assert torch.equal(part, whole[:count]), count


@needs_packing
@torch.inference_mode()
@pytest.mark.parametrize("out_features, in_features", [(192, 576), (576, 1536), (1536, 1536),
                                                        (576, 2048)])
def test_a_single_row_computes_what_it_does_among_others(out_features, in_features):
    # The default model's shapes (its down projection reduces over 1536): some oneDNN builds
    # take another path for one row over a long reduction, which rounds differently; a plain
    # step (one row) must still compute what the same token computes as a tree's node.
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    bias = torch.randn(out_features, generator=generator)
    rows = torch.randn(9, in_features, generator=generator)
    whole = project_rows(rows, weight, bias, reused=True)
    for index in range(rows.shape[0]):
        one = project_rows(rows[index:index + 1], weight, bias, reused=True)
        assert torch.equal(one, whole[index:index + 1]), index
    assert torch.equal(project_rows(rows[0], weight, bias, reused=True), whole[0])


def _count_packings(monkeypatch) -> list[tuple[int, ...]]:
    packings = []
    original = torch.ops.mkldnn._reorder_linear_weight

    def counting(weight, batch_size=None):
        packings.append(tuple(weight.shape))
        return original(weight, batch_size)

    monkeypatch.setattr(_row_gemm, "_reorder", counting)
    return packings


@needs_packing
def test_a_reused_weight_is_packed_once_until_it_changes(monkeypatch):
    packings = _count_packings(monkeypatch)
    layer = nn.Linear(16, 8)
    features = torch.randn(3, 16)
    with torch.no_grad():
        for _ in range(3):
            out = project_rows(features, layer.weight, layer.bias, reused=True)
        assert len(packings) == 1
        layer.weight.mul_(2.0)  # in place: a new version
        torch.testing.assert_close(project_rows(features, layer.weight, layer.bias, reused=True),
                                   2.0 * (out - layer.bias) + layer.bias)
        assert len(packings) == 2
        layer.weight.data = torch.zeros(8, 16)  # new storage, same Parameter
        torch.testing.assert_close(project_rows(features, layer.weight, layer.bias, reused=True),
                                   layer.bias.expand(3, 8))
        assert len(packings) == 3
        project_rows(features, torch.randn(8, 16), None)  # not reused: never packed
        # float32, and bfloat16 where oneDNN has it
        project_rows(features.double(), layer.weight.double(), None, reused=True)
        project_rows(features.half(), layer.weight.half(), None, reused=True)
        assert len(packings) == 3
        project_rows(features.bfloat16(), layer.weight.bfloat16(), None, reused=True)
        assert len(packings) == 3 + bf16_packing_available()


@needs_packing
def test_a_packed_copy_dies_with_its_weight():
    weight = torch.randn(8, 16)
    with torch.inference_mode():
        project_rows(torch.randn(2, 16), weight, None, reused=True)
    ident = id(weight.untyped_storage())
    assert ident in _row_gemm._PACKED
    del weight
    gc.collect()
    assert ident not in _row_gemm._PACKED


@needs_packing
def test_detached_views_of_a_weight_share_its_packed_copy(monkeypatch):
    # Heads sharing the lm_head hand over ``lm_head.weight.detach()``, a new tensor each call.
    packings = _count_packings(monkeypatch)
    layer = nn.Linear(16, 8, bias=False)
    features = torch.randn(3, 16)
    with torch.no_grad():
        for _ in range(3):
            out = project_rows(features, layer.weight.detach(), None, reused=True)
        assert len(packings) == 1
        layer.weight.detach().mul_(3.0)  # a view shares the version counter
        torch.testing.assert_close(project_rows(features, layer.weight, None, reused=True),
                                   3.0 * out)
        assert len(packings) == 2
        top, bottom = layer.weight[:4], layer.weight[4:]  # two weights in one storage
        torch.testing.assert_close(project_rows(features, bottom, None, reused=True),
                                   F.linear(features, bottom), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(project_rows(features, top, None, reused=True),
                                   F.linear(features, top), rtol=1e-5, atol=1e-5)
        assert len(packings) == 4


@needs_packing
def test_packed_in_inference_mode_serves_no_grad_too():
    layer = nn.Linear(16, 8)
    features = torch.randn(3, 16)
    with torch.inference_mode():
        inside = project_rows(features, layer.weight, layer.bias, reused=True)
    with torch.no_grad():
        outside = project_rows(features, layer.weight, layer.bias, reused=True)
    assert torch.equal(inside, outside)


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


def test_traced_products_keep_f_linear(monkeypatch):
    # torch.compile cannot lower the packed op over an eager-made copy; inductor packs itself.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    calls = _count_linear_calls(monkeypatch)
    with torch.no_grad():
        project_rows(torch.randn(3, 16), torch.randn(8, 16), None, reused=True)
    assert calls["F.linear"] == 1


def test_recorded_products_keep_f_linear(monkeypatch):
    layer = nn.Linear(16, 8)
    calls = _count_linear_calls(monkeypatch)
    project_rows(torch.randn(3, 16), layer.weight, layer.bias)
    assert calls["F.linear"] == 1


@torch.inference_mode()
def test_a_patched_model_step_never_calls_f_linear(monkeypatch):
    model = make_tiny_llama(seed=5)
    use_row_kernels(model)
    calls = _count_linear_calls(monkeypatch)
    model(torch.arange(3, 8).unsqueeze(0))
    assert calls["F.linear"] == 0


def _linear_layers(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if type(m) is nn.Linear]


@torch.inference_mode()
def test_patched_model_matches_and_decodes_the_same():
    reference = make_tiny_llama(seed=3)
    model = copy.deepcopy(reference)
    assert use_row_kernels(model) == len(_linear_layers(model)) > 0
    assert use_row_kernels(model) == len(_linear_layers(model))  # idempotent
    expected = "onednn-packed" if packing_available() else "few-row"
    assert all(linear_kernel(m) == expected for m in _linear_layers(model))
    assert all(linear_kernel(m) == "torch" for m in _linear_layers(reference))
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
    use_row_kernels(model)
    clone = copy.deepcopy(model)
    layer = clone.lm_head
    assert linear_kernel(layer) != "torch"
    hidden = torch.randn(2, layer.in_features)
    before = model.lm_head(hidden)
    layer.weight.mul_(2.0)
    torch.testing.assert_close(layer(hidden), 2.0 * before)


def test_subclasses_of_linear_keep_their_forward():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 3.0 * super().forward(x)

    model = nn.Sequential(nn.Linear(4, 4), Scaled(4, 4))
    assert use_row_kernels(model) == 1
    assert linear_kernel(model[1]) == "torch" != linear_kernel(model[0])


def test_loaders_use_the_kernel_on_cpu(tiny_model_dir, tiny_medusa_dir):
    from entmtp.model import load_heads, new_heads

    base = load_base_model(tiny_model_dir)
    assert _routed(base.model.get_output_embeddings())
    heads = load_heads(tiny_medusa_dir, base)
    assert _linear_layers(heads) and all(_routed(m) for m in _linear_layers(heads))
    model = random_model(tiny_model_dir).model
    assert all(_routed(m) for m in _linear_layers(model))
    for head_type in ("medusa", "hydra"):  # random heads time the latency model
        fresh = new_heads(model, head_type=head_type, num_heads=2)
        assert _linear_layers(fresh) and all(_routed(m) for m in _linear_layers(fresh))


def _routed(layer: nn.Module) -> bool:
    return linear_kernel(layer) != "torch"


def test_row_kernel_names_the_kernel():
    weight = torch.randn(4, 4)
    assert row_kernel(weight) == ("onednn-packed" if packing_available() else "few-row")
    assert row_kernel(weight.bfloat16()) == ("onednn-packed" if bf16_packing_available()
                                             else "few-row")
    assert row_kernel(weight.half()) == "few-row"
    assert row_kernel(torch.randn(4, 4, device="meta")) == "torch"


@needs_bf16_packing
@torch.inference_mode()
@pytest.mark.parametrize("rows", [1, 2, 5, 64, 65, 200])
def test_bf16_weights_are_packed_and_round_like_f_linear(monkeypatch, rows):
    packings = _count_packings(monkeypatch)
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 576, generator=generator).bfloat16()
    bias = torch.randn(300, generator=generator).bfloat16()
    features = torch.randn(rows, 576, generator=generator).bfloat16()
    out = project_rows(features, weight, bias, reused=True)
    assert packings == [(300, 576)]
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 300) and out.is_contiguous()
    # both accumulate in float32 and round once to bfloat16: at most a unit in the last place
    expected = F.linear(features, weight, bias)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2 ** -7, atol=2 ** -7)


@needs_bf16_packing
@torch.inference_mode()
def test_bf16_model_decodes_like_f_linear_in_bf16():
    reference = make_tiny_llama(seed=6).to(torch.bfloat16)
    model = copy.deepcopy(reference)
    use_row_kernels(model)
    assert all(linear_kernel(m) == "onednn-packed" for m in _linear_layers(model))
    ids = torch.arange(3, 40).unsqueeze(0) % 128
    torch.testing.assert_close(model(ids).logits.float(), reference(ids).logits.float(),
                               rtol=0.02, atol=0.02)


def test_half_weights_stay_on_the_few_row_kernel(monkeypatch):
    packings = _count_packings(monkeypatch)
    weight = torch.randn(30, 48).half()
    out = project_rows(torch.randn(3, 48).half(), weight, None, reused=True)
    assert packings == [] and out.dtype == torch.float16
