"""CPU linear layers for decoding: oneDNN over a packed copy of the weight, else ``W @ x.T``.

Decoding multiplies 1 to a few dozen rows (one token, or a draft tree's nodes) by every weight
matrix, and the profiler a few hundred. On the CPU (torch 2.13, 2 threads) ``F.linear`` is slow
for exactly those shapes. Two kernels, fastest first:

- **packed** (``linear_kernel: "onednn-packed"``): oneDNN's inner product over a copy of the
  weight reordered once into its blocked layout (``mkldnn._reorder_linear_weight``, what
  inductor's CPU weight-packing pass emits). On a 2-core AMD EPYC (bench/bench_linear_kernels.py,
  bench/bench_row_gemm.py) a whole step of the default model is as fast as the few-row kernel for
  1-4 rows and 1.3x-2.3x faster for 5-256; each row's result is bitwise the same whatever the
  row count, so a tree's nodes compute exactly what a one-token step would (where oneDNN rounds
  a lone row apart, as on AVX-512 Xeons and Zen 4 EPYCs for reductions over 1536, a probe made
  when the weight is packed finds it and single rows go through as two). Used for float32
  weights the caller reuses (``reused=True``: every ``nn.Linear`` routed here, the heads'
  projections); the copy is kept while the weight is unchanged (same storage, place in it and
  version: a detached view of the weight finds it too), costs the weight's size in memory and
  dies with the weight's storage. A change that bypasses the version counter (writing through
  ``weight.data``) is not seen. bfloat16 weights are packed too where oneDNN computes in
  bfloat16 (``torch.ops.mkldnn._is_mkldnn_bf16_supported``: AVX-512 and AMX CPUs). On a 2-core
  Xeon with AMX (bench/bench_row_gemm.py --dtype bf16) a bfloat16 step is 1.00x-1.12x faster
  packed than on the few-row kernel, and 1.34x (1 token) to 2.7x (256) faster than float32's
  packed step. A bfloat16 row's rounding there depends on the row count (oneDNN picks other
  blockings), so bfloat16 trees are not bitwise one-token steps (as on a GPU), and the lone-row
  probe is for float32 alone.
- **few-row** (``"few-row"``): ``(W @ x.T).T``, a single row duplicated to two, made contiguous;
  2-5x faster than ``x @ W.T`` for 1-3 rows (bench/bench_lm_head.py). Used for up to ``FEW_ROWS``
  rows of other CPU weights (other dtypes, weights sliced per call, no oneDNN).

Both differ from ``F.linear`` by float rounding only (about 1e-6 relative in float32). GPUs
(cuBLAS) have no such gap, gradients need ``F.linear``'s autograd path and torch.compile lowers
``F.linear`` itself (inductor packs CPU weights on its own), so those keep ``F.linear``.
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FEW_ROWS = 64
PACKED_KERNEL = "onednn-packed"
FEW_ROW_KERNEL = "few-row"
_MARKER = "_entmtp_row_kernel"

# id(storage) -> (weak reference to the storage, {(offset, shape, stride, dtype): (version,
# packed copy)}): a weight's packed copies live as long as the memory they were made from
_PACKED: dict[int, tuple[weakref.ref, dict[tuple, tuple[int | None, PackedWeight]]]] = {}


class PackedWeight(NamedTuple):
    weight: Tensor  # [out, in] in oneDNN's blocked layout
    # oneDNN rounds a lone row differently from the same row among others on some CPUs and
    # shapes (AVX-512 Xeons and Zen 4 EPYCs reducing over 1536 or more); such a weight gets
    # single rows computed as two
    single_row_as_two: bool


def packing_available() -> bool:
    """Whether this torch can run the packed kernel (oneDNN built in and enabled)."""
    return torch._C._get_mkldnn_enabled() and _packing_built()


@functools.cache
def _packing_built() -> bool:
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def project_rows(features: Tensor, weight: Tensor, bias: Tensor | None, *,
                 reused: bool = False) -> Tensor:
    """``F.linear(features, weight, bias)`` ([..., in] -> [..., out]), faster on the CPU.

    ``reused``: the caller multiplies by this same weight again (a layer, a head's projection),
    so a packed copy of it is worth keeping (float32 CPU weights, and bfloat16 where oneDNN has it).
    """
    in_features = features.shape[-1]
    rows = features.reshape(-1, in_features)
    # Traced by torch.compile: inductor lowers F.linear (and packs CPU weights itself)
    if (rows.shape[0] == 0 or weight.device.type != "cpu" or torch.compiler.is_compiling()
            or _records_gradient(features, weight, bias)):
        return F.linear(features, weight, bias)
    if reused and _packs(weight, features):
        packed = _packed_weight(weight)
        if packed.single_row_as_two and rows.shape[0] == 1:
            out = _packed_linear(torch.cat([rows, rows]), packed.weight, bias)[:1]
        else:
            out = _packed_linear(rows.contiguous(), packed.weight, bias)
        return out.reshape(*features.shape[:-1], weight.shape[0])
    if rows.shape[0] > FEW_ROWS:
        return F.linear(features, weight, bias)
    # Contiguous like F.linear's result: attention kernels (SDPA's CPU flash path) and
    # elementwise ops need a contiguous last dimension, and a transposed view falls back to
    # SDPA's slow math path.
    if rows.shape[0] == 1:
        out = (weight @ torch.cat([rows, rows]).T)[:, :1].T.contiguous()
    else:
        out = (weight @ rows.T).T.contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*features.shape[:-1], weight.shape[0])


def row_kernel(weight: Tensor) -> str:
    """The kernel ``project_rows(..., reused=True)`` multiplies by ``weight`` with:
    ``"onednn-packed"``, ``"few-row"`` or ``"torch"`` (``F.linear``, off the CPU)."""
    if weight.device.type != "cpu":
        return "torch"
    return PACKED_KERNEL if _packs(weight, weight) else FEW_ROW_KERNEL


def _packs(weight: Tensor, features: Tensor) -> bool:
    return (weight.dtype == features.dtype and weight.dim() == 2 and packing_available()
            and (weight.dtype == torch.float32
                 or (weight.dtype == torch.bfloat16 and _bf16_supported())))


def bf16_packing_available() -> bool:
    """Whether oneDNN computes bfloat16 inner products on this CPU (else bfloat16 weights keep
    the few-row kernel). float16 is not packed: on an AVX-512 FP16 Xeon without AMX-FP16 its
    packed kernel measured no faster than float32's."""
    return packing_available() and _bf16_supported()


@functools.cache
def _bf16_supported() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _packed_linear(rows: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


def _rounds_lone_rows_apart(packed: Tensor, in_features: int) -> bool:
    """Whether one row through ``packed`` differs from the same row computed beside another
    (a fixed probe: a kernel that takes another path for one row rounds differently on it)."""
    probe = torch.randn(2, in_features, generator=torch.Generator().manual_seed(0))
    return not torch.equal(_packed_linear(probe[:1], packed, None),
                           _packed_linear(probe, packed, None)[:1])


def _packed_weight(weight: Tensor) -> PackedWeight:
    # Keyed on the storage, not the tensor object: callers pass fresh views of one weight
    # (``lm_head.weight.detach()`` per call), which share its storage and version counter.
    storage = weight.untyped_storage()
    layout = (weight.storage_offset(), tuple(weight.shape), weight.stride(), weight.dtype)
    version = value_version(weight)
    entry = _PACKED.get(id(storage))
    if entry is None or entry[0]() is not storage:
        reference = weakref.ref(storage, lambda ref, ident=id(storage): _forget(ident, ref))
        entry = (reference, {})
        _PACKED[id(storage)] = entry
    copies = entry[1]
    cached = copies.get(layout)
    if cached is not None and cached[0] == version:
        return cached[1]
    with torch.no_grad():
        reordered = _reorder(weight.detach().contiguous(), None)
        lone_rows_apart = (weight.dtype == torch.float32
                           and _rounds_lone_rows_apart(reordered, weight.shape[1]))
        packed = PackedWeight(reordered, lone_rows_apart)
    copies[layout] = (version, packed)
    return packed


def value_version(tensor: Tensor) -> int | None:
    """The counter autograd bumps on every in-place change of ``tensor``'s values; None for an
    inference tensor, which keeps none and cannot change outside inference mode."""
    return None if tensor.is_inference() else tensor._version


def _reorder(weight: Tensor, batch_size: int | None) -> Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, batch_size)


def _forget(ident: int, reference: weakref.ref) -> None:
    entry = _PACKED.get(ident)
    if entry is not None and entry[0] is reference:
        del _PACKED[ident]


def _records_gradient(features: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    # A model's parameters require grad even under no_grad/inference_mode, where nothing is
    # recorded; only a product autograd will record needs F.linear's path.
    if not torch.is_grad_enabled():
        return False
    return any(t is not None and t.requires_grad for t in (features, weight, bias))


def _row_forward(self: nn.Linear, x: Tensor) -> Tensor:
    return project_rows(x, self.weight, self.bias, reused=True)


def use_row_kernels(model: nn.Module) -> int:
    """Route every ``nn.Linear`` of ``model`` on the CPU through :func:`project_rows` (reused
    weights: the packed kernel for float32, and bfloat16 where oneDNN has it).

    Only exact ``nn.Linear`` instances are changed (their instance ``forward``; weights, state
    dict and class are untouched), so subclasses such as quantized linears keep their own
    kernels. Idempotent. Returns how many layers use the kernels.
    """
    count = 0
    for module in model.modules():
        if type(module) is not nn.Linear or module.weight.device.type != "cpu":
            continue
        if not getattr(module, _MARKER, False):
            module.forward = types.MethodType(_row_forward, module)
            setattr(module, _MARKER, True)
        count += 1
    return count


def linear_kernel(module: nn.Module) -> str:
    """The kernel an ``nn.Linear`` computes with: ``row_kernel`` of its weight when
    :func:`use_row_kernels` routed it, else ``"torch"``."""
    if not getattr(module, _MARKER, False):
        return "torch"
    return row_kernel(module.weight)
