"""Linear layers over a few rows on CPU: ``weight @ x.T`` instead of ``F.linear``.

Decoding multiplies 1 to a few dozen rows (one token, or a draft tree's nodes) by every weight
matrix. On CPU (torch 2.13, 2 threads) ``F.linear`` is slow for exactly those shapes: the
vocabulary projection of 1-3 rows as ``x @ W.T`` took 2-5x longer than the same product written
as ``W @ x.T``, and a single row (a matrix-vector product) longer than two rows
(bench/bench_lm_head.py); a whole forward of 1-4 tokens through the default model is 1.7-2.8x
faster this way (bench/bench_row_gemm.py). So for at most ``FEW_ROWS`` rows this module computes
``(W @ x.T).T``, a single row duplicated to two, made contiguous. The results differ from
``F.linear`` by float rounding only (about 1e-6 relative).

GPUs (cuBLAS) have no such gap, and gradients need ``F.linear``'s autograd path, so both keep
``F.linear``.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FEW_ROWS = 64
_MARKER = "_entmtp_few_row_kernel"


def project_rows(features: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(features, weight, bias)`` ([..., in] -> [..., out]), faster for few rows."""
    in_features = features.shape[-1]
    rows = features.reshape(-1, in_features)
    if (rows.shape[0] > FEW_ROWS or rows.shape[0] == 0 or weight.device.type != "cpu"
            or _records_gradient(features, weight, bias)):
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


def _records_gradient(features: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    # A model's parameters require grad even under no_grad/inference_mode, where nothing is
    # recorded; only a product autograd will record needs F.linear's path.
    if not torch.is_grad_enabled():
        return False
    return any(t is not None and t.requires_grad for t in (features, weight, bias))


def _few_row_forward(self: nn.Linear, x: Tensor) -> Tensor:
    return project_rows(x, self.weight, self.bias)


def use_few_row_kernel(model: nn.Module) -> int:
    """Route every ``nn.Linear`` of ``model`` on the CPU through :func:`project_rows`.

    Only exact ``nn.Linear`` instances are changed (their instance ``forward``; weights, state
    dict and class are untouched), so subclasses such as quantized linears keep their own
    kernels. Idempotent. Returns how many layers use the kernel.
    """
    count = 0
    for module in model.modules():
        if type(module) is not nn.Linear or module.weight.device.type != "cpu":
            continue
        if not getattr(module, _MARKER, False):
            module.forward = types.MethodType(_few_row_forward, module)
            setattr(module, _MARKER, True)
        count += 1
    return count


def uses_few_row_kernel(module: nn.Module) -> bool:
    """Whether ``module`` (an ``nn.Linear``) computes through :func:`project_rows`."""
    return bool(getattr(module, _MARKER, False))
