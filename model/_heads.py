"""Draft heads on a frozen base model (Medusa, Hydra): the modules, their draft vocabulary, and
new heads for a base model.

Both head types read the base model's final-norm hidden state ``h_t`` at the last accepted
position, whose lm_head logits chose the root (pending) token ``x_{t+1}``. Head ``d`` (1-based)
predicts ``x_{t+1+d}``, the token ``d`` steps after the root.

- Medusa (FasterDecoding/Medusa, ``medusa/model/medusa_model.py``): per head ``num_layers``
  ResBlocks ``x + SiLU(Linear(x))`` then a vocabulary projection (Linear without bias).
- Hydra ``mlp`` heads (zankner/Hydra, ``hydra/model/hydra_heads/mlp_head.py``): head ``d`` reads
  ``[h_t, e(x_{t+1}), ..., e(x_{t+d})]`` (``e``: the base model's input embedding), so it
  depends on the root and the drafted tokens above it. Its first block maps
  ``(d + 1) * hidden -> hidden`` with a learned residual projection, later blocks are ResBlocks,
  and its vocabulary projection is a Linear with bias.

With ``shared_lm_head`` the vocabulary projection is the base model's lm_head, which is never
stored or hashed. The base input embedding (Hydra) is always shared.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from entmtp.core import HEAD_TYPES, EntmtpError

from ._row_gemm import project_rows, use_row_kernels, value_version


class ResBlock(nn.Module):
    """``x + SiLU(Linear(x))``; weight and bias start at zero so a new block is the identity
    (Medusa zeroes the weight only)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.silu(self.linear(x))


