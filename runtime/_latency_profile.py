"""Measured step latency of draft trees on this machine, fitted to a treesearch ``LatencyModel``.

A timed step is what a live decoding step costs: drafting with the heads, the verification
forward, greedy acceptance, cache compaction and the entropies of the accepted path. Each tree is
timed at several KV-cache lengths (a random prompt of that length); after every step the cache is
cut back, so all repeats see the same context. Trees per node budget: a chain-like one (as deep as
the heads allow) and a wide one (as shallow as the top-k allows), plus any trees given.

Timing is interleaved: each round times one step of every tree (and one plain decode step), so a
slow spell of a shared machine lands on all trees alike instead of on whichever tree was being
timed; ``warmup`` untimed rounds come first. Each round also times the heads' preparation for a
draft-entropy choice (``prepare_ms``) and, when the heads fuse with the base model's lm_head
(Medusa with a shared lm_head), one fused empty-tree step (``fused_empty_ms``: the plain step
whose projection also yields the next step's heads, plus that head 1's entropy), cache restored
after it like the other steps. Medusa heads prepare one projection row per level of the
schedule's deepest tree, so both are timed for every draft depth 1..num_heads
(``prepare_ms_by_depth`` / ``fused_empty_ms_by_depth``; the scalar fields hold the deepest).
A point's time is the trimmed mean of its ``repeats``
(``TRIM`` cut at each end): the mean, because a decode's time is the sum of its steps, trimmed so
that one stray pause does not move it. The median used before sat below the live mean on a loaded
machine (steps have a long right tail), so bundles over-promised tokens/s.
"""

from __future__ import annotations

import heapq
import os
import platform
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from entmtp.calibrate._row_gemm import uses_few_row_kernel
from entmtp.calibrate._stats import entropy_from_logits
from entmtp.treesearch._errors import EntmtpError
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._tree import Tree

from ._decode import DecodingState, SpeculativeDecoder
from ._kv_cache import truncate_cache
from ._verify import forward_tokens, greedy_accept

DEFAULT_NODE_COUNTS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_CONTEXT_LENGTHS = (128, 512)
DEFAULT_REPEATS = 10
TRIM = 0.1  # fraction of a point's timed steps cut at each end before the mean


def trimmed_mean(times: Sequence[float], trim: float = TRIM) -> float:
    """Mean of ``times`` without the ``floor(trim * n)`` smallest and largest values."""
    if not times:
        raise EntmtpError("no timings to average")
    if not 0.0 <= trim < 0.5:
        raise EntmtpError(f"trim must be in [0, 0.5), got {trim}")
    ordered = sorted(float(t) for t in times)
    cut = int(trim * len(ordered))
    return statistics.fmean(ordered[cut: len(ordered) - cut])


def budget_tree(num_nodes: int, depth: int, *, topk: int, num_heads: int) -> Tree:
    """A tree of exactly ``num_nodes`` nodes whose depth is ``depth`` where possible.

    The depth is clipped to ``[1, num_heads]`` and ``num_nodes``, and raised when ``topk``-wide
    levels cannot hold the nodes. Nodes are the rank-0 chain to that depth, then the paths with
    the smallest rank sums (shallower first), i.e. the shape of a typical searched tree.
    """
    if num_nodes <= 0:
        return Tree.from_paths([])
    target = min(max(depth, 1), num_heads, num_nodes)
    while True:
        capacity = sum(topk**d for d in range(1, target + 1))
        if capacity >= num_nodes or target >= num_heads:
            break
        target += 1
    if capacity < num_nodes:
        raise EntmtpError(
            f"a tree of {num_nodes} nodes does not fit {num_heads} heads of top-{topk}: measure "
            "fewer nodes"
        )
    chosen = {(0,) * d for d in range(1, target + 1)}
    heap: list[tuple[int, int, tuple[int, ...]]] = [(r, 1, (r,)) for r in range(topk)]
    heapq.heapify(heap)
    while len(chosen) < num_nodes:
        _, length, path = heapq.heappop(heap)
        if path not in chosen:
            chosen.add(path)
        if length < target:
            for r in range(topk):
                child = (*path, r)
                heapq.heappush(heap, (sum(child), length + 1, child))
    return Tree.from_paths(sorted(chosen))


