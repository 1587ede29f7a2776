"""The proposer: token of every tree node from Medusa or Hydra draft heads, for a batch of
sequences (rows) at a time, every row drafting the same tree.

``TreeDrafter(heads)`` gives the ``Drafter`` of the heads' type. Medusa heads see only the hidden
state, so one top-k per head serves the whole tree:
``tokens = [root, head1 top-k, head2 top-k, ...][tree_indices]``. Hydra heads also read the
node's path prefix, so they run level by level, batched over the level's distinct parents.

``prepare`` runs the heads' first results before a step's tree is chosen (a draft-entropy
schedule needs head 1's distribution to choose it): Medusa's heads 1..max_depth in one
projection, Hydra's level 1 (head 1 with the root as its prefix). ``draft(..., prepared)`` then
reuses them, so the heads never run twice in a step.

``project_with_base`` fuses the heads into a plain step (Medusa heads that share the base
lm_head, ``fuses_with_base``): one projection of ``[hidden; head 1..D features]`` gives the base
logits (row 0) and the heads' logits at that same hidden state, which is the next step's state,
so that step's ``Prepared`` comes for free. Hydra's head 1 reads the next root token, which only
the base logits decide, so Hydra heads never fuse.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from entmtp.core import HEAD_TYPES, EntmtpError
from entmtp.model import LOGIT_TRANSFORMS, draft_projection_weight, draft_token_ids, project_rows

from ._tree_attention import TreePlan


@dataclass(frozen=True)
class Prepared:
    """The heads' first results at one step's state (every row's), computed before its tree is
    chosen.

    ``logits``: Medusa ``[rows, depth, V']``, heads 1..depth at each row's hidden state; Hydra
    ``[rows, 1, V']``, head 1 with the row's root as its one-token prefix (the first level of
    any tree); ``V'``: the heads' draft vocabulary (``head_logits`` columns; the whole
    vocabulary without one).
    """

    depth: int  # deepest tree this can draft (Hydra: any; its deeper levels run in ``draft``)
    logits: torch.Tensor  # [rows, depth or 1, V']

    @property
    def first_logits(self) -> torch.Tensor:
        """Head 1's logits [rows, V'] at each row's state (their entropy is the draft signal)."""
        return self.logits[:, 0]


class Drafter:
    """The proposer interface: a Medusa or a Hydra implementation (``TreeDrafter`` picks one).

    Every method runs tensor ops of shapes fixed by the plan only (no host sync), so a static
    step can run it inside a captured CUDA graph.
    """

    head_type: str = ""
    # whether ``project_with_base`` exists: the heads can share a plain step's base projection
    can_fuse_with_base: bool = False

    def __init__(self, heads: torch.nn.Module) -> None:
        self.heads = heads
        # Copy a draft vocabulary's projection rows now, not inside a step a CUDA graph captures.
        if getattr(heads, "draft_vocab", None) is not None:
            for depth in range(1, heads.num_heads + 1):
                heads.draft_projection_weight(depth)

    def prepare(self, root: torch.Tensor, hidden: torch.Tensor, max_depth: int) -> Prepared:
        """Head results for drafting any tree of depth <= ``max_depth`` from this state
        (``root`` [rows], ``hidden`` [rows, hidden_size], as ``draft`` takes them).

        Always includes head 1 (for ``first_logits``), also when ``max_depth`` is 0.
        """
        raise NotImplementedError

    @property
    def prepared_rows(self) -> int:
        """Rows of ``prepare``'s logits for the deepest tree the heads can draft: one buffer of
        that many rows serves every preparation (``prepared_view``)."""
        raise NotImplementedError

    def prepared_view(self, buffer: torch.Tensor, max_depth: int) -> Prepared:
        """The ``Prepared`` that ``prepare(_, _, max_depth)`` gives, read from ``buffer``
        [rows, prepared_rows, V'] into which an earlier preparation's logits were copied."""
        raise NotImplementedError

    def prepare_depths(self) -> list[int]:
        """The ``max_depth`` values whose preparations differ in work (the rest repeat one)."""
        raise NotImplementedError

    def draft(
        self, plan: TreePlan, root: torch.Tensor, hidden: torch.Tensor,
        prepared: Prepared | None = None,
    ) -> torch.Tensor:
        """Tokens of the root and every node of each row: [rows, q] int64.

        ``root``: [rows] int64, each row's pending token; ``hidden``: [rows, hidden_size], the
        final-norm hidden state of each row's last cached position (whose logits chose its
        root); ``prepared``: ``prepare(root, hidden, ...)`` of this same state, reused instead
        of running its heads.
        """
        if plan.depth == 0:
            return root.reshape(-1, 1)
        if prepared is not None and prepared.depth < plan.depth:
            raise EntmtpError(
                f"the draft was prepared for trees of depth <= {prepared.depth} but the tree has "
                f"depth {plan.depth}: prepare with the deepest tree the scheduler may choose"
            )
        return self._draft(plan, root, hidden, prepared)

    def _draft(
        self, plan: TreePlan, root: torch.Tensor, hidden: torch.Tensor,
        prepared: Prepared | None,
    ) -> torch.Tensor:
        raise NotImplementedError


class MedusaDrafter(Drafter):
    """Medusa heads see only the hidden state: one top-k per head serves the whole tree."""

    head_type = "medusa"
    can_fuse_with_base = True

    @torch.inference_mode()
    def prepare(self, root: torch.Tensor, hidden: torch.Tensor, max_depth: int) -> Prepared:
        depth = max(int(max_depth), 1)
        return Prepared(depth, medusa_logits(self.heads, hidden, depth))

    @property
    def prepared_rows(self) -> int:
        return self.heads.num_heads  # one projection row per head

    def prepared_view(self, buffer: torch.Tensor, max_depth: int) -> Prepared:
        depth = max(int(max_depth), 1)
        return Prepared(depth, buffer[:, :depth])

    def prepare_depths(self) -> list[int]:
        return list(range(1, self.heads.num_heads + 1))  # one more row per level

    @torch.inference_mode()
    def project_with_base(
        self, hidden: torch.Tensor, max_depth: int
    ) -> tuple[torch.Tensor, Prepared]:
        """Base logits [rows, V] at ``hidden`` [rows, hidden_size] and
        ``prepare(_, hidden, max_depth)`` from one projection through the shared lm_head (only
        for ``fuses_with_base`` heads)."""
        depth = max(int(max_depth), 1)
        weight, bias = self.heads.projection_weight(1)
        rows = hidden.shape[0]
        features = medusa_features(self.heads, hidden, depth)  # [depth * rows, H], head-major
        stacked = torch.cat([hidden.to(weight.dtype), features.to(weight.dtype)])
        logits = project_rows(stacked, weight, bias, reused=True)  # [(1 + depth) * rows, V]
        heads_logits = _by_row(logits[rows:], depth, rows)
        vocab = getattr(self.heads, "draft_vocab", None)
        if vocab is not None:  # the draft vocabulary's columns, as head_logits gives them
            heads_logits = heads_logits.index_select(2, vocab.to(logits.device))
        return logits[:rows], Prepared(depth, heads_logits)

    @torch.inference_mode()
    def _draft(
        self, plan: TreePlan, root: torch.Tensor, hidden: torch.Tensor,
        prepared: Prepared | None,
    ) -> torch.Tensor:
        if prepared is None:
            logits = medusa_logits(self.heads, hidden, plan.depth)  # [rows, depth, V]
        else:
            logits = prepared.logits[:, : plan.depth]
        top = torch.topk(logits, plan.max_topk, dim=-1).indices  # [rows, depth, max_topk]
        # Same as Medusa's [root, head1 top-k, ...][tree_indices], also for per-head top-k.
        nodes = draft_token_ids(self.heads, top[:, plan.node_head, plan.node_rank])  # [rows, n]
        return torch.cat([root.reshape(-1, 1).to(nodes.device), nodes], dim=1)


class HydraDrafter(Drafter):
    """Hydra heads also read the node's path prefix: level by level, batched over the level's
    distinct parents (fixed shapes per tree)."""

    head_type = "hydra"

    @torch.inference_mode()
    def prepare(self, root: torch.Tensor, hidden: torch.Tensor, max_depth: int) -> Prepared:
        # The same call as the first level of _draft (one parent per row: its root).
        logits = self.heads.head_logits(1, hidden, root.reshape(-1, 1).to(hidden.device))
        return Prepared(self.heads.num_heads, logits[:, None])  # [rows, 1, V']

    @property
    def prepared_rows(self) -> int:
        return 1  # head 1 at the root, whatever the depth

    def prepared_view(self, buffer: torch.Tensor, max_depth: int) -> Prepared:
        return Prepared(self.heads.num_heads, buffer)

    def prepare_depths(self) -> list[int]:
        return [self.heads.num_heads]  # head 1 whatever the depth

    @torch.inference_mode()
    def _draft(
        self, plan: TreePlan, root: torch.Tensor, hidden: torch.Tensor,
        prepared: Prepared | None,
    ) -> torch.Tensor:
        rows = hidden.shape[0]
        tokens = torch.empty(rows, plan.size, dtype=torch.int64, device=plan.depths.device)
        tokens[:, 0] = root.reshape(rows)
        for depth in range(1, plan.depth + 1):
            expand = plan.expand_nodes[depth - 1]
            parents = len(expand)
            if depth == 1 and prepared is not None:
                logits = prepared.logits[:, 0]  # [rows, V']: level 1 expands the root only
            else:
                # [rows * u, depth]: each expanded node's path root .. parent, row-major
                prefix = tokens[:, plan.ancestors[expand, :depth]].reshape(-1, depth)
                states = hidden[:, None].expand(rows, parents, hidden.shape[1])
                logits = self.heads.head_logits(depth, states.reshape(-1, hidden.shape[1]),
                                                prefix)
            logits = logits.reshape(rows, parents, -1)
            nodes = plan.level_nodes[depth]
            top = torch.topk(logits, plan.topk[depth - 1], dim=-1).indices  # [rows, u, topk]
            tokens[:, nodes] = draft_token_ids(
                self.heads, top[:, plan.parent_slot[depth - 1], plan.ranks[nodes]])
        return tokens


_DRAFTERS: dict[str, type[Drafter]] = {"medusa": MedusaDrafter, "hydra": HydraDrafter}


def TreeDrafter(heads: torch.nn.Module) -> Drafter:  # noqa: N802 (the proposer's public name)
    """The drafter of ``heads`` (``entmtp.model.DraftHeads``): Medusa or Hydra by their type."""
    head_type = getattr(heads, "head_type", None)
    if head_type not in _DRAFTERS:
        raise EntmtpError(
            f"draft heads have head_type {head_type!r}: expected one of {list(HEAD_TYPES)}"
        )
    return _DRAFTERS[head_type](heads)


def medusa_logits(heads: torch.nn.Module, hidden: torch.Tensor, depth: int) -> torch.Tensor:
    """Logits [rows, depth, V] of heads 1..depth at ``hidden`` [rows, hidden_size].

    With a shared vocabulary projection (the model layer's heads expose ``head_features`` and
    ``projection_weight``) all heads go through one 2-D matmul, so the large vocabulary matrix
    is read once per step; otherwise ``all_head_logits`` or one ``head_logits`` call per head.
    """
    rows = hidden.shape[0]
    if getattr(heads, "shared_lm_head", False) and hasattr(heads, "head_features"):
        weight, bias = draft_projection_weight(heads, 1)
        features = medusa_features(heads, hidden, depth).to(weight.dtype)
        return _by_row(project_rows(features, weight, bias, reused=True), depth, rows)
    if hasattr(heads, "all_head_logits"):
        return heads.all_head_logits(hidden)[:depth].transpose(0, 1)
    return _by_row(torch.cat([heads.head_logits(d, hidden, None) for d in range(1, depth + 1)]),
                   depth, rows)


def medusa_features(heads: torch.nn.Module, hidden: torch.Tensor, depth: int) -> torch.Tensor:
    """Inputs [depth * rows, hidden_size] of heads 1..depth's vocabulary projection at
    ``hidden`` [rows, hidden_size], head-major (head 1's rows first)."""
    return torch.cat([heads.head_features(d, hidden, None) for d in range(1, depth + 1)])


def _by_row(head_major: torch.Tensor, depth: int, rows: int) -> torch.Tensor:
    """[depth * rows, V] head-major logits as [rows, depth, V] (a view)."""
    return head_major.reshape(depth, rows, -1).transpose(0, 1)


def fuses_with_base(model: torch.nn.Module, heads: torch.nn.Module) -> bool:
    """Whether one projection can give ``model``'s logits and ``heads``' (``project_with_base``).

    Medusa heads whose vocabulary projection is the model's own lm_head (the same weight and
    bias tensors), a plain ``nn.Linear``, with no logit soft-capping or scaling after it.
    """
    if getattr(heads, "head_type", None) != "medusa" or not getattr(heads, "shared_lm_head", False):
        return False
    if not (hasattr(heads, "head_features") and hasattr(heads, "projection_weight")):
        return False
    lm_head = model.get_output_embeddings()
    linear = torch.nn.Linear
    if not isinstance(lm_head, linear) or type(lm_head).forward is not linear.forward:
        return False
    config = getattr(model, "config", None)
    text_config = config.get_text_config(decoder=True) if config is not None else None
    if any(getattr(text_config, attribute, None) for attribute in LOGIT_TRANSFORMS):
        return False
    weight, bias = heads.projection_weight(1)
    return _same_tensor(weight, lm_head.weight) and (
        _same_tensor(bias, lm_head.bias) if bias is not None or lm_head.bias is not None else True
    )


def _same_tensor(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """The same storage, layout and dtype (a ``detach()`` of ``b`` counts as ``b``)."""
    if a is None or b is None:
        return False
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)