class ConditionedResBlock(nn.Module):
    """Hydra's first block of a grounded head: ``Residual(x) + SiLU(Linear(x))``, in -> out."""

    def __init__(self, in_size: int, out_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_size, out_size)
        self.residual = nn.Linear(in_size, out_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        # Start as the identity on the hidden-state part, so a new head begins as the base
        # model's own next-token guess rather than noise.
        with torch.no_grad():
            self.residual.weight.zero_()
            self.residual.weight[:, :out_size].copy_(torch.eye(out_size))
            self.residual.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return self.residual(x) + F.silu(self.linear(x))


class DraftHeads(nn.Module):
    """Base class of the draft heads; see the module docstring for the semantics."""

    head_type: str = ""
    # Set (on the instance) while a CUDA graph captures a step that reads these heads: a rebuild
    # of the draft rows then would be recorded, not run, leaving rows never computed, so it
    # raises instead.
    draft_rows_frozen: bool = False

    def __init__(
        self,
        *,
        num_heads: int,
        num_layers: int,
        hidden_size: int,
        vocab_size: int,
        lm_head: nn.Module | None,
        projection_bias: bool,
    ) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise EntmtpError(
                f"draft heads need num_heads >= 1 and num_layers >= 1, got {num_heads} and "
                f"{num_layers}"
            )
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.base_model_name = ""
        # (sha256 of the values as loaded, sha256 of the values as stored) of loaded heads.
        self._loaded_identity: tuple[str, str] | None = None
        # Kept in a tuple so that nn.Module does not register (store, hash, move) base weights.
        self._shared_lm_head: tuple[nn.Module, ...] = (lm_head,) if lm_head is not None else ()
        # Draft vocabulary (sorted token ids [V'] int64), or None for the whole vocabulary.
        self.register_buffer("draft_vocab", None)
        # (key, (weight [V', hidden], bias [V'] or None)) per projection: the rows of the draft
        # vocabulary, kept until the weight changes (see ``draft_projection_weight``).
        self._draft_rows: dict[int, tuple[tuple[Any, ...], tuple[Tensor, Tensor | None]]] = {}
        self._draft_column_table: tuple[tuple[Any, ...], Tensor] | None = None
        self.proj: nn.ModuleList | None = None
        if lm_head is None:
            self.proj = nn.ModuleList(
                nn.Linear(hidden_size, vocab_size, bias=projection_bias) for _ in range(num_heads)
            )

    @property
    def shared_lm_head(self) -> bool:
        return bool(self._shared_lm_head)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _check_depth(self, depth: int) -> None:
        if not 1 <= depth <= self.num_heads:
            raise ValueError(f"depth must be in 1..{self.num_heads}, got {depth}")

    def head_features(self, depth: int, hidden: Tensor, prefix_tokens: Tensor | None) -> Tensor:
        """[N, hidden_size] input of head ``depth``'s vocabulary projection."""
        raise NotImplementedError

    def projection_weight(self, depth: int) -> tuple[Tensor, Tensor | None]:
        """(weight [vocab, hidden], bias [vocab] or None) of head ``depth``'s projection."""
        if self._shared_lm_head:
            # Detached: training the heads must never touch the frozen base model.
            lm_head = self._shared_lm_head[0]
            bias = getattr(lm_head, "bias", None)
            return lm_head.weight.detach(), bias.detach() if bias is not None else None
        linear = self.proj[depth - 1]
        return linear.weight, linear.bias

    def project(self, depth: int, features: Tensor, vocab_ids: Tensor | None = None) -> Tensor:
        """Logits [N, vocab] (or [N, len(vocab_ids)] over that subset) of head ``depth``."""
        weight, bias = self.projection_weight(depth)
        if vocab_ids is not None:
            weight = weight[vocab_ids]
            bias = bias[vocab_ids] if bias is not None else None
        return project_rows(features.to(weight.dtype), weight, bias, reused=vocab_ids is None)

    @property
    def draft_vocab_size(self) -> int:
        """Columns of ``head_logits``: the draft vocabulary's size, else the vocabulary's."""
        return self.vocab_size if self.draft_vocab is None else int(self.draft_vocab.numel())

    def set_draft_vocab(self, token_ids: Tensor | None) -> None:
        """Draft over ``token_ids`` only (1-D, distinct, in ``0..vocab_size - 1``; stored
        sorted), or over the whole vocabulary with None. Part of the heads' identity (sha256)."""
        self._draft_rows.clear()
        self._draft_column_table = None
        if token_ids is None:
            self.draft_vocab = None
            return
        ids = torch.as_tensor(token_ids).detach().to("cpu")
        problem = draft_vocab_problem(ids, self.vocab_size)
        if problem is not None:
            raise EntmtpError(f"draft vocabulary: {problem}")
        device = next(self.parameters()).device
        self.draft_vocab = torch.sort(ids.to(torch.int64)).values.to(device)

    def draft_projection_weight(self, depth: int) -> tuple[Tensor, Tensor | None]:
        """(weight [V', hidden], bias [V'] or None): head ``depth``'s projection restricted to
        the draft vocabulary (``projection_weight`` without one). The rows are copied once and
        kept while the weight is unchanged, so a step reads V' rows, not the whole matrix."""
        weight, bias = self.projection_weight(depth)
        if self.draft_vocab is None:
            return weight, bias
        slot = 0 if self._shared_lm_head else depth
        key = (*_tensor_key(weight), *_tensor_key(bias), *_tensor_key(self.draft_vocab))
        cached = self._draft_rows.get(slot)
        if cached is None or cached[0] != key:
            if self.draft_rows_frozen:
                raise EntmtpError(
                    f"head {depth}'s draft-vocabulary rows would be rebuilt inside a CUDA graph "
                    "capture (the projection weight changed since they were copied), which "
                    "records rows that are never computed: call heads.refresh_draft_rows() "
                    "before capturing")
            vocab = self.draft_vocab.to(weight.device)
            with torch.no_grad():
                rows = (weight.detach()[vocab].contiguous(),
                        None if bias is None else bias.detach()[vocab].contiguous())
            cached = (key, rows)
            self._draft_rows[slot] = cached
        return cached[1]

    def refresh_draft_rows(self) -> None:
        """Copy every projection's draft-vocabulary rows now where its weight changed since
        (nothing without a draft vocabulary): before a CUDA graph capture, so that none is
        rebuilt inside one."""
        if self.draft_vocab is not None:
            for depth in range(1, self.num_heads + 1):
                self.draft_projection_weight(depth)

    def draft_token_ids(self, columns: Tensor) -> Tensor:
        """Token ids of ``head_logits`` columns (any shape, int64)."""
        if self.draft_vocab is None:
            return columns
        return self.draft_vocab.to(columns.device)[columns]

    def draft_columns(self, token_ids: Tensor) -> Tensor:
        """``head_logits`` column of each token id (any shape), -1 for a token outside the
        draft vocabulary or a negative id."""
        if self.draft_vocab is None:
            return token_ids
        vocab = self.draft_vocab
        key = (vocab.data_ptr(), vocab.device)
        if self._draft_column_table is None or self._draft_column_table[0] != key:
            table = torch.full((self.vocab_size,), -1, dtype=torch.int64, device=vocab.device)
            table[vocab] = torch.arange(len(vocab), device=vocab.device)
            self._draft_column_table = (key, table)
        table = self._draft_column_table[1].to(token_ids.device)
        ids = token_ids.long()
        inside = (ids >= 0) & (ids < self.vocab_size)
        return torch.where(inside, table[ids.clamp(0, self.vocab_size - 1)],
                           torch.full_like(ids, -1))

    def head_logits(self, depth: int, hidden: Tensor, prefix_tokens: Tensor | None) -> Tensor:
        """[N, draft_vocab_size] logits of head ``depth`` (1-based) over the draft vocabulary
        (``draft_token_ids`` maps a column to its token; without one, column = token id).

        hidden: [N, hidden_size] base final-norm hidden state at the last accepted position.
        prefix_tokens: [N, depth] the root token then the drafted tokens at depths
        1..depth-1 (Hydra reads them; Medusa ignores them and accepts None).
        """
        features = self.head_features(depth, hidden, prefix_tokens)  # checks depth first
        return self.project_draft(depth, features)

    def project_draft(self, depth: int, features: Tensor) -> Tensor:
        """Logits [N, draft_vocab_size] of head ``depth`` from its projection inputs."""
        weight, bias = self.draft_projection_weight(depth)
        return project_rows(features.to(weight.dtype), weight, bias, reused=True)

    def config_dict(self) -> dict[str, Any]:
        """The structural fields of the entmtp config (no file-level metadata)."""
        return {
            "head_type": self.head_type,
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "shared_lm_head": self.shared_lm_head,
            # Only with a draft vocabulary, so heads without one keep their identity.
            **({} if self.draft_vocab is None else {"draft_vocab_size": self.draft_vocab_size}),
        }

    def sha256(self) -> str:
        """The heads' identity: a hash of their structure and weights, whatever dtype they are
        loaded in (the hash bundles and profiles record).

        Heads read from a checkpoint hash the values as stored there (upcast to float32, which
        is exact for fp16 / bf16 storage), so bf16 heads loaded from an fp16 file keep the
        file's hash, also when cast or moved later. Built heads, and loaded heads whose values
        changed (trained, edited), hash their current values upcast to float32. A shared base
        lm_head is not part of it.
        """
        current = self._current_sha256()
        if self._loaded_identity is not None and self._loaded_identity[0] == current:
            return self._loaded_identity[1]
        return current

    def _current_sha256(self) -> str:
        return weights_sha256(self.config_dict(), self.state_dict())

    def _remember_stored_identity(self, stored_sha256: str) -> None:
        """Record that the current values came from storage with hash ``stored_sha256``.

        The identity follows the heads through casts and moves (``_apply``); any other change
        of their values (training, an edit, ``load_state_dict``) drops back to their own hash.
        """
        self._loaded_identity = (self._current_sha256(), stored_sha256)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> DraftHeads:
        identity = getattr(self, "_loaded_identity", None)
        unchanged = identity is not None and identity[0] == self._current_sha256()
        result = super()._apply(fn, recurse)
        if unchanged:
            self._remember_stored_identity(identity[1])
        return result


class MedusaHeads(DraftHeads):
    """Medusa heads: ResBlocks on the base hidden state, then a vocabulary projection."""

    head_type = "medusa"

    def __init__(
        self,
        *,
        num_heads: int,
        num_layers: int,
        hidden_size: int,
        vocab_size: int,
        lm_head: nn.Module | None = None,
    ) -> None:
        super().__init__(
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            lm_head=lm_head,
            projection_bias=False,
        )
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers)))
            for _ in range(num_heads)
        )

    def head_features(self, depth: int, hidden: Tensor, prefix_tokens: Tensor | None) -> Tensor:
        self._check_depth(depth)
        return self.blocks[depth - 1](hidden.to(self.dtype))

    def all_head_logits(self, hidden: Tensor) -> Tensor:
        """[num_heads, N, draft_vocab_size] logits of every head (one projection when shared)."""
        features = torch.stack(
            [self.head_features(d, hidden, None) for d in range(1, self.num_heads + 1)]
        )
        if self.shared_lm_head:
            weight, bias = self.draft_projection_weight(1)
            return F.linear(features.to(weight.dtype), weight, bias)
        return torch.stack(
            [self.project_draft(d, features[d - 1]) for d in range(1, self.num_heads + 1)]
        )


