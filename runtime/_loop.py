"""The decoding loop every engine runs: prefill, then observe / choose / step / cut / commit /
log until every row has ``max_new_tokens`` or an EOS token.

The loop decodes a batch of prompts (rows) together; ``decode`` is its one-row case. Each step
verifies one tree for every row still decoding (``choose_for_rows``), and each row keeps, cuts and
logs its own result. A row that finishes is masked out (``Engine.finish``): the batch keeps its
shape, so a step's kernels and graphs stay the same, and the finished row's tokens stop.

Generated token 0 of a row comes from the prefill; generated token ``i`` is the pending token of
the step at position ``i``. A step at position ``i`` that keeps ``d`` drafted tokens emits
tokens ``i + 1 .. i + 1 + d`` and the next step is at ``i + 1 + d``. Drafts past
``max_new_tokens`` or after an EOS token are cut, and the base model's next token is emitted
only while there is room. A step's ``accept_length`` is the tokens it emitted (``1 + d``, or
``d`` on a final step whose next token found no room).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._engine import Engine, reads_base_entropy, reads_draft_entropy
from ._records import BatchDecodeResult, DecodeResult, StepLog, StepMarks, cut_drafts
from ._scheduler import choose_for_rows, row_schedulers

if TYPE_CHECKING:
    import torch

    from ._scheduler import Scheduler


def decode(
    engine: Engine[Any],
    prompt: torch.Tensor | Sequence[int],
    scheduler: Scheduler,
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    on_step: Callable[[StepLog | None, list[int]], None] | None = None,
) -> DecodeResult:
    """Generate up to ``max_new_tokens`` (>= 1) tokens after ``prompt`` on ``engine``, each
    step's tree chosen by ``scheduler``, stopping after an EOS token. ``on_step(step_log,
    new_tokens)``, if given, is called with ``(None, [first token])`` after the prefill and then
    after every step with the tokens that step emitted."""
    row_step = None if on_step is None else (lambda _row, log, tokens: on_step(log, tokens))
    return decode_batch(engine, [prompt], scheduler, max_new_tokens=max_new_tokens,
                        eos_token_ids=eos_token_ids, on_step=row_step).rows[0]


def decode_batch(
    engine: Engine[Any],
    prompts: Sequence[torch.Tensor | Sequence[int]],
    scheduler: Scheduler,
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    on_step: Callable[[int, StepLog | None, list[int]], None] | None = None,
) -> BatchDecodeResult:
    """``decode`` of every prompt in ``prompts`` together, one row each: every step verifies
    one tree for all rows still decoding. ``on_step(row, step_log, new_tokens)`` as
    ``decode``'s, per row."""
    rows = len(prompts)
    eos = frozenset(int(t) for t in eos_token_ids)
    by_draft = reads_draft_entropy(scheduler)
    observes = reads_base_entropy(scheduler)
    schedulers = row_schedulers(scheduler, rows)
    engine.begin(prompts, scheduler, max_new_tokens)

    start = engine.now()
    firsts = engine.prefill(prompts)
    tokens = [[first.token] for first in firsts]
    for row, first in enumerate(firsts):
        schedulers[row].reset()
        if observes:
            schedulers[row].observe([first.base_entropy])
    prefill_ms = engine.now() - start
    if on_step is not None:
        for row in range(rows):
            on_step(row, None, list(tokens[row]))

    logs: list[list[StepLog]] = [[] for _ in range(rows)]
    done_ms = [0.0] * rows  # decode time when each row finished
    live = [row for row in range(rows) if not _finished(tokens[row], max_new_tokens, eos)]
    if live and len(live) < rows:
        engine.finish([row for row in range(rows) if row not in live])
    decode_start = engine.now()
    steps = 0
    while live:
        t_start = engine.now()
        t_prepared = t_start
        if by_draft:
            engine.prepare_draft()
            t_prepared = engine.now()
            entropies = engine.draft_entropy()
            for row in live:
                schedulers[row].observe_draft(entropies[row])
        choice = choose_for_rows([schedulers[row] for row in live])
        step = engine.step_for(choice.tree)
        t_chosen = engine.now()
        runs = engine.run(step)
        t_stepped = engine.now()
        kept = [0] * rows
        emitted: dict[int, tuple[int, int]] = {}  # row -> (tokens before, step position)
        for row in live:
            row_tokens = tokens[row]
            drafts = cut_drafts(runs[row].path_tokens[1:], max_new_tokens - len(row_tokens), eos)
            kept[row] = len(drafts) + 1
            emitted[row] = (len(row_tokens), len(row_tokens) - 1)
            row_tokens.extend(drafts)
            if not _finished(row_tokens, max_new_tokens, eos):
                row_tokens.append(runs[row].next_token)
        engine.commit(kept)
        if observes:
            entropies_by_row = engine.base_entropies(kept)
            for row in live:
                schedulers[row].observe(entropies_by_row[row])
        t_done = engine.now()
        phases = engine.phase_times(StepMarks(t_start, t_prepared, t_chosen, t_stepped, t_done),
                                    runs)
        steps += 1
        finished = []
        for row in live:
            before, position = emitted[row]
            logs[row].append(StepLog(
                position=position,
                entropy_estimate=choice.estimate,
                tree_index=choice.index,
                num_nodes=choice.tree.num_nodes,
                depth=choice.tree.depth,
                accept_length=len(tokens[row]) - before,
                draft_ms=phases.draft_ms,
                verify_ms=phases.verify_ms,
                bookkeeping_ms=phases.bookkeeping_ms,
            ))
            if on_step is not None:
                on_step(row, logs[row][-1], tokens[row][before:])
            if _finished(tokens[row], max_new_tokens, eos):
                finished.append(row)
                done_ms[row] = engine.now() - decode_start
        if finished:
            live = [row for row in live if row not in finished]
            if live:
                engine.finish(finished)
    decode_ms = engine.now() - decode_start
    results = [
        DecodeResult(tokens=tokens[row], steps=len(logs[row]),
                     accept_lengths=[s.accept_length for s in logs[row]], prefill_ms=prefill_ms,
                     decode_ms=done_ms[row] if rows > 1 else decode_ms, step_log=logs[row])
        for row in range(rows)
    ]
    return BatchDecodeResult(rows=results, steps=steps, prefill_ms=prefill_ms,
                             decode_ms=decode_ms)


def _finished(tokens: list[int], max_new_tokens: int, eos: frozenset[int]) -> bool:
    return len(tokens) >= max_new_tokens or tokens[-1] in eos
