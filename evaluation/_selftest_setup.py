"""What the self-test's checks share: their outcomes (``Found``, ``SkipCheck``,
``CheckFailed``) and ``SelftestSetup``, the device, the dtype and a tiny random Llama-shaped
model with grouped key/value heads, built from a config on the CPU and moved to the device (the
same weights on every machine), with random Medusa heads and random Hydra heads that draft over
a draft vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from entmtp.core import EntmtpError
from entmtp.model import new_heads, resolve_dtype

# The tiny model: Llama's block with grouped key/value heads (4 query heads over 2), an untied
# random lm_head scaled up so that greedy decoding does not repeat one token.
TINY_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LM_HEAD_SCALE = 2.0
TOPK = 10
NUM_HEADS = 4
DRAFT_VOCAB = 96  # the Hydra heads draft over this many tokens
HEAD_SETS = ("medusa", "hydra")


class SkipCheck(Exception):
    """The check does not apply here; the message says why."""


class CheckFailed(Exception):
    """The check found a mismatch; the message names it, ``details`` keeps what it saw."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


@dataclass(frozen=True)
class Found:
    """What a passing check found."""

    summary: str  # one short line
    details: dict[str, Any] = field(default_factory=dict)


def first_error_line(err: BaseException) -> str:
    """The first non-empty line of ``err``'s message, after its type's name unless the error
    is entmtp's own or a check's (its message already says what failed)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if isinstance(err, (EntmtpError, CheckFailed)) and text:
        return text
    name = type(err).__name__
    return f"{name}: {text}" if text else name


# -- the shared setup ------------------------------------------------------------------------
def tiny_llama(config: dict[str, Any], device: str, dtype: torch.dtype, seed: int = 0):
    """A random LlamaForCausalLM of ``config``, built on the CPU (the same weights on every
    machine) with an untied lm_head, then moved to ``device`` in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    llama_config = LlamaConfig(**config)
    llama_config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama_config)
    generator = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        weight = model.lm_head.weight
        weight.copy_(torch.randn(weight.shape, generator=generator) * LM_HEAD_SCALE)
    return model.to(device=device, dtype=dtype).eval()


def noisy_heads(model: torch.nn.Module, head_type: str, seed: int):
    """Random heads of ``head_type`` for ``model`` with noise on every weight, so that trees
    accept varied paths; Hydra's draft over ``DRAFT_VOCAB`` tokens."""
    heads = new_heads(model, head_type=head_type, num_heads=NUM_HEADS, seed=seed)
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for parameter in heads.parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.add_(noise.to(parameter.device, parameter.dtype))
    if head_type == "hydra":
        vocab = torch.randperm(heads.vocab_size, generator=generator)[:DRAFT_VOCAB]
        heads.set_draft_vocab(vocab)
    return heads


class SelftestSetup:
    """The device, the dtype and what the checks share, each built once on first use (a build
    that fails fails every check that needs it, with its first error line)."""

    def __init__(self, device: str, dtype: str) -> None:
        self.device = device
        self.dtype_name = dtype  # torch's name: float32, bfloat16, float16
        self.dtype = resolve_dtype(dtype)
        self._built: dict[tuple, tuple[bool, Any]] = {}

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def require_device(self) -> None:
        """Raise unless torch can use the device."""
        if not self.on_cuda:
            return
        if not torch.cuda.is_available():
            raise CheckFailed(f"--device {self.device}: torch {torch.__version__} (built for "
                              f"CUDA {torch.version.cuda}) sees no CUDA GPU")
        index = int(self.device.split(":")[1]) if ":" in self.device else 0
        if index >= torch.cuda.device_count():
            raise CheckFailed(f"--device {self.device}: torch sees only "
                              f"{torch.cuda.device_count()} CUDA device(s)")

    def once(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()``, built on the first call with ``key`` and kept (its error too)."""
        if key not in self._built:
            try:
                self._built[key] = (True, build())
            except Exception as err:  # noqa: BLE001 - kept, and raised to every check using it
                self._built[key] = (False, err)
        ok, value = self._built[key]
        if not ok:
            raise value
        return value

    def model(self, dtype: torch.dtype | None = None):
        dtype = self.dtype if dtype is None else dtype
        self.require_device()
        return self.once(("model", dtype), lambda: tiny_llama(TINY_CONFIG, self.device, dtype))

    def heads(self, head_type: str, dtype: torch.dtype | None = None):
        model = self.model(dtype)
        seed = HEAD_SETS.index(head_type) + 1
        return self.once(("heads", head_type, model.dtype),
                          lambda: noisy_heads(model, head_type, seed))