class HydraHeads(DraftHeads):
    """Hydra ``mlp`` heads: head d reads the hidden state and the embeddings of its prefix."""

    head_type = "hydra"

    def __init__(
        self,
        *,
        num_heads: int,
        num_layers: int,
        hidden_size: int,
        vocab_size: int,
        embed: nn.Module,
        lm_head: nn.Module | None = None,
        grounded: bool = True,
    ) -> None:
        super().__init__(
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            lm_head=lm_head,
            projection_bias=True,
        )
        self.grounded = grounded
        self._embed: tuple[nn.Module, ...] = (embed,)
        self.first = nn.ModuleList(
            ConditionedResBlock((depth + 1) * hidden_size, hidden_size)
            if grounded
            else ResBlock(hidden_size)
            for depth in range(1, num_heads + 1)
        )
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers - 1)))
            for _ in range(num_heads)
        )
        if self.proj is not None:
            for linear in self.proj:
                nn.init.zeros_(linear.bias)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        with torch.no_grad():
            return self._embed[0](tokens)

    def head_features(self, depth: int, hidden: Tensor, prefix_tokens: Tensor | None) -> Tensor:
        self._check_depth(depth)
        x = hidden.to(self.dtype)
        if self.grounded:
            if prefix_tokens is None or prefix_tokens.shape != (x.shape[0], depth):
                got = None if prefix_tokens is None else tuple(prefix_tokens.shape)
                raise ValueError(
                    f"Hydra head {depth} needs prefix_tokens of shape [{x.shape[0]}, {depth}] "
                    f"(root token, then drafted tokens), got {got}"
                )
            embedded = self.embed_tokens(prefix_tokens.to(x.device)).to(x.dtype)
            x = torch.cat([x, embedded.reshape(x.shape[0], depth * self.hidden_size)], dim=-1)
        return self.blocks[depth - 1](self.first[depth - 1](x))

    def config_dict(self) -> dict[str, Any]:
        return {**super().config_dict(), "grounded": self.grounded}


