"""Batch-size schedules for the serving runtimes that switch the draft length by batch size.

vLLM and TensorRT-LLM can draft a different number of tokens at each batch size, from a table
the user gives. This module writes that table from a profile: at each measured batch size the
best chain (``_chain.best_chain``: every chain length replayed on the profile) under that batch
size's latency model, or length 0 ("do not draft") when the step that drafts nothing replays
faster than every chain.

**Batch sizes.** The latency model of batch size ``B`` prices one step of ``B`` sequences, each
accepting its own tokens, so the batch decodes ``B`` times the per-sequence rate and the
fastest chain for one sequence is the fastest for the batch. A batch size between two measured
ones is priced by the next measured size up (``BatchLatency.for_batch``), so it gets that
size's length here too: measured size ``m_i`` owns the range ``m_{i-1} + 1 .. m_i`` (the
smallest owns ``1 .. m_0``), the ranges cover ``1`` to the largest measured size, and
neighbouring ranges of the same length merge. Length 0 is priced as the latency model's
zero-node step (in an imported runtime's file, its step that drafts nothing), the figure
``ChainChoice.plain_tokens_per_second`` holds; a tie keeps the chain
(``ChainChoice.plain_is_faster`` is strict).

Each runtime's rule, from its source (the tests re-derive each rule independently):

- ``vllm``: ``num_speculative_tokens_per_batch_size`` in ``--speculative-config``, a list of
  ``[first, last, K]`` entries over inclusive batch-size ranges (vLLM PR #32374; its review
  replaced the string keys ``{"1-16": 3}`` of earlier drafts by these lists). vLLM 0.24.0 is
  the first release that reads it (0.23.0 has no such field); 0.24.0 and 0.34.0 have the same
  ``vllm/v1/spec_decode/dynamic/utils.py``: ranges non-overlapping, the first starting at 1,
  ``K >= 0``; the scheduler (``vllm/v1/core/sched/scheduler.py``) looks ``K`` up by the number
  of scheduled requests in a dense table where a batch between two ranges keeps the ``K``
  before it, one past the last range keeps the last ``K``, and every ``K`` is capped at
  ``num_speculative_tokens`` (so that is the largest ``K`` here). ``K = 0`` drafts nothing
  (``llm_base_proposer.py``: "Dynamic SD decided K=0"). Which methods follow it
  (``gpu_model_runner.py`` 0.24.0): the proposers that take the scheduled ``K`` (eagle,
  eagle3, mtp, dflash, draft_model through ``llm_base_proposer``; ngram asserts ``K <= k``);
  the medusa, suffix, ngram_gpu and extract_hidden_states proposers assert ``K`` equals the
  configured count, so a schedule below it fails there. A schedule switches ``cudagraph_mode``
  from FULL to PIECEWISE (``config/vllm.py`` 0.24.0), and 0.34.0 drops it when
  ``--data-parallel-size`` is above 1. ``SpeculativeConfig`` forbids unknown keys, so the
  header cannot be a field: it is returned beside the settings (YAML comments in
  ``yaml_text``, a ``vllm serve --config`` file).
- ``trtllm``: ``draft_len_schedule`` in the speculative config, a mapping batch size -> draft
  length (TensorRT-LLM PRs #8194 and #10860, the latter merged 2026-03-13; checked against
  ``tensorrt_llm/_torch/speculative/utils.py`` ``get_draft_len_for_batch_size`` and
  ``tensorrt_llm/llmapi/llm_args.py`` ``DecodingBaseConfig`` on main after #10860). A batch of
  ``b`` sequences drafts the length of the smallest key ``>= b``, and nothing past the largest
  key; the validator wants keys ``>= 1``, lengths ``>= 0``, the smallest key's length equal to
  ``max_draft_len`` and no length above it, and no ``max_concurrency`` beside it. The stage-1
  code of #8194 read keys as lower bounds instead ("largest key <= b", key 1 required): code of
  that stage alone would misread this table. The first release that reads the field was not
  established (PyPI's ``tensorrt-llm`` is a stub for NVIDIA's own index, out of reach here).
  Only the PyTorch backend reads it, for the modes whose ``support_dynamic_draft_len()`` holds
  (one-model Eagle3 first; MTP, MTP-Eagle, PARD, DFlash, draft-target one-model and SA in later
  code); ``MedusaDecodingConfig.supports_backend`` excludes the PyTorch backend, so Medusa never
  reads it. The config model forbids unknown keys too: the header is returned beside it.

**Heads.** Medusa heads are refused for both runtimes (their Medusa paths cannot follow a
schedule). Neither runtime has a Hydra drafter: as the ``vllm-chain`` export does, the schedule
is written for the chain drafter that serves the heads, and the header says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from entmtp.core import EntmtpError

from ._chain import ChainChoice, best_chain
from ._latency import LatencyModel
from ._profile import Profile

BATCH_SCHEDULE_FORMATS = ("vllm", "trtllm")

VLLM_SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
VLLM_MAX_KEY = "num_speculative_tokens"
TRTLLM_SCHEDULE_KEY = "draft_len_schedule"
TRTLLM_MAX_KEY = "max_draft_len"

SCHEDULE_CHECKED_AGAINST = {
    "vllm": "vLLM 0.24.0 (the first release that reads num_speculative_tokens_per_batch_size, "
            "PR #32374; 0.23.0 has none) and 0.34.0: vllm/v1/spec_decode/dynamic/utils.py, "
            "vllm/v1/core/sched/scheduler.py",
    "trtllm": "TensorRT-LLM main after PR #10860 (merged 2026-03-13): tensorrt_llm/_torch/"
              "speculative/utils.py get_draft_len_for_batch_size, tensorrt_llm/llmapi/"
              "llm_args.py DecodingBaseConfig; the first release that reads draft_len_schedule "
              "was not established",
}
RUNTIME_NAMES = {"vllm": "vLLM", "trtllm": "TensorRT-LLM"}

_MEDUSA_REFUSAL = {
    "vllm": (
        "vLLM's medusa proposer asserts that every step drafts num_speculative_tokens "
        "(vllm/v1/spec_decode/medusa.py, 0.24.0; 0.34.0 has no medusa method), so Medusa heads "
        "cannot follow num_speculative_tokens_per_batch_size: export one chain length for them "
        "instead (--format vllm-chain)"
    ),
    "trtllm": (
        "TensorRT-LLM runs Medusa on its TensorRT engine backend only "
        "(MedusaDecodingConfig.supports_backend excludes pytorch) and only the PyTorch backend "
        "reads draft_len_schedule, so Medusa heads cannot follow it: export their tree for a "
        "fixed draft length instead (--format trtllm)"
    ),
}


@dataclass(frozen=True)
class BatchScheduleExport:
    """A runtime's batch schedule: its settings, and the header its config model has no field
    for."""

    runtime: str  # "vllm" or "trtllm"
    section: str  # the config file's key the settings nest under
    config: dict[str, Any]  # the runtime's own keys, ready for its speculative config
    header: tuple[str, ...]  # what the schedule is, the rule it was checked against, notes

    def comment(self) -> str:
        return "".join(f"# {line}\n" for line in self.header)

    def yaml_text(self) -> str:
        """A commented YAML file with the settings nested under ``section``."""
        lines = [f"{self.section}:"]
        lines += [f"  {key}: {_yaml_value(value)}" for key, value in self.config.items()]
        return self.comment() + "\n".join(lines) + "\n"


def _yaml_value(value: Any) -> str:
    if isinstance(value, dict):  # flow mapping with the keys as YAML integers, not strings
        return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


# -- the best chain per batch size ----------------------------------------------------------------
def _batch_size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EntmtpError(f"{what} {value!r} is not a batch size: use integers >= 1")
    return value


def best_chain_by_batch(
    profile: Profile,
    latency_by_batch: Mapping[int, LatencyModel],
    *,
    max_length: int | None = None,
) -> dict[int, ChainChoice]:
    """The best chain at each measured batch size, ascending; length 0 where the step that
    drafts nothing replays faster than every chain of 1..``max_length`` nodes."""
    if not latency_by_batch:
        raise EntmtpError("the batch schedule needs the latency model of at least one batch size")
    choices: dict[int, ChainChoice] = {}
    for size in sorted(_batch_size(b, "latency model of") for b in latency_by_batch):
        latency = latency_by_batch[size]
        if not isinstance(latency, LatencyModel):
            raise EntmtpError(f"batch size {size}: {type(latency).__name__} is not a "
                              "LatencyModel")
        choice = best_chain(profile, latency, max_length=max_length)
        if choice.plain_is_faster:
            choice = _no_draft(choice)
        choices[size] = choice
    return choices


def _no_draft(chain: ChainChoice) -> ChainChoice:
    """Length 0 priced by the replay ``chain`` was compared with: every step emits one token,
    and every length replays the same tokens, so the speedups share one autoregressive rate."""
    plain = chain.plain_tokens_per_second
    return ChainChoice(
        length=0,
        mean_accept_length=1.0,
        tokens_per_second=plain,
        speedup_vs_autoregressive=chain.speedup_vs_autoregressive * plain
        / chain.tokens_per_second,
        plain_tokens_per_second=plain,
    )


def batch_ranges(lengths: Mapping[int, int]) -> list[tuple[int, int, int]]:
    """``(first, last, length)`` over inclusive batch-size ranges covering 1..the largest size.

    ``lengths`` maps each measured batch size to its draft length; a size between two measured
    ones takes the next measured size's length (module doc), and neighbouring ranges of the
    same length merge.
    """
    if not lengths:
        raise EntmtpError("the batch schedule needs the draft length of at least one batch size")
    ranges: list[tuple[int, int, int]] = []
    first = 1
    for size in sorted(_batch_size(b, "draft length of") for b in lengths):
        length = lengths[size]
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise EntmtpError(f"batch size {size}: draft length {length!r} is not an integer "
                              ">= 0")
        if ranges and ranges[-1][2] == length:
            ranges[-1] = (ranges[-1][0], size, length)
        else:
            ranges.append((first, size, length))
        first = size + 1
    return ranges


# -- the runtimes -----------------------------------------------------------------------------
def _checked_choices(choices: Mapping[int, ChainChoice], runtime: str, head_type: str
                     ) -> list[tuple[int, int, int]]:
    if head_type == "medusa":
        raise EntmtpError(_MEDUSA_REFUSAL[runtime])
    for size, choice in choices.items():
        if not isinstance(choice, ChainChoice):
            raise EntmtpError(f"batch size {size!r}: {type(choice).__name__} is not a "
                              "ChainChoice")
    ranges = batch_ranges({size: choice.length for size, choice in choices.items()})
    if all(length == 0 for _, _, length in ranges):
        raise EntmtpError(
            f"plain decoding is fastest at every measured batch size (1..{ranges[-1][1]}): "
            f"there is nothing for {RUNTIME_NAMES[runtime]} to draft; serve without a "
            "speculative config on that hardware"
        )
    return ranges


def _choice_lines(choices: Mapping[int, ChainChoice]) -> list[str]:
    lines = []
    for size in sorted(choices):
        c = choices[size]
        what = ("no draft" if c.length == 0
                else f"{c.length} draft token" + ("s" if c.length > 1 else ""))
        lines.append(
            f"batch {size}: {what}, predicted accept length {c.mean_accept_length:.3f}, "
            f"{c.tokens_per_second:.2f} tokens/s per sequence "
            f"({size * c.tokens_per_second:.2f} for the batch), "
            f"{c.speedup_vs_autoregressive:.3f}x plain decoding"
        )
    return lines


def _common_header(runtime: str, source: str, ranges: list[tuple[int, int, int]]
                   ) -> list[str]:
    return [
        f"entmtp batch schedule ({runtime}) of {source}: the best chain per batch-size range, "
        f"batch sizes 1..{ranges[-1][1]}, replayed on the profile under each measured batch "
        "size's latency model",
        f"checked against {SCHEDULE_CHECKED_AGAINST[runtime]}",
        "a batch size between two measured ones takes the next measured size's length (the "
        "latency model of the next size up prices it)",
    ]


def _head_note(runtime: str, head_type: str, section: str, drafter_keys: str) -> str:
    return (f"{RUNTIME_NAMES[runtime]} has no {head_type} drafter: the schedule is for the "
            f"chain drafter that serves these heads; add its {drafter_keys} under {section}")


def vllm_batch_schedule(
    choices: Mapping[int, ChainChoice], head_type: str, *, source: str = "a profile"
) -> BatchScheduleExport:
    """vLLM's ``num_speculative_tokens_per_batch_size`` with ``num_speculative_tokens`` its
    largest ``K``."""
    ranges = _checked_choices(choices, "vllm", head_type)
    largest = max(length for _, _, length in ranges)
    config: dict[str, Any] = {
        VLLM_MAX_KEY: largest,
        VLLM_SCHEDULE_KEY: [[first, last, length] for first, last, length in ranges],
    }
    header = [
        *_common_header("vllm", source, ranges),
        "rule: [first, last, K] over inclusive batch-size ranges, the first starting at 1; a "
        "batch between two ranges keeps the K before it and one past the last range keeps the "
        "last K; every K is capped at num_speculative_tokens; K = 0 drafts nothing",
        f"batch sizes above {ranges[-1][1]} were not measured: vLLM keeps K = {ranges[-1][2]} "
        "there",
        "followed by the drafters whose proposer takes the scheduled K (eagle, eagle3, mtp, "
        "dflash, draft_model, ngram); the medusa, suffix, ngram_gpu and extract_hidden_states "
        "proposers assert a fixed K (vLLM 0.24.0)",
        _head_note("vllm", head_type, "speculative-config", "method and model"),
        "a schedule switches cudagraph_mode from FULL to PIECEWISE (vLLM 0.24.0): time the "
        "latency model with it on; vLLM 0.34.0 drops it with --data-parallel-size above 1",
        *_choice_lines(choices),
        "use: vllm serve MODEL --config THIS_FILE (YAML), or the speculative-config object "
        "as --speculative-config JSON",
    ]
    return BatchScheduleExport("vllm", "speculative-config", config, tuple(header))


def trtllm_draft_len_schedule(
    choices: Mapping[int, ChainChoice], head_type: str, *, source: str = "a profile"
) -> BatchScheduleExport:
    """TensorRT-LLM's ``draft_len_schedule`` (each range's last batch size -> its length) with
    ``max_draft_len`` the first range's length."""
    ranges = _checked_choices(choices, "trtllm", head_type)
    first_last, first_length = ranges[0][1], ranges[0][2]
    if first_length == 0:
        raise EntmtpError(
            f"plain decoding is fastest at batch sizes 1..{first_last} but not at every larger "
            "one, and TensorRT-LLM's schedule starts at max_draft_len > 0 (llm_args.py: the "
            "smallest key's length equals max_draft_len): export the vLLM schedule instead"
        )
    longer = next(((f, last, n) for f, last, n in ranges if n > first_length), None)
    if longer is not None:
        raise EntmtpError(
            f"the best chain has {longer[2]} nodes at batch sizes {longer[0]}..{longer[1]} but "
            f"{first_length} at 1..{first_last}, and TensorRT-LLM allows no length above the "
            "smallest key's (llm_args.py: draft_len_schedule[smallest key] == max_draft_len >= "
            f"every length): search the chains with max_length={first_length}"
        )
    config: dict[str, Any] = {
        TRTLLM_MAX_KEY: first_length,
        TRTLLM_SCHEDULE_KEY: {last: length for _, last, length in ranges},
    }
    header = [
        *_common_header("trtllm", source, ranges),
        "rule: a batch of b sequences drafts the length of the smallest key >= b and nothing "
        "past the largest key; the smallest key's length equals max_draft_len and none is "
        "larger; max_concurrency must be unset beside it; the stage-1 code of PR #8194 read "
        "keys as lower bounds and misreads this table",
        f"batch sizes above {ranges[-1][1]} were not measured: TensorRT-LLM drafts nothing "
        "there",
        "read by the PyTorch backend for the modes whose support_dynamic_draft_len() holds "
        "(one-model Eagle3; MTP, MTP-Eagle, PARD, DFlash, draft-target one-model and SA in "
        "later code); Medusa runs on the TensorRT engine backend, which does not read it",
        _head_note("trtllm", head_type, "speculative_config",
                   "decoding_type and speculative_model"),
        *_choice_lines(choices),
        "use: the speculative_config section of the YAML given to trtllm-serve or "
        "trtllm-bench with --extra_llm_api_options",
    ]
    return BatchScheduleExport("trtllm", "speculative_config", config, tuple(header))
