"""Tiny models and oracle draft heads for the decoding tests (model, runtime, evaluation).

Helpers are handed to tests through the ``rt`` fixture (a namespace; ``tests/conftest.py``
provides it), since test modules are imported by path and cannot import each other.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from entmtp.treesearch._profile import Profile, ProfileMeta, Trace
from entmtp.treesearch._tree import Tree
from support import make_tiny_llama


def sharp_llama(seed: int = 0, *, attn: str = "sdpa", vocab_size: int = 128, lm_scale: float = 2.0):
    """A tiny random Llama whose greedy output is not one repeated token.

    A tied random lm_head copies the last input token; an untied random one, scaled up, gives
    varied continuations with entropies from near 0 to a few nats.
    """
    model = make_tiny_llama(seed, vocab_size=vocab_size)
    generator = torch.Generator().manual_seed(1000 + seed)
    weight = torch.randn(model.lm_head.weight.shape, generator=generator) * lm_scale
    model.lm_head.weight = torch.nn.Parameter(weight)
    model.config.tie_word_embeddings = False
    model.config._attn_implementation = attn
    return model.eval()


def greedy_reference(model, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
    """Plain greedy decoding by transformers' ``generate`` (no EOS)."""
    out = model.generate(
        prompt.unsqueeze(0),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt) :].tolist()


