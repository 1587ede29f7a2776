"""`entmtp decode`: generate from one prompt with a bundle's entropy schedule."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import typer
from rich.markup import escape

from entmtp.core import EntmtpError
from entmtp.treesearch import runtime_padding

from ._errors import user_errors
from ._live import (
    bundle_source,
    check_bundle_fits,
    check_head_type,
    check_max_new_tokens,
    load_base,
    load_heads_for,
    slow_warning,
    speed_line,
)
from ._model_setup import (
    BUNDLE_HEAD_TYPE_OPTION,
    BUNDLE_HEADS_OPTION,
    DEVICE_OPTION,
    DTYPE_OPTION,
    ENGINE_OPTION,
    GRAPHS_OPTION,
    MAX_NEW_TOKENS_OPTION,
    MODEL_OPTION,
    PAD_OPTION,
    check_engine,
    task_option,
)
from ._progress import status_console, warn
from ._typer_app import app

STEP_CALLBACK = "on_step"  # generate(..., on_step=f) calls f(step_log, new_tokens) per step


class TextStream:
    """Writes the decoded text of a growing token list to stdout as it grows, as is (no markup,
    no wrapping): stdout holds the generated text alone.

    Decoding the whole list each time keeps multi-token characters and tokenizer spacing right;
    text ending in an incomplete character (U+FFFD) waits for the next tokens.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.shown = ""

    def add(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(int(t) for t in tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.shown):
            return
        typer.echo(text[len(self.shown):], nl=False)
        self.shown = text

    def finish(self, tokens: Sequence[int]) -> None:
        """Write whatever of the final ``tokens`` is not shown yet, and the last newline."""
        text = self.tokenizer.decode(list(tokens), skip_special_tokens=True)
        rest = text[len(self.shown):] if text.startswith(self.shown) else "\n" + text
        typer.echo(rest)
        self.shown = text


def supports_step_callback(decoder) -> bool:
    return STEP_CALLBACK in inspect.signature(decoder.generate).parameters


@app.command()
@user_errors
def decode(
    source: Path | None = typer.Argument(None, help="A bundle.json or a run folder holding one "
                                         "(or --task: a shipped bundle)."),
    prompt: str = typer.Option(..., "--prompt", help="The prompt (a user turn for instruct "
                               "models)."),
    task: str | None = task_option(None, ": decode with the shipped bundle of this task that "
                                   "fits this machine best, instead of a bundle path"),
    max_new_tokens: int = MAX_NEW_TOKENS_OPTION,
    model: str | None = MODEL_OPTION,
    heads: str | None = BUNDLE_HEADS_OPTION,
    head_type: str | None = BUNDLE_HEAD_TYPE_OPTION,
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    engine: str = ENGINE_OPTION,
    graphs: bool = GRAPHS_OPTION,
    pad: bool = PAD_OPTION,
    batch_size: int = typer.Option(1, "--batch-size", help="Decode this many copies of the "
                                   "prompt together as one batch, with the bundle's schedule for "
                                   "that batch size (a bundle searched per batch size has one per "
                                   "range); prints the text once and the whole batch's speed."),
) -> None:
    """Generate from a prompt with a bundle's entropy-switched trees, streaming the text.

    The text alone goes to stdout; the bundle picked, the model loading, statistics and the
    measured speed beside the bundle's prediction go to stderr.

    Example: entmtp decode --task code --prompt "Write a function that reverses a list."

    Example: entmtp decode runs/code --prompt "Write a haiku about trees." --max-new-tokens 64

    Example: entmtp decode --task code --prompt "Sort a list in Python." --batch-size 8
    """
    console = status_console()
    check_head_type(head_type)
    check_engine(engine)
    check_max_new_tokens(max_new_tokens)
    if not prompt.strip():
        raise EntmtpError("--prompt is empty: give the text to continue")
    if batch_size < 1:
        raise EntmtpError(f"--batch-size {batch_size}: give 1 or more copies of the prompt")
    if source is not None and task is not None:
        raise EntmtpError(f"both a bundle ({source}) and --task {task}: give the bundle, or "
                          "--task to pick a shipped one, not both")
    _, bundle, picked = bundle_source(source, task, head_type, model=model, device=device,
                                      dtype=dtype)
    base = load_base(model, device=device, dtype=dtype)
    draft_heads = load_heads_for(base, heads, head_type or bundle.heads.type, model,
                                 bundle.heads.sha256)
    timed_here = check_bundle_fits(bundle, base, draft_heads, hardware_warnings=not picked)
    ids = base.encode_prompt(prompt)
    if not ids:
        raise EntmtpError("--prompt encodes to no tokens: give some text")
    base.check_fits_context("given with --prompt", len(ids), max_new_tokens)  # as validate does

    from entmtp.runtime import BundleScheduler, SpeculativeDecoder

    decoder = SpeculativeDecoder(base.model, draft_heads, topk=bundle.heads.topk, engine=engine,
                                 graphs=graphs,
                                 padded_nodes=runtime_padding(bundle.latency, pad=pad))
    if batch_size > 1:
        _decode_batch(console, decoder, bundle, base, ids, batch_size, max_new_tokens)
        return
    stream = TextStream(base.tokenizer)
    options = {}
    if supports_step_callback(decoder):
        options[STEP_CALLBACK] = lambda _step, new_tokens: stream.add(new_tokens)
    result = decoder.generate(ids, BundleScheduler(bundle.schedule()),
                              max_new_tokens=max_new_tokens,
                              eos_token_ids=sorted(base.eos_token_ids), **options)
    stream.finish(result.tokens)

    usage: dict[int, int] = {}
    for step in result.step_log:
        usage[step.tree_index] = usage.get(step.tree_index, 0) + 1
    trees = ", ".join(
        f"tree {i} ({bundle.trees[i].num_nodes} nodes) x{n}" for i, n in sorted(usage.items())
    ) or "none"
    console.print(f"{len(result.tokens)} tokens in {result.steps} steps; mean accept length "
                  f"{result.mean_accept_length:.3f} (predicted "
                  f"{bundle.predicted.mean_accept_length:.3f}); trees used: {trees}",
                  markup=False, highlight=False)
    console.print(speed_line(bundle, result.decode_tokens_per_second, result.tokens_per_second),
                  markup=False, highlight=False)
    console.print(f"[dim]{escape(decoder.runtime_note)}[/dim]", highlight=False)
    slow = slow_warning(bundle, result.decode_tokens_per_second, result.mean_accept_length,
                        timed_here=timed_here)
    if slow is not None:
        warn(slow)


def _decode_batch(console, decoder, bundle, base, ids: list[int], batch_size: int,
                  max_new_tokens: int) -> None:
    """``batch_size`` copies of the prompt as one batch: the text once on stdout (every row
    decodes it, greedily, exactly), the batch's statistics on stderr."""
    from entmtp.runtime import BundleScheduler

    schedule = bundle.schedule(batch_size)
    result = decoder.generate_batch([ids] * batch_size, BundleScheduler(schedule),
                                    max_new_tokens=max_new_tokens,
                                    eos_token_ids=sorted(base.eos_token_ids))
    first = result.rows[0]
    typer.echo(base.tokenizer.decode(list(first.tokens), skip_special_tokens=True))
    if any(list(row.tokens) != list(first.tokens) for row in result.rows):
        raise EntmtpError("the rows of one prompt decoded different tokens: a runtime bug, "
                          "please report it with the command line")
    trees = ", ".join(str(tree.num_nodes) for tree in schedule.trees)
    serving = bundle.batch_range(batch_size)
    range_words = ("the bundle's schedule" if serving is None else
                   f"the schedule of batch sizes {serving.min_batch_size}-"
                   f"{serving.max_batch_size}")
    console.print(f"batch of {batch_size}: {result.decode_tokens} tokens in {result.steps} batch "
                  f"steps, {result.mean_accept_length:.3f} tokens per row-step; "
                  f"{result.decode_tokens_per_second:.2f} tokens/s for the whole batch; "
                  f"{range_words} (trees of {trees} nodes)", markup=False, highlight=False)
    console.print(f"[dim]{escape(decoder.runtime_note)}[/dim]", highlight=False)
