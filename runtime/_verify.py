"""The scorer: one base-model forward over a tree, and greedy acceptance of its longest path.

The forward calls the decoder and the output embedding separately so that a step has both the
final-norm hidden states (which feed the draft heads) and the logits; ``tree_backbone`` stops
before the lm_head, for a step that projects the hidden state together with the heads' rows.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

from entmtp.core import EntmtpError
from entmtp.model import cache_keyword

from ._tree_attention import TreePlan


def forward_tokens(
    model: torch.nn.Module,
    cache: DynamicCache,
    input_ids: torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``input_ids`` [1, q] through the model over ``cache`` (appending to it).

    Returns the final-norm hidden states [q, hidden_size] and the logits [q, vocab].
    """
    hidden = backbone_forward(model, cache, input_ids, position_ids=position_ids,
                              attention_mask=attention_mask)
    return hidden, model.get_output_embeddings()(hidden)


def backbone_forward(
    model: torch.nn.Module,
    cache: DynamicCache,
    input_ids: torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``forward_tokens`` without the lm_head: the final-norm hidden states [q, hidden_size]."""
    decoder = model.get_decoder()
    out = decoder(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        **{cache_keyword(decoder): cache},
    )
    return out.last_hidden_state[0]


def tree_forward(
    model: torch.nn.Module,
    cache: DynamicCache,
    plan: TreePlan,
    tokens: torch.Tensor,
    past_len: int,
    *,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify ``tokens`` [q] (root first) laid out as ``plan`` after ``past_len`` cached tokens."""
    hidden = tree_backbone(model, cache, plan, tokens, past_len, dtype=dtype)
    return hidden, model.get_output_embeddings()(hidden)


def tree_backbone(
    model: torch.nn.Module,
    cache: DynamicCache,
    plan: TreePlan,
    tokens: torch.Tensor,
    past_len: int,
    *,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``tree_forward`` without the lm_head: the same cache update, hidden states [q, hidden]."""
    mask = plan.attention_mask(past_len, dtype)
    positions = (plan.depths + past_len).unsqueeze(0)
    return backbone_forward(model, cache, tokens.unsqueeze(0), position_ids=positions,
                            attention_mask=mask)


def longest_accepted_path(plan: TreePlan, node_ok: torch.Tensor) -> list[int]:
    """Node indices (root first) of the longest root path whose nodes all have ``node_ok``.

    ``node_ok``: [q] bool, whether each node's token is accepted given its parent; the root's
    entry is ignored. Ties go to the first leaf in the tree's canonical order.
    """
    node_ok = node_ok.clone()
    node_ok[0] = True
    rows = node_ok[plan.retrieve] & plan.retrieve_valid  # [leaves, depth+1]
    lengths = rows.to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    best, length = torch.stack([lengths.argmax(), lengths.max()]).tolist()
    return plan.retrieve[best, :length].tolist()


def greedy_accept(
    plan: TreePlan, tokens: torch.Tensor, logits: torch.Tensor
) -> tuple[list[int], int]:
    """Greedy verification: a node is accepted if its token is the argmax of its parent's logits.

    Returns the accepted path (root first) and the base model's next token after its leaf.
    """
    argmax = logits.argmax(dim=-1)
    node_ok = tokens == argmax[plan.parents]
    path = longest_accepted_path(plan, node_ok)
    return path, int(argmax[path[-1]])


@torch.inference_mode()
def probe_tree_attention(model: torch.nn.Module, *, atol: float = 1e-3) -> float:
    """Check on a 3-token prompt that a two-branch tree reproduces plain causal decoding.

    Returns the largest logit difference; raises ``EntmtpError`` above ``atol``.
    """
    from entmtp.treesearch import Tree

    from ._kv_cache import new_cache
    from ._tree_attention import tree_plan

    device = next(model.parameters()).device
    dtype = model.get_output_embeddings().weight.dtype
    vocab = model.get_output_embeddings().weight.shape[0]
    prompt = torch.arange(3, 6, device=device) % vocab
    branch = torch.tensor([7, 11, 13], device=device) % vocab  # root, child a, child b
    plan = tree_plan(Tree.from_paths([[0], [1]]), 2, device)

    cache = new_cache(model)
    forward_tokens(model, cache, prompt.unsqueeze(0))
    _, tree_logits = tree_forward(model, cache, plan, branch, len(prompt), dtype=dtype)

    worst = 0.0
    for node in (1, 2):
        reference_cache = new_cache(model)
        plain = torch.cat([prompt, branch[[0, node]]]).unsqueeze(0)
        _, logits = forward_tokens(model, reference_cache, plain)
        full = model(plain).logits[0]
        worst = max(worst, float((logits - full).abs().max()))
        worst = max(worst, float((tree_logits[[0, node]] - logits[-2:]).abs().max()))
    if worst > atol:
        raise EntmtpError(
            f"{type(model).__name__} does not honour a 4D tree attention mask (logits differ by "
            f"{worst:.3g} from causal decoding): load it with attn_implementation='eager'"
        )
    return worst
