"""A compact Llama-family forward over a preallocated KV cache, positions given as tensors.

``StaticLlama`` runs a loaded transformers model's own modules (embedding, RMSNorms, q/k/v/o
projections, MLP, final norm, lm_head: the weights by reference, so heads that share the lm_head
keep sharing it, and CPU linears keep calling the row kernels patched on their instances) but
owns the attention: rotary embedding from the model's ``inv_freq`` and ``attention_scaling``
(the same float32 ops as transformers' rotary module, so SmolLM2's ``rope_theta`` and static
rope scalings match exactly), the cache write and SDPA with grouped-query heads.

The cache is one tensor ``[layers, 2, kv_heads, capacity, head_dim]``. A forward writes its
``q`` tokens' keys and values at the cache slots ``slots`` (tensors, so a CUDA graph can replay
it at any past length) and attends either over the filled part only (``kv_len`` given: on the
CPU, where shapes may change every step) or over the whole cache with a mask that blocks the
unfilled slots (``kv_len=None``: fixed shapes for graphs).

A batch of sequences has a cache ``[layers, 2, batch, kv_heads, capacity, head_dim]`` and
``[batch, q]`` tokens and positions, written at the same slots in every row (``slots`` [q]:
batched greedy generation, ``calibrate``'s head data and profiles, whose left-padded prompts mask
out a row's padding) or at each row's own slots (``slots`` [batch, q]: the static runtime's
batched steps, each row at its own past length).

Grouped-query attention (SmolLM2: 9 query heads over 3 key/value heads) has three ways in
``GROUPED_KV_WAYS``, one method (``grouped_kv_way``: measured per device, dtype and batch, or
the ``grouped_kv`` a benchmark sets) choosing for every forward: ``fold`` stacks each key/value
head's query heads as rows of one attention and folds the mask the same way; ``sdpa`` lets SDPA
take grouped heads itself (``enable_gqa``); ``repeat`` copies the keys and values per query head
first, as transformers does. The repeat copies the whole cache three times per layer, most of a
step's time at batch 64 on a CPU; ``sdpa`` under a mask runs CUDA's math kernel. The ways not
chosen stay as the baselines of the benchmarks that measure the choice
(``bench/bench_cpu_attention.py``, ``bench/gpu_static_check.py``).

Supported: decoder layers with Llama's block (``static_support`` says why a model is not).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from entmtp.core import EntmtpError

from ._support import attention_or_logits_problem

# Model types whose decoder layer is Llama's block (pre-norm attention with RoPE and GQA, gated
# MLP), and rope types whose inverse frequencies never change with the sequence length.
STATIC_MODEL_TYPES = ("llama", "mistral", "qwen2")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
GROUPED_KV_WAYS = ("fold", "sdpa", "repeat")
# SDPA takes grouped key/value heads itself from torch 2.5 (``enable_gqa``).
_SDPA_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def static_support(model: torch.nn.Module) -> str | None:
    """None when ``model`` runs on ``StaticLlama``; else why not (one line)."""
    config = getattr(model, "config", None)
    name = type(model).__name__
    if config is None or not hasattr(model, "get_decoder"):
        return f"{name} is not a transformers causal LM"
    text_config = config.get_text_config(decoder=True)
    model_type = getattr(text_config, "model_type", None)
    if model_type not in STATIC_MODEL_TYPES:
        return f"model type {model_type!r} is not one of the Llama-family {STATIC_MODEL_TYPES}"
    problem = attention_or_logits_problem(text_config)
    if problem is not None:
        return f"the model {problem}"
    if getattr(text_config, "pretraining_tp", 1) not in (1, None):
        return "pretraining_tp > 1 splits the linears"
    decoder = model.get_decoder()
    rotary = getattr(decoder, "rotary_emb", None)
    layers = getattr(decoder, "layers", None)
    if rotary is None or not hasattr(rotary, "inv_freq") or not layers:
        return f"{type(decoder).__name__} has no rotary_emb.inv_freq or no layers"
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rope type {rope_type!r} changes with the sequence length"
    for layer in layers:
        attention = getattr(layer, "self_attn", None)
        if attention is None or any(
            not hasattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
        ) or any(hasattr(attention, n) for n in ("q_norm", "k_norm")):
            return f"{type(layer).__name__} is not Llama's attention block"
        if not all(hasattr(layer, n) for n in ("mlp", "input_layernorm",
                                                "post_attention_layernorm")):
            return f"{type(layer).__name__} is not Llama's decoder block"
    return None


class StaticLlama:
    """The forward of a Llama-family ``model`` over a static cache (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        reason = static_support(model)
        if reason is not None:
            raise EntmtpError(f"the static-shape runtime cannot run this model: {reason}")
        decoder = model.get_decoder()
        # No reference to the model object itself: engines cached per model hold it weakly.
        self.embed = decoder.embed_tokens
        self.layers = list(decoder.layers)
        self.norm = decoder.norm
        self.lm_head = model.get_output_embeddings()
        rotary = decoder.rotary_emb
        self.inv_freq = rotary.inv_freq  # [head_dim / 2] float32 buffer of the model
        self.rope_scaling = float(getattr(rotary, "attention_scaling", 1.0))
        attention = self.layers[0].self_attn
        config = model.config.get_text_config(decoder=True)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(attention.head_dim)
        self.scaling = float(attention.scaling)
        self.hidden_size = int(config.hidden_size)
        weight = self.lm_head.weight
        self.dtype, self.device = weight.dtype, weight.device
        self.grouped_kv: str | None = None  # one of GROUPED_KV_WAYS; None: grouped_kv_way's

    def grouped_kv_way(self, batched: bool) -> str:
        """How a forward reads grouped key/value heads: ``grouped_kv`` when set, else the
        choice measured on a CPU (docs/hardware.md, "Grouped key/value heads"): SDPA's own
        grouped heads, ~1% faster a step than the fold in float32 and bfloat16 and ~5% a
        bfloat16 batch of 64, except for a float32 batch, where the fold is 4-12% faster; on
        other devices the fold, which copies nothing and takes any kernel that reads a mask.
        ``batched``: more than one row (a batch of one is a single sequence)."""
        if self.grouped_kv is not None:
            return self.grouped_kv
        if self.device.type != "cpu" or not _SDPA_GQA:
            return "fold"
        return "fold" if batched and self.dtype == torch.float32 else "sdpa"

    def new_cache(self, capacity: int, batch: int | None = None) -> torch.Tensor:
        """An empty cache [layers, 2, kv_heads, capacity, head_dim] in the model's dtype, or
        [layers, 2, batch, kv_heads, capacity, head_dim] for a batch of sequences."""
        rows = () if batch is None else (batch,)
        return torch.zeros(len(self.layers), 2, *rows, self.num_kv_heads, capacity,
                           self.head_dim, dtype=self.dtype, device=self.device)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, sin [1, 1, q, head_dim] at ``positions`` [q], or [batch, 1, q, head_dim] at
        ``positions`` [batch, q] (transformers' own float32 ops)."""
        freqs = positions[..., None].float() * self.inv_freq.to(torch.float32)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos = (angles.cos() * self.rope_scaling).to(dtype)
        sin = (angles.sin() * self.rope_scaling).to(dtype)
        if positions.dim() == 1:
            return cos[None, None], sin[None, None]
        return cos[:, None], sin[:, None]

    def backbone(
        self,
        cache: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor | None,
        kv_len: int | None,
    ) -> torch.Tensor:
        """Final-norm hidden states [q, hidden] of ``tokens`` [q] at rotary ``positions`` [q].

        Their keys and values go to the cache ``slots`` [q] first; attention then reads cache
        slots ``[0, kv_len)`` (all of them when ``kv_len`` is None) under ``mask``: [q, kv_len]
        bool (True attends) or additive float, or None (attend to every slot read).

        A batch (a batch cache, see ``new_cache``): ``tokens`` and ``positions`` [batch, q],
        ``slots`` [q] (the same in every row) or [batch, q], ``mask`` [batch, q, kv_len] or
        None; returns [batch, q, hidden].
        """
        batched = tokens.dim() == 2
        x = self.embed(tokens) if batched else self.embed(tokens)[None]  # [rows, q, hidden]
        rows, q = x.shape[:2]
        cos, sin = self.rotary(positions, x.dtype)
        way = self.grouped_kv_way(rows > 1)
        write = _slot_writer(slots, rows, self.num_kv_heads, self.head_dim)
        attn_mask = None if mask is None else self._head_mask(mask.reshape(-1, 1,
                                                                      *mask.shape[-2:]), way)
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            h = layer.input_layernorm(x)
            queries = attention.q_proj(h).view(rows, q, -1, self.head_dim).transpose(1, 2)
            keys = attention.k_proj(h).view(rows, q, -1, self.head_dim).transpose(1, 2)
            values = attention.v_proj(h).view(rows, q, -1, self.head_dim).transpose(1, 2)
            queries = queries * cos + _rotate_half(queries) * sin
            keys = keys * cos + _rotate_half(keys) * sin
            layer_cache = cache[index]  # [2, (batch,) kv_heads, capacity, head_dim]
            write(layer_cache[0], (keys if batched else keys[0]).to(cache.dtype))
            write(layer_cache[1], (values if batched else values[0]).to(cache.dtype))
            past_keys = layer_cache[0, ..., :kv_len, :]  # [(batch,) kv_heads, kv_len, head_dim]
            past_values = layer_cache[1, ..., :kv_len, :]
            if not batched:
                past_keys, past_values = past_keys[None], past_values[None]
            out = self._attend(queries, past_keys, past_values, attn_mask, way)
            out = out.transpose(1, 2).reshape(rows, q, self.num_heads * self.head_dim)
            x = x + attention.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden = self.norm(x)
        return hidden if batched else hidden[0]

    def _groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    def _head_mask(self, mask: torch.Tensor, way: str) -> torch.Tensor:
        """``mask`` [rows, 1, q, kv_len] as ``_attend`` takes it: folded for ``fold``
        (row ``g * q + i`` is query ``i`` of the group's head ``g``)."""
        groups = self._groups()
        if way != "fold" or groups == 1 or mask.shape[-2] == 1:
            return mask
        return mask.repeat(1, 1, groups, 1)

    def _attend(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None, way: str) -> torch.Tensor:
        """Attention [rows, heads, q, head_dim] of ``queries`` [rows, heads, q, head_dim] over
        grouped ``keys`` and ``values`` [rows, kv_heads, kv_len, head_dim] (query head ``h``
        reads key/value head ``h // groups``) under ``mask`` from ``_head_mask`` or None."""
        groups = self._groups()
        way = way if groups > 1 else "repeat"
        if way == "fold":
            rows, heads, q, head_dim = queries.shape
            folded = queries.reshape(rows, self.num_kv_heads, groups * q, head_dim)
            out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask,
                                                 scale=self.scaling)
            return out.reshape(rows, heads, q, head_dim)
        if way == "sdpa" and _SDPA_GQA:
            return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask,
                                                  scale=self.scaling, enable_gqa=True)
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask,
                                              scale=self.scaling)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """lm_head logits [rows, vocab] of final-norm hidden states [rows, hidden]."""
        return self.lm_head(hidden)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _slot_writer(slots: torch.Tensor, rows: int, kv_heads: int, head_dim: int):
    """A function that writes a layer's keys or values ``[(batch,) kv_heads, q, head_dim]`` into
    its cache ``[(batch,) kv_heads, capacity, head_dim]`` at ``slots``: [q] (every row at the same
    slots) or [batch, q] (each row at its own; the index is expanded once per forward)."""
    if slots.dim() == 1:
        return lambda layer_cache, entries: layer_cache.index_copy_(-2, slots, entries)
    index = slots[:, None, :, None].expand(rows, kv_heads, slots.shape[1], head_dim)
    return lambda layer_cache, entries: layer_cache.scatter_(-2, index, entries)


