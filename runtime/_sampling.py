"""Sampling-mode verification on a tree: Medusa's typical acceptance and lossless rejection.

Both take the same drafted tree as greedy verification (each head's top-k, so a node's draft is
a point mass on its token) and return the accepted path plus the next token after its leaf.
"""

from __future__ import annotations

import torch

from ._tree_attention import TreePlan
from ._verify import longest_accepted_path


def logits_to_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax of ``logits / temperature`` in float32 (``temperature > 0``)."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``probs`` [V]."""
    return int(torch.multinomial(probs, 1, generator=generator))


def typical_accept(
    plan: TreePlan,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    *,
    temperature: float,
    posterior_threshold: float,
    posterior_alpha: float,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Medusa's typical acceptance (Cai et al. 2024, sec. 2.3.1), then a sample after the leaf.

    A node is accepted if its parent's base probability of its token exceeds
    ``min(posterior_threshold, posterior_alpha * exp(-H(parent)))``; the longest path of accepted
    nodes wins. The next token is sampled from the leaf's distribution at ``temperature``.
    """
    probs = logits_to_probs(logits, temperature)  # [q, V]
    # Medusa's entropy term uses p * log(p + 1e-5), kept here so thresholds match its defaults.
    entropy = -(probs * torch.log(probs + 1e-5)).sum(dim=-1)
    threshold = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
    parent_prob = probs[plan.parents, tokens]
    node_ok = parent_prob > threshold[plan.parents]
    path = longest_accepted_path(plan, node_ok)
    return path, sample_from(probs[path[-1]], generator)


def rejection_accept(
    plan: TreePlan,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    *,
    temperature: float,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Lossless tree verification: the output follows the base distribution at ``temperature``.

    Starting at the root, the children of the current node are tried in rank order. Each draft is
    a point mass on its token, so child ``j`` is accepted with probability
    ``p(x_j) / (1 - sum_{i<j} p(x_i))`` (its target probability in the residual left after the
    earlier siblings were rejected). The first accepted child becomes the current node; if none
    is, the next token is drawn from the residual (the parent's distribution without its
    children's tokens). One uniform per node lets every node's choice be decided at once.
    """
    probs = logits_to_probs(logits, temperature)  # [q, V]
    children = plan.children  # [q, C], -1 padding
    valid = children >= 0
    safe_children = children.clamp(min=0)
    child_tokens = tokens[safe_children]  # [q, C]
    child_prob = torch.where(valid, probs.gather(1, child_tokens), 0.0)
    mass_before = torch.cumsum(child_prob, dim=-1) - child_prob
    ratio = child_prob / (1.0 - mass_before).clamp(min=1e-12)
    uniforms = torch.rand(plan.size, generator=generator, device=probs.device)
    accepted = valid & (uniforms[safe_children] < ratio)
    first = accepted.to(torch.int64).argmax(dim=-1)
    chosen = torch.where(accepted.any(dim=-1), children.gather(1, first[:, None])[:, 0], -1)

    chosen_host = chosen.tolist()
    path = [0]
    while chosen_host[path[-1]] >= 0:
        path.append(chosen_host[path[-1]])
    leaf = path[-1]
    residual = probs[leaf].clone()
    residual[child_tokens[leaf][valid[leaf]]] = 0.0
    total = float(residual.sum())
    if total <= 0.0:  # all mass sat on rejected children: only float round-off gets here
        return path, int(probs[leaf].argmax())
    return path, sample_from(residual / total, generator)
