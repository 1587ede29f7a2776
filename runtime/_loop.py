"""The decoding loop every engine runs: prefill, then observe / choose / step / cut / commit /
log until ``max_new_tokens`` or an EOS token.

Generated token 0 comes from the prefill; generated token ``i`` is the pending token of the step
at position ``i``. A step at position ``i`` that keeps ``d`` drafted tokens emits tokens
``i + 1 .. i + 1 + d`` and the next step is at ``i + 1 + d``. Drafts past ``max_new_tokens`` or
after an EOS token are cut, and the base model's next token is emitted only while there is
room. A step's ``accept_length`` is the tokens it emitted (``1 + d``, or ``d`` on a final step
whose next token found no room).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._engine import Engine, reads_base_entropy, reads_draft_entropy
from ._records import DecodeResult, StepLog, StepMarks, cut_drafts

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
    eos = frozenset(int(t) for t in eos_token_ids)
    by_draft = reads_draft_entropy(scheduler)
    observes = reads_base_entropy(scheduler)
    engine.begin(prompt, scheduler, max_new_tokens)

    start = engine.now()
    first = engine.prefill(prompt)
    tokens = [first.token]
    scheduler.reset()
    if observes:
        scheduler.observe([first.base_entropy])
    prefill_ms = engine.now() - start
    if on_step is not None:
        on_step(None, list(tokens))

    log: list[StepLog] = []
    decode_start = engine.now()
    while len(tokens) < max_new_tokens and tokens[-1] not in eos:
        t_start = engine.now()
        emitted_before = len(tokens)
        t_prepared = t_start
        if by_draft:
            engine.prepare_draft()
            t_prepared = engine.now()
            scheduler.observe_draft(engine.draft_entropy())
        choice = scheduler.choose()
        step = engine.step_for(choice.tree)
        t_chosen = engine.now()
        run = engine.run(step)
        t_stepped = engine.now()
        drafts = cut_drafts(run.path_tokens[1:], max_new_tokens - len(tokens), eos)
        engine.commit(len(drafts) + 1)
        position = len(tokens) - 1
        tokens.extend(drafts)
        if len(tokens) < max_new_tokens and tokens[-1] not in eos:
            tokens.append(run.next_token)
        if observes:
            scheduler.observe(engine.base_entropies(len(drafts) + 1))
        t_done = engine.now()
        phases = engine.phase_times(StepMarks(t_start, t_prepared, t_chosen, t_stepped, t_done),
                                    run)
        log.append(StepLog(
            position=position,
            entropy_estimate=choice.estimate,
            tree_index=choice.index,
            num_nodes=choice.tree.num_nodes,
            depth=choice.tree.depth,
            accept_length=len(tokens) - emitted_before,
            draft_ms=phases.draft_ms,
            verify_ms=phases.verify_ms,
            bookkeeping_ms=phases.bookkeeping_ms,
        ))
        if on_step is not None:
            on_step(log[-1], tokens[emitted_before:])
    decode_ms = engine.now() - decode_start
    return DecodeResult(tokens=tokens, steps=len(log),
                        accept_lengths=[s.accept_length for s in log], prefill_ms=prefill_ms,
                        decode_ms=decode_ms, step_log=log)
