"""``entmtp latency``'s measurement: the latency model of a model and its heads (or of the
model's architecture with random weights, which times the same steps without weight files) on
this machine, with what it records about the measurement. The calibration pipeline's latency
stage times the same steps (``runtime.profile_latency``)."""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path
from typing import Any

from entmtp.core import EntmtpError
from entmtp.model import check_device, check_head_type, load_model_and_heads, resolve_dtype_name
from entmtp.treesearch import BatchLatency, LatencyModel


def describe_hardware(
    *, dtype: str, model_name: str, random_weights: bool, head_type: str, num_heads: int,
) -> dict[str, Any]:
    """What a latency model (and each bundle searched with it) records about the measurement,
    beside the machine record the profiler writes (``entmtp.core.describe_machine``)."""
    return {
        "kind": "measured",
        "dtype": dtype,
        "model": model_name,
        "random_weights": random_weights,
        "head_type": head_type,
        "num_heads": num_heads,
        "measured_on": datetime.date.today().isoformat(),
    }


def load_for_latency(
    *, model: str | None, heads: str | None, head_type: str, num_heads: int,
    random_weights: bool, dtype: str, device: str, seed: int,
    draft_vocab_size: int | None = None,
) -> tuple[Any, Any, str]:
    """(causal LM, draft heads, model name) on ``device`` in ``dtype``; ``draft_vocab_size``:
    random heads draft over that many (random) tokens, as heads with a draft vocabulary do."""
    if draft_vocab_size is not None and heads is not None:
        raise EntmtpError("--draft-vocab-size is for random heads: --heads drafts over its own "
                          "vocabulary; leave one of them out")
    base, draft, name = _load_for_latency(model=model, heads=heads, head_type=head_type,
                                          num_heads=num_heads, random_weights=random_weights,
                                          dtype=dtype, device=device, seed=seed)
    if draft_vocab_size is not None:
        import torch

        from entmtp.model import check_draft_vocab_size

        check_draft_vocab_size(draft_vocab_size, draft.vocab_size, option="--draft-vocab-size")
        generator = torch.Generator().manual_seed(seed)
        draft.set_draft_vocab(torch.randperm(draft.vocab_size, generator=generator)
                              [:draft_vocab_size])
    return base, draft, name


def _load_for_latency(
    *, model: str | None, heads: str | None, head_type: str, num_heads: int,
    random_weights: bool, dtype: str, device: str, seed: int,
) -> tuple[Any, Any, str]:
    if random_weights:
        from entmtp.model import load_heads, new_heads, random_model

        check_head_type(head_type)
        built = random_model(model, dtype=dtype, device=device, seed=seed)
        if heads is not None:  # the heads' own shapes; their weights are as good as random here
            draft = load_heads(Path(heads).expanduser(), built.model)
        else:
            draft = new_heads(built.model, head_type=head_type, num_heads=num_heads, seed=seed)
        return built.model, draft, built.name
    base, draft = load_model_and_heads(model, heads, head_type, device=device, dtype=dtype)
    return base.model, draft, base.name


def measure_latency(
    *, model: str | None = None, heads: str | None = None, head_type: str = "medusa",
    num_heads: int = 4, random_weights: bool = False, dtype: str = "fp32", device: str = "cpu",
    node_counts: tuple[int, ...] | None = None, depths: tuple[int, ...] | None = None,
    context_lengths: tuple[int, ...] | None = None, repeats: int | None = None,
    warmup: int | None = None, seed: int = 0, threads: int | None = None,
    remeasure: int | None = None, engine: str = "auto", graphs: bool = True,
    draft_vocab_size: int | None = None, deadline: float | None = None,
) -> LatencyModel:
    """The latency model of ``model`` + heads on ``device``; ``hardware`` says where and how.

    ``threads``: torch's intra-op CPU threads (None: torch's default). ``engine`` / ``graphs``:
    the runtime whose steps are timed (``profile_latency``). ``draft_vocab_size``: random heads
    draft over that many tokens (``load_for_latency``). ``deadline``: a ``time.monotonic()``
    value the timing ends by (``profile_latency``).
    """
    return measure_batch_latency(
        model=model, heads=heads, head_type=head_type, num_heads=num_heads,
        random_weights=random_weights, dtype=dtype, device=device, node_counts=node_counts,
        depths=depths, context_lengths=context_lengths, repeats=repeats, warmup=warmup,
        seed=seed, threads=threads, remeasure=remeasure, engine=engine, graphs=graphs,
        draft_vocab_size=draft_vocab_size, deadline=deadline, batch_sizes=(1,))[1]


def measure_batch_latency(
    *, model: str | None = None, heads: str | None = None, head_type: str = "medusa",
    num_heads: int = 4, random_weights: bool = False, dtype: str = "fp32", device: str = "cpu",
    node_counts: tuple[int, ...] | None = None, depths: tuple[int, ...] | None = None,
    context_lengths: tuple[int, ...] | None = None, repeats: int | None = None,
    warmup: int | None = None, seed: int = 0, threads: int | None = None,
    remeasure: int | None = None, engine: str = "auto", graphs: bool = True,
    draft_vocab_size: int | None = None, deadline: float | None = None,
    batch_sizes: tuple[int, ...] = (1,),
) -> BatchLatency:
    """``measure_latency`` at each of ``batch_sizes`` (steps of that many sequences, on the
    static runtime past 1), the model loaded once, one size after the other."""
    dtype_name = resolve_dtype_name(dtype)
    device = check_device(device)
    if num_heads < 1:
        raise EntmtpError(f"--num-heads {num_heads}: give at least 1")
    if repeats is not None and repeats < 1:
        raise EntmtpError(f"--repeats {repeats}: give at least 1")
    if warmup is not None and warmup < 0:
        raise EntmtpError(f"--warmup {warmup}: give 0 or more")
    if depths is not None and min(depths) < 1:
        raise EntmtpError("--depths: a tree has depth 1 or more")
    if context_lengths is not None and min(context_lengths) < 1:
        raise EntmtpError("--context-lengths: give lengths of 1 token or more")
    if threads is not None and threads < 1:
        raise EntmtpError(f"--threads {threads}: give at least 1")
    if remeasure is not None and remeasure < 0:
        raise EntmtpError(f"--remeasure {remeasure}: give 0 or more")
    if not batch_sizes or min(batch_sizes) < 1:
        raise EntmtpError(f"--batch-sizes {list(batch_sizes)}: give sizes of 1 or more")
    import torch

    from ._latency_profile import profile_latency

    previous_threads = torch.get_num_threads()
    models = {}
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        base, draft, name = load_for_latency(
            model=model, heads=heads, head_type=head_type, num_heads=num_heads,
            random_weights=random_weights, dtype=dtype_name, device=device, seed=seed,
            draft_vocab_size=draft_vocab_size,
        )
        options = {"node_counts": node_counts, "depths": depths,
                   "context_lengths": context_lengths, "repeats": repeats, "warmup": warmup,
                   "remeasure": remeasure}
        hardware = describe_hardware(
            dtype=dtype_name, model_name=name, random_weights=random_weights,
            head_type=getattr(draft, "head_type", head_type), num_heads=int(draft.num_heads),
        )
        for size in sorted(set(int(b) for b in batch_sizes)):
            measured = profile_latency(
                base, draft, engine=engine, graphs=graphs, deadline=deadline, batch_size=size,
                **{k: v for k, v in options.items() if v is not None})
            models[size] = replace(measured, hardware={**measured.hardware, **hardware})
    finally:
        torch.set_num_threads(previous_threads)
    return BatchLatency(models)