@torch.inference_mode()
def causal_forward(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Final-norm hidden states and logits of one plain causal forward: [L, H], [L, V]."""
    hidden = model.get_decoder()(input_ids=ids.unsqueeze(0)).last_hidden_state[0]
    return hidden, model.get_output_embeddings()(hidden)


class OracleHeads(torch.nn.Module):
    """Draft heads that know the greedy continuation and put the true token at chosen ranks.

    ``ranks[i, d-1]`` is where head ``d`` ranks the true token at generated position ``i`` (the
    state whose pending token is generated token ``i``); -1 puts it just outside the top-k. The
    position is recovered from the hidden state by nearest neighbour over a causal forward of the
    full sequence. Hydra oracles also check their prefix: a wrong drafted prefix is a miss.
    """

    def __init__(self, model, prompt: torch.Tensor, continuation: list[int], ranks: np.ndarray, *,
                 head_type: str, topk: int, seed: int = 0) -> None:
        super().__init__()
        self.head_type = head_type
        self.sequence = torch.cat([prompt, torch.tensor(continuation, dtype=torch.int64)])
        self.prompt_len = len(prompt)
        self.ranks = np.asarray(ranks, dtype=np.int64)
        self.num_heads = self.ranks.shape[1]
        self.vocab_size, self.hidden_size = model.get_output_embeddings().weight.shape
        self.topk = topk
        self.seed = seed
        self.reference_hidden, _ = causal_forward(model, self.sequence)
        self.calls: list[tuple[int, int]] = []  # (depth, rows) per call

    def _row(self, depth: int, t: int, prefix: torch.Tensor | None) -> torch.Tensor:
        position = t - self.prompt_len + 1
        target = t + 1 + depth
        rank = -1
        if 0 <= position < len(self.ranks) and target < len(self.sequence):
            rank = int(self.ranks[position, depth - 1])
        if self.head_type == "hydra" and rank >= 0:
            truth = self.sequence[t + 1 : t + 1 + depth]
            if prefix is None or not torch.equal(prefix.cpu(), truth):
                rank = -1
        generator = torch.Generator().manual_seed(self.seed * 100003 + t * 31 + depth)
        order = torch.randperm(self.vocab_size, generator=generator).tolist()
        if target < len(self.sequence):
            true = int(self.sequence[target])
            order.remove(true)
            order.insert(rank if rank >= 0 else self.topk, true)
        logits = torch.empty(self.vocab_size)
        logits[torch.tensor(order)] = -torch.arange(self.vocab_size, dtype=torch.float32)
        return logits

    def head_logits(self, depth: int, hidden: torch.Tensor, prefix_tokens: torch.Tensor | None):
        assert 1 <= depth <= self.num_heads
        if self.head_type == "hydra":
            assert prefix_tokens is not None and prefix_tokens.shape == (hidden.shape[0], depth)
        self.calls.append((depth, hidden.shape[0]))
        distance = torch.cdist(hidden.float(), self.reference_hidden.float(),
                               compute_mode="donot_use_mm_for_euclid_dist")
        nearest = distance.argmin(dim=-1)
        assert float(distance.min(dim=-1).values.max()) < 1e-3, "hidden state not on the path"
        rows = [
            self._row(depth, int(t), None if prefix_tokens is None else prefix_tokens[n])
            for n, t in enumerate(nearest.tolist())
        ]
        return torch.stack(rows)


def random_ranks(rng: np.random.Generator, positions: int, num_heads: int, topk: int, *,
                 miss: float = 0.2) -> np.ndarray:
    """Rank table favouring low ranks, with misses (-1)."""
    weights = 0.5 ** np.arange(topk)
    ranks = rng.choice(topk, size=(positions, num_heads), p=weights / weights.sum())
    ranks[rng.random((positions, num_heads)) < miss] = -1
    return ranks.astype(np.int64)


def random_tree(rng: np.random.Generator, num_nodes: int, *, depth: int, topk: int) -> Tree:
    """A random prefix-closed tree of ``num_nodes`` nodes, depth <= ``depth``, ranks < ``topk``."""
    paths: set[tuple[int, ...]] = set()
    frontier: list[tuple[int, ...]] = [()]
    attempts = 0
    while len(paths) < num_nodes and attempts < 100 * (num_nodes + 1):
        attempts += 1
        parent = frontier[rng.integers(len(frontier))]
        if len(parent) >= depth:
            continue
        rank = int(min(rng.geometric(0.4) - 1, topk - 1))
        child = (*parent, rank)
        if child not in paths:
            paths.add(child)
            frontier.append(child)
    return Tree.from_paths(sorted(paths))


def oracle_profile(model, prompt: torch.Tensor, continuation: list[int], ranks: np.ndarray,
                   generated: int, *, head_type: str, entropy_fn) -> Profile:
    """The profile a profiler would record for this oracle: ``generated`` positions."""
    sequence = torch.cat([prompt, torch.tensor(continuation, dtype=torch.int64)])
    _, logits = causal_forward(model, sequence)
    start = len(prompt) - 1
    entropy = entropy_fn(logits[start : start + generated]).numpy()
    table = np.array(ranks[:generated], dtype=np.int64)
    positions = np.arange(generated)[:, None]
    depths = np.arange(1, table.shape[1] + 1)[None, :]
    table[positions + depths >= generated] = -1  # past the end of the trajectory
    meta = ProfileMeta(head_type=head_type, num_heads=table.shape[1])
    trace = Trace(0, "oracle", entropy, table, prompt_length=len(prompt))
    return Profile(meta, [trace])


@pytest.fixture(scope="session")
def rt() -> SimpleNamespace:
    return SimpleNamespace(
        make_tiny_llama=make_tiny_llama,
        sharp_llama=sharp_llama,
        greedy_reference=greedy_reference,
        causal_forward=causal_forward,
        OracleHeads=OracleHeads,
        BatchOracleHeads=BatchOracleHeads,
        random_ranks=random_ranks,
        random_tree=random_tree,
        oracle_profile=oracle_profile,
    )


class BatchOracleHeads(torch.nn.Module):
    """``OracleHeads`` of several sequences as one set of heads for a batch: each row's hidden
    state is answered by the oracle of the sequence it lies on (the nearest reference). A row
    on no sequence (a finished row the batch still computes) gets fixed logits."""

    def __init__(self, oracles: list[OracleHeads]) -> None:
        super().__init__()
        first = oracles[0]
        self.oracles = list(oracles)
        self.head_type, self.num_heads, self.topk = first.head_type, first.num_heads, first.topk
        self.vocab_size, self.hidden_size = first.vocab_size, first.hidden_size
        self.calls: list[tuple[int, int]] = []

    def head_logits(self, depth: int, hidden: torch.Tensor, prefix_tokens: torch.Tensor | None):
        self.calls.append((depth, hidden.shape[0]))
        distances = torch.stack([
            torch.cdist(hidden.float(), oracle.reference_hidden.float(),
                        compute_mode="donot_use_mm_for_euclid_dist").min(dim=-1).values
            for oracle in self.oracles])  # [oracles, N]
        owner = distances.argmin(dim=0).tolist()
        on_path = (distances.min(dim=0).values < 1e-3).tolist()
        fixed = -torch.arange(self.vocab_size, dtype=torch.float32)[None]
        return torch.cat([
            self.oracles[o].head_logits(depth, hidden[n : n + 1],
                                        None if prefix_tokens is None else prefix_tokens[n : n + 1])
            if on_path[n] else fixed
            for n, o in enumerate(owner)])