MIN_DRAFT_VOCAB = 64  # at least every top-k a tree or a profile takes


def _tensor_key(tensor: Tensor | None) -> tuple[Any, ...]:
    """What changes when ``tensor``'s values may have: storage, version, dtype and device."""
    if tensor is None:
        return (None,)
    return (tensor.data_ptr(), value_version(tensor), tensor.dtype, tensor.device,
            tuple(tensor.shape))


def check_draft_vocab_size(size: int, vocab_size: int, *, option: str) -> None:
    """Refuse a draft vocabulary size the heads cannot take, naming the ``option`` that gave it."""
    if not MIN_DRAFT_VOCAB <= size <= vocab_size:
        raise EntmtpError(f"{option} must be in {MIN_DRAFT_VOCAB}..{vocab_size} (the vocabulary), "
                          f"got {size}")


def draft_vocab_problem(token_ids: Tensor, vocab_size: int) -> str | None:
    """Why ``token_ids`` cannot be a draft vocabulary of a ``vocab_size`` model, or None."""
    if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex \
            or token_ids.dtype == torch.bool:
        return f"token ids must be integers, got {token_ids.dtype}"
    if token_ids.dim() != 1:
        return f"token ids must be one list, got shape {tuple(token_ids.shape)}"
    count = int(token_ids.numel())
    if not MIN_DRAFT_VOCAB <= count <= vocab_size:
        return f"it must hold {MIN_DRAFT_VOCAB} to {vocab_size} tokens, got {count}"
    ids = token_ids.to(torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        return (f"token ids must lie in 0..{vocab_size - 1}, got {int(ids.min())} .. "
                f"{int(ids.max())}")
    if int(torch.unique(ids).numel()) != count:
        return "a token id appears twice"
    return None


def draft_projection_weight(heads: Any, depth: int) -> tuple[Tensor, Tensor | None]:
    """Head ``depth``'s projection over its draft vocabulary, for any heads object with a
    ``projection_weight`` (heads without a draft vocabulary: the whole projection)."""
    if hasattr(heads, "draft_projection_weight"):
        return heads.draft_projection_weight(depth)
    return heads.projection_weight(depth)


def draft_token_ids(heads: Any, columns: Tensor) -> Tensor:
    """Token ids of ``heads.head_logits`` columns (the same tensor without a draft vocabulary)."""
    return heads.draft_token_ids(columns) if hasattr(heads, "draft_token_ids") else columns


def draft_columns(heads: Any, token_ids: Tensor) -> Tensor:
    """``heads.head_logits`` column of each token id, -1 outside the draft vocabulary (the same
    tensor without one)."""
    return heads.draft_columns(token_ids) if hasattr(heads, "draft_columns") else token_ids


# ---------------------------------------------------------------------------------------------
# Base model access


def unwrap_base(base: Any) -> nn.Module:
    """The HF causal-LM module, given it or a wrapper with a ``.model`` module attribute."""
    if isinstance(base, nn.Module) and hasattr(base, "get_output_embeddings"):
        return base
    inner = getattr(base, "model", None)
    if isinstance(inner, nn.Module) and hasattr(inner, "get_output_embeddings"):
        return inner
    raise EntmtpError(
        f"expected a causal language model (transformers PreTrainedModel), got "
        f"{type(base).__name__}; pass the base model loaded by entmtp"
    )


def base_dimensions(base: Any) -> tuple[int, int]:
    """(hidden_size, vocab_size) of the base model's lm_head."""
    lm_head = unwrap_base(base).get_output_embeddings()
    vocab_size, hidden_size = lm_head.weight.shape
    return int(hidden_size), int(vocab_size)


def new_heads(
    base: Any,
    *,
    head_type: str,
    num_heads: int = 4,
    num_layers: int = 1,
    shared_lm_head: bool = True,
    grounded: bool = True,
    seed: int = 0,
) -> DraftHeads:
    """Fresh heads for ``base`` (in its dtype and device), initialised as Medusa and Hydra do.

    With an own projection, each head's projection starts as a copy of the base lm_head.
    """
    module = unwrap_base(base)
    hidden_size, vocab_size = base_dimensions(module)
    lm_head = module.get_output_embeddings()
    shared = lm_head if shared_lm_head else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        heads = build_heads(
            head_type,
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            lm_head=shared,
            embed=module.get_input_embeddings(),
            grounded=grounded,
        )
    if heads.proj is not None:
        with torch.no_grad():
            for linear in heads.proj:
                linear.weight.copy_(lm_head.weight)
    heads.base_model_name = str(getattr(base, "name", "") or _base_model_name(module))
    parameter = next(module.parameters())
    heads = heads.to(dtype=parameter.dtype, device=parameter.device).eval()
    use_row_kernels(heads)  # as load_heads: random heads must time like trained ones
    return heads


def build_heads(
    head_type: str,
    *,
    num_heads: int,
    num_layers: int,
    hidden_size: int,
    vocab_size: int,
    lm_head: nn.Module | None,
    embed: nn.Module,
    grounded: bool,
) -> DraftHeads:
    """New heads of ``head_type`` ("medusa" or "hydra"; Medusa ignores ``embed`` and
    ``grounded``), initialised as their constructors do."""
    if head_type == "medusa":
        return MedusaHeads(
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            lm_head=lm_head,
        )
    if head_type == "hydra":
        return HydraHeads(
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            embed=embed,
            lm_head=lm_head,
            grounded=grounded,
        )
    raise EntmtpError(f"unknown head type {head_type!r}; use one of {', '.join(HEAD_TYPES)}")


def _base_model_name(module: nn.Module) -> str:
    config = getattr(module, "config", None)
    return str(getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "") or "")


# ---------------------------------------------------------------------------------------------
# Hashing


def weights_sha256(structure: Mapping[str, Any], state: Mapping[str, Tensor]) -> str:
    """sha256 of ``structure`` (JSON, sorted keys) and of each tensor of ``state`` by name,
    upcast to float32: the heads' identity (``DraftHeads.sha256``), also stored in their config."""
    digest = hashlib.sha256()
    digest.update(json.dumps(dict(structure), sort_keys=True).encode())
    for name in sorted(state):
        tensor = state[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()
