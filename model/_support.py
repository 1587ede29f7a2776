"""Whether a transformers model can verify a draft tree: a 4D additive mask, explicit positions,
full attention in every layer and plain lm_head logits."""

from __future__ import annotations

import torch

from entmtp.core import EntmtpError

# Attention kernels that apply a custom additive 4D mask as given.
TREE_ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")
# Config attributes of models whose logits are not the plain lm_head output.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale")


def check_tree_attention_support(model: torch.nn.Module) -> None:
    """Raise ``EntmtpError`` if ``model`` cannot verify a tree (4D mask, explicit positions)."""
    config = getattr(model, "config", None)
    name = type(model).__name__
    if config is None or not hasattr(model, "get_decoder") or model.get_output_embeddings() is None:
        raise EntmtpError(
            f"{name} is not a transformers causal LM with a decoder and an lm_head: tree decoding "
            "needs one (e.g. LlamaForCausalLM)"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise EntmtpError(
            f"{name} is an encoder-decoder model: tree decoding needs a decoder-only LM"
        )
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in TREE_ATTENTION_IMPLEMENTATIONS:
        raise EntmtpError(
            f"{name} uses attention implementation {implementation!r}, which does not take a "
            f"custom 4D tree mask: load it with attn_implementation='sdpa' or 'eager'"
        )
    problem = attention_or_logits_problem(config.get_text_config(decoder=True))
    if problem is not None:
        raise EntmtpError(f"{name} {problem}")


def attention_or_logits_problem(text_config) -> str | None:
    """Why a model of this (text) config cannot decode trees as plain full attention with
    lm_head logits (sliding-window or other partial layers, transformed logits); None if it
    can. Phrased to follow the model's name."""
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types:
        partial_attention = any(t != "full_attention" for t in layer_types)
    else:
        partial_attention = bool(getattr(text_config, "sliding_window", None)) and getattr(
            text_config, "use_sliding_window", True
        ) is not False
    if partial_attention:
        return ("has sliding-window or non-full attention layers: tree decoding needs full "
                "attention in every layer")
    for attribute in LOGIT_TRANSFORMS:
        if getattr(text_config, attribute, None):
            return (f"transforms its logits ({attribute}) after the lm_head: tree decoding "
                    "supports plain lm_head logits only")
    return None