def compact_static_cache(
    cache: torch.Tensor, past_len: torch.Tensor, path: torch.Tensor, keep_slots: torch.Tensor
) -> None:
    """Move the accepted path's entries to sit right after the past, in place.

    ``path`` [D+1] int64: accepted node indices (root first), padded with any node index;
    ``keep_slots`` [D+1]: ``arange(D+1)``; ``past_len`` [] int64. Slot ``past_len + j`` gets
    the entry of slot ``past_len + path[j]``: for the path's own length those are the kept
    entries, past it the padding lands beyond the new past length, where nothing reads it.
    A batch cache (``new_cache(_, batch)``) takes ``past_len`` [batch] and ``path``
    [batch, D+1], each row compacted at its own past length.
    Tensor-driven (no host sync, fixed shapes), so a graph can contain it.
    """
    if cache.dim() == 5:
        source = cache.index_select(3, past_len + path)  # copies first: overlapping is safe
        cache.index_copy_(3, past_len + keep_slots, source)
        return
    layers, pair, rows, kv_heads, _, head_dim = cache.shape
    shape = (layers, pair, rows, kv_heads, path.shape[-1], head_dim)
    source_slots = (past_len[:, None] + path)[None, None, :, None, :, None].expand(shape)
    target_slots = (past_len[:, None] + keep_slots)[None, None, :, None, :, None].expand(shape)
    cache.scatter_(4, target_slots, cache.gather(4, source_slots))  # gather copies first
