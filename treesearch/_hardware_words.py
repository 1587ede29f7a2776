"""A latency model's hardware record in words: what ``report.md`` says about where the steps
were timed, instead of the record's JSON.

Every field is optional (older files lack some, synthetic and imported models have few); a field
this module does not know is left out: the record itself stays in latency.json and bundle.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _plural(count: Any, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _join(values: Any) -> str:
    if isinstance(values, (list, tuple)):
        return ", ".join(str(v) for v in values)
    return str(values)


def _machine(hw: Mapping[str, Any]) -> str | None:
    name = hw.get("device_name") or hw.get("cpu_name")
    if not name:
        return None
    text = str(name)
    if hw.get("device") == "cpu" and hw.get("cpu_signature"):
        text += f" ({hw['cpu_signature']})"
    if hw.get("device") != "cpu":
        return f"{text} (host: {_plural(hw['cpu_count'], 'CPU core')})" if hw.get(
            "cpu_count") else text
    extras = []
    if hw.get("cpu_count"):
        extras.append(_plural(hw["cpu_count"], "CPU core"))
    if hw.get("torch_threads"):
        extras.append(_plural(hw["torch_threads"], "torch thread"))
    return ", ".join([text, *extras])


def _model(hw: Mapping[str, Any]) -> str | None:
    pieces = []
    if hw.get("model"):
        pieces.append(str(hw["model"]) + (" with random weights" if hw.get("random_weights")
                                           else ""))
    if hw.get("dtype"):
        pieces.append(str(hw["dtype"]))
    if hw.get("head_type"):
        heads = f"{hw['num_heads']} {hw['head_type']} heads" if hw.get("num_heads") else \
            f"{hw['head_type']} heads"
        if hw.get("draft_vocab_size"):
            heads += f" drafting over {hw['draft_vocab_size']} tokens"
        if hw.get("topk"):
            heads += f", top-{hw['topk']} each"
        pieces.append(heads)
    return ", ".join(pieces) or None


def _runtime(hw: Mapping[str, Any]) -> str | None:
    pieces = []
    if hw.get("engine"):
        engine = f"{hw['engine']} engine"
        if hw.get("device") == "cuda" and "graphs" in hw:  # a CPU has no graphs to mention
            engine += " with CUDA graphs" if hw["graphs"] else " without CUDA graphs"
        pieces.append(engine)
    if hw.get("attn_implementation"):
        pieces.append(f"{hw['attn_implementation']} attention")
    if hw.get("linear_kernel"):
        pieces.append(f"linear kernel {hw['linear_kernel']}")
    text = ", ".join(pieces)
    versions = ", ".join(f"{name} {hw[name]}" for name in ("torch", "transformers")
                         if hw.get(name))
    return "; ".join(part for part in (text, versions) if part) or None


def _timing(hw: Mapping[str, Any]) -> str | None:
    pieces = []
    if hw.get("repeats"):
        rounds = f"{_plural(hw['repeats'], 'round')} per point"
        if hw.get("warmup"):
            rounds += f" after {hw['warmup']} untimed"
        pieces.append(rounds)
    if hw.get("context_lengths"):
        pieces.append(f"at contexts of {_join(hw['context_lengths'])} tokens")
    text = ", ".join(pieces)
    if hw.get("measured_on"):
        text = f"{text}; measured on {hw['measured_on']}" if text else \
            f"measured on {hw['measured_on']}"
    return text or None


def hardware_lines(hw: Mapping[str, Any]) -> list[str]:
    """Markdown bullets (``- machine: ...``) describing where a latency model's steps were
    timed; one line for a synthetic model or an empty record."""
    kind = str(hw.get("kind", ""))
    if kind.startswith("synthetic"):
        like = kind.removeprefix("synthetic").strip("-").upper()  # "synthetic-cpu": CPU
        return [f"- a synthetic {like + '-like ' if like else ''}model (synthetic, not "
                "measured)"]
    if not hw:
        return ["- unspecified hardware (the latency model records none)"]
    rows = []
    if kind == "imported":
        source = f" from {hw['source']}" if hw.get("source") else ""
        rows.append(("source", f"step times imported{source}, timed in another runtime"))
    rows += [("machine", _machine(hw)), ("model", _model(hw)), ("runtime", _runtime(hw)),
             ("timing", _timing(hw))]
    lines = [f"- {label}: {text}" for label, text in rows if text]
    return lines or ["- unspecified hardware (the latency model records none)"]
