"""The records of decoding: what a prefill and a step give the loop, and what the loop logs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepLog:
    """One decoding step."""

    position: int  # index of the step's pending token among the generated tokens
    entropy_estimate: float  # estimate the scheduler chose the tree from (nan: static tree)
    tree_index: int  # index of the tree in the scheduler's list
    num_nodes: int
    depth: int
    accept_length: int  # tokens the step emitted: drafts kept (after EOS / max_new_tokens cuts)
    #                     plus the base model's next token when there is room for it
    draft_ms: float  # heads + top-k + node tokens
    verify_ms: float  # the base-model forward over the tree (+ lm_head)
    bookkeeping_ms: float  # mask, acceptance, cache compaction, entropies, scheduler

    @property
    def step_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.bookkeeping_ms


@dataclass
class DecodeResult:
    tokens: list[int]  # generated ids (prompt excluded), cut after the first EOS
    steps: int  # decoding steps after the prefill
    accept_lengths: list[int]  # per step
    prefill_ms: float
    decode_ms: float  # wall time of all steps
    step_log: list[StepLog] = field(default_factory=list)

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the whole call (prefill included)."""
        total_ms = self.prefill_ms + self.decode_ms
        return 1000.0 * len(self.tokens) / total_ms if total_ms > 0 else 0.0

    @property
    def decode_tokens(self) -> int:
        """Tokens the steps produced: all but the prefill's first."""
        return max(len(self.tokens) - 1, 0)

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens the steps produced (all but the prefill's first) over the steps' time."""
        return 1000.0 * self.decode_tokens / self.decode_ms if self.decode_ms > 0 else 0.0


@dataclass
class BatchDecodeResult:
    """A batch decoded together (``decode_batch``): each row's result, and the batch's time.

    A row's ``decode_ms`` runs from the first step until the step that finished it (the whole
    decode for a batch of one); the batch's runs until its last row finished.
    """

    rows: list[DecodeResult]
    steps: int  # batch steps after the prefill (each verifies one tree for every live row)
    prefill_ms: float  # all rows' prefills
    decode_ms: float  # wall time of all steps

    @property
    def decode_tokens(self) -> int:
        """Tokens the steps produced over every row."""
        return sum(row.decode_tokens for row in self.rows)

    @property
    def decode_tokens_per_second(self) -> float:
        """The batch's throughput: every row's decode tokens over the steps' time."""
        return 1000.0 * self.decode_tokens / self.decode_ms if self.decode_ms > 0 else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Decode tokens per row-step (a row's step counted once per live row)."""
        row_steps = sum(row.steps for row in self.rows)
        return self.decode_tokens / row_steps if row_steps else 0.0


def cut_drafts(drafts: list[int], room: int, eos: frozenset[int]) -> list[int]:
    """Drafts that may be emitted: at most ``room``, through the first EOS."""
    kept = drafts[:room]
    for j, token in enumerate(kept):
        if token in eos:
            return kept[: j + 1]
    return kept


@dataclass(frozen=True)
class Prefilled:
    """What the prefill gives the loop."""

    token: int  # the first generated token (the first step's pending token)
    base_entropy: float  # entropy of the prompt's last logits (nan unless the schedule reads it)


@dataclass(frozen=True)
class StepRun:
    """What the host reads back after a step, before the loop cuts the drafts and commits."""

    path_tokens: list[int]  # tokens of the accepted path, root (the pending token) first
    next_token: int  # the base model's token after the path's leaf
    # Phases the engine timed inside the step (0 where it does not time them apart).
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    accept_ms: float = 0.0


@dataclass(frozen=True)
class StepMarks:
    """The loop's clock reads (the engine's ``now``, ms) around one step."""

    start: float  # the step begins
    prepared: float  # the draft is prepared (draft-entropy schedules; else ``start``)
    chosen: float  # the tree is chosen and its step looked up
    stepped: float  # the step ran and was read back
    done: float  # drafts cut, path committed, entropies observed


@dataclass(frozen=True)
class PhaseTimes:
    """A step's time split as ``StepLog`` logs it."""

    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float