def _unwrap_model(model: Any) -> torch.nn.Module:
    if hasattr(model, "get_output_embeddings"):
        return model
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "get_output_embeddings"):
        return inner
    raise EntmtpError(
        f"expected a transformers causal LM (or entmtp's BaseModel), got {type(model).__name__}"
    )


def hardware_info(model: torch.nn.Module) -> dict[str, Any]:
    """Where the measurement ran: device name, torch/transformers versions, CPU count, dtype."""
    import transformers

    weight = model.get_output_embeddings().weight
    device = weight.device
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or platform.machine() or "cpu"
    return {
        "device": str(device),
        "device_name": device_name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "dtype": str(weight.dtype).replace("torch.", ""),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        # the few-row kernel hands any non-CPU weight to F.linear (calibrate/_row_gemm.py)
        "linear_kernel": "few-row" if device.type == "cpu"
        and uses_few_row_kernel(model.get_output_embeddings()) else "torch",
    }


def profile_latency(
    model: Any,
    heads: torch.nn.Module,
    *,
    node_counts: Sequence[int] = DEFAULT_NODE_COUNTS,
    depths: Sequence[int] | None = None,
    context_lengths: Sequence[int] = DEFAULT_CONTEXT_LENGTHS,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = 2,
    trees: Iterable[Tree] | None = None,
    topk: int = 10,
    seed: int = 0,
) -> LatencyModel:
    """Time trees of ``node_counts`` nodes (each at ``depths``, default 1 and all heads) and
    ``trees`` at every context length, and fit a ``LatencyModel`` (with ``autoregressive_ms``, a
    plain one-token decode step, and the hardware it ran on)."""
    model = _unwrap_model(model)
    if repeats < 1 or warmup < 0:
        raise EntmtpError("latency profiling needs repeats >= 1 and warmup >= 0")
    if not context_lengths or min(context_lengths) < 1:
        raise EntmtpError("latency profiling needs context lengths of at least 1 token")
    depths = tuple(depths) if depths is not None else (1, heads.num_heads)
    measured = _trees_to_measure(node_counts, depths, trees, topk=topk,
                                 num_heads=heads.num_heads)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    deepest = max(t.depth for t in measured)
    if max_positions and max(context_lengths) + deepest + 1 > max_positions:
        raise EntmtpError(
            f"context length {max(context_lengths)} plus a tree does not fit the model's "
            f"{max_positions} positions: measure shorter contexts"
        )

    decoder = SpeculativeDecoder(model, heads, topk=topk)
    clock = decoder.clock
    generator = torch.Generator().manual_seed(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    rows: list[tuple[int, int, float]] = []
    autoregressive: dict[int, float] = {}
    # Medusa heads prepare one projection row per level of the schedule's deepest tree, so
    # their prepare and fused steps are timed for every draft depth; Hydra's prepare is head 1.
    draft_depths = (list(range(1, heads.num_heads + 1))
                    if decoder.drafter.head_type == "medusa" else [heads.num_heads])
    # per draft depth, per context: heads run before a draft-entropy choice (see LatencyModel)
    prepare: dict[int, dict[int, float]] = {d: {} for d in draft_depths}
    # per draft depth, per context: empty-tree step that also prepares the next one
    fused: dict[int, dict[int, float]] = {d: {} for d in draft_depths}
    empty_plan = decoder.plan(Tree.from_paths([]))
    plans = [decoder.plan(tree) for tree in measured]
    for length in context_lengths:
        prompt = torch.randint(0, vocab, (int(length),), generator=generator)
        state, _ = decoder.prefill(prompt, lambda logits: int(logits.argmax()))
        saved = (state.past_len, state.pending, state.hidden)

        def restore(state: DecodingState = state, saved=saved, length=int(length)) -> None:
            truncate_cache(state.cache, length)
            state.past_len, state.pending, state.hidden = saved

        def tree_step(plan, state: DecodingState = state) -> float:
            start = clock.now()
            with torch.inference_mode():
                outcome = decoder.step(state, plan, greedy_accept)
                decoder.commit(state, outcome, outcome.path)
                entropy_from_logits(outcome.logits[outcome.path]).tolist()
            return clock.now() - start

        def plain_step(state: DecodingState = state) -> float:
            start = clock.now()
            with torch.inference_mode():
                step_input = torch.tensor([[state.pending]], device=decoder.device)
                _, logits = forward_tokens(model, state.cache, step_input)
                int(logits[-1].argmax())
            return clock.now() - start

        def prepare_step(depth: int, state: DecodingState = state) -> float:
            start = clock.now()
            with torch.inference_mode():
                prepared = decoder.prepare(state, depth)
                float(entropy_from_logits(prepared.first_logits))
            return clock.now() - start

        def fused_step(depth: int, state: DecodingState = state) -> float:
            start = clock.now()
            with torch.inference_mode():
                outcome, prepared = decoder.fused_empty_step(state, empty_plan, greedy_accept,
                                                             depth)
                decoder.commit(state, outcome, outcome.path)
                float(entropy_from_logits(prepared.first_logits))  # the next step's choice
            return clock.now() - start

        times: list[list[float]] = [[] for _ in plans]
        plain: list[float] = []
        preparing: dict[int, list[float]] = {d: [] for d in draft_depths}
        fusing: dict[int, list[float]] = {d: [] for d in draft_depths}
        for round_index in range(warmup + repeats):
            for i, plan in enumerate(plans):
                elapsed = tree_step(plan)
                restore()
                if round_index >= warmup:
                    times[i].append(elapsed)
            elapsed = plain_step()
            restore()
            if round_index >= warmup:
                plain.append(elapsed)
            for depth in draft_depths:
                elapsed = prepare_step(depth)  # reads the state only: nothing to restore
                if round_index >= warmup:
                    preparing[depth].append(elapsed)
                if decoder.fuses_empty:
                    elapsed = fused_step(depth)
                    restore()
                    if round_index >= warmup:
                        fusing[depth].append(elapsed)
        rows += [(tree.num_nodes, tree.depth, trimmed_mean(t)) for tree, t in zip(
            measured, times, strict=True)]
        autoregressive[int(length)] = trimmed_mean(plain)
        for depth in draft_depths:
            prepare[depth][int(length)] = trimmed_mean(preparing[depth])
            if fusing[depth]:
                fused[depth][int(length)] = trimmed_mean(fusing[depth])

    hardware = {
        **hardware_info(model),
        "context_lengths": [int(c) for c in context_lengths],
        "repeats": int(repeats),
        "warmup": int(warmup),
        "statistic": f"trimmed mean ({TRIM:.0%} cut at each end) of interleaved rounds",
        "topk": int(topk),
        "head_type": getattr(heads, "head_type", ""),
        "num_heads": int(heads.num_heads),
        "autoregressive_ms_by_context": {str(k): v for k, v in autoregressive.items()},
    }
    prepare_by_depth = [statistics.fmean(prepare[d].values()) for d in draft_depths]
    fused_by_depth = [statistics.fmean(fused[d].values()) for d in draft_depths if fused[d]]
    per_depth = len(draft_depths) > 1
    return LatencyModel.from_measurements(
        rows,
        autoregressive_ms=statistics.fmean(autoregressive.values()),
        prepare_ms=prepare_by_depth[-1],
        fused_empty_ms=fused_by_depth[-1] if fused_by_depth else None,
        prepare_ms_by_depth=prepare_by_depth if per_depth else (),
        fused_empty_ms_by_depth=fused_by_depth if per_depth else (),
        hardware=hardware,
    )


def _trees_to_measure(
    node_counts: Sequence[int], depths: Sequence[int], trees: Iterable[Tree] | None, *,
    topk: int, num_heads: int,
) -> list[Tree]:
    if not node_counts and not trees:
        raise EntmtpError("latency profiling needs node counts or trees to measure")
    if any(n < 0 for n in node_counts):
        raise EntmtpError(f"node counts must be >= 0, got {list(node_counts)}")
    if any(d < 1 for d in depths):
        raise EntmtpError(f"tree depths must be >= 1, got {list(depths)}")
    out: list[Tree] = []
    for n in sorted(set(int(n) for n in node_counts)):
        for depth in depths:
            tree = budget_tree(n, int(depth), topk=topk, num_heads=num_heads)
            if tree not in out:
                out.append(tree)
    for tree in trees or ():
        tree.check_fits(topk=topk, num_heads=num_heads)
        if tree not in out:
            out.append(tree)
    return out

