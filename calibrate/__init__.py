"""entmtp.calibrate: the calibration pipeline (run folder, profile / latency / search stages,
resume, shards, retarget, demo), task datasets, the profiler over task prompts, and head data and
training.

Names are imported on first use, so ``import entmtp.calibrate`` does not import torch; the
pipeline's offline parts (run folder, search stage, retarget, demo) never do.

Layer 6 of 7. Depends on core, treesearch, model, runtime, evaluation.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._accuracy import (
        HeadRanks as HeadRanks,
    )
    from ._accuracy import (
        accuracy_table as accuracy_table,
    )
    from ._accuracy import (
        head_accuracy,
    )
    from ._accuracy import (
        head_ranks as head_ranks,
    )
    from ._head_training import TrainArguments, TrainedHeads, train_heads_run
    from ._headdata import (
        DataItem as DataItem,
    )
    from ._headdata import (
        encode_item as encode_item,
    )
    from ._headdata import (
        read_head_data,
        write_head_data,
    )
    from ._headdata import (
        read_head_data_index as read_head_data_index,
    )
    from ._headdata import (
        read_jsonl_items as read_jsonl_items,
    )
    from ._headdata import (
        record_trajectories as record_trajectories,
    )
    from ._pipeline import (
        DEMO_LATENCIES as DEMO_LATENCIES,
    )
    from ._pipeline import (
        DEMO_SCHEDULE_TRIALS as DEMO_SCHEDULE_TRIALS,
    )
    from ._pipeline import (
        CalibrateArguments,
        Event,
        Progress,
        calibrate,
        demo_run,
        retarget_run,
    )
    from ._pipeline import (
        check_latency_model as check_latency_model,
    )
    from ._pipeline import (
        command_line as command_line,
    )
    from ._pipeline import (
        search_stage as search_stage,
    )
    from ._pipeline import (
        source_run as source_run,
    )
    from ._profiler import profile_prompts
    from ._rundir import RunDir
    from ._rundir import load_acceptance as load_acceptance
    from ._rundir import load_front as load_front
    from ._tasks import CODE_INSTRUCTION as CODE_INSTRUCTION
    from ._tasks import TASKS, TaskPrompt, load_prompts
    from ._train import fit_heads
    from ._train_run import train_heads
    from ._train_run import train_on_trajectories as train_on_trajectories
    from ._trajectories import (
        Trajectory,
        generate_trajectories,
    )
    from ._trajectories import (
        load_trajectories as load_trajectories,
    )
    from ._trajectories import (
        save_trajectories as save_trajectories,
    )
    from ._trajectories import (
        text_trajectories as text_trajectories,
    )

__all__ = [
    "CalibrateArguments",
    "calibrate",
    "retarget_run",
    "demo_run",
    "RunDir",
    "Event",
    "Progress",
    "TASKS",
    "TaskPrompt",
    "load_prompts",
    "profile_prompts",
    "write_head_data",
    "read_head_data",
    "TrainArguments",
    "train_heads_run",
    "TrainedHeads",
    "train_heads",
    "fit_heads",
    "head_accuracy",
    "Trajectory",
    "generate_trajectories",
]

# What entmtp's upper layers and bench scripts import from this package besides __all__: not a
# stable API.
_LAYER_API = [
    "CODE_INSTRUCTION",
    "DEMO_LATENCIES",
    "DEMO_SCHEDULE_TRIALS",
    "DataItem",
    "HeadRanks",
    "accuracy_table",
    "check_latency_model",
    "command_line",
    "encode_item",
    "head_ranks",
    "load_acceptance",
    "load_front",
    "load_trajectories",
    "read_head_data_index",
    "read_jsonl_items",
    "record_trajectories",
    "save_trajectories",
    "search_stage",
    "source_run",
    "text_trajectories",
    "train_on_trajectories",
]

# module -> the names above it defines, imported on first use
_LAZY = {
    "._accuracy": ("HeadRanks", "accuracy_table", "head_accuracy", "head_ranks"),
    "._head_training": ("TrainArguments", "TrainedHeads", "train_heads_run"),
    "._headdata": (
        "DataItem",
        "encode_item",
        "read_head_data",
        "read_head_data_index",
        "read_jsonl_items",
        "record_trajectories",
        "write_head_data",
    ),
    "._pipeline": (
        "DEMO_LATENCIES",
        "DEMO_SCHEDULE_TRIALS",
        "CalibrateArguments",
        "Event",
        "Progress",
        "calibrate",
        "check_latency_model",
        "command_line",
        "demo_run",
        "retarget_run",
        "search_stage",
        "source_run",
    ),
    "._profiler": ("profile_prompts",),
    "._rundir": ("RunDir", "load_acceptance", "load_front"),
    "._tasks": ("CODE_INSTRUCTION", "TASKS", "TaskPrompt", "load_prompts"),
    "._train": ("fit_heads",),
    "._train_run": ("train_heads", "train_on_trajectories"),
    "._trajectories": (
        "Trajectory",
        "generate_trajectories",
        "load_trajectories",
        "save_trajectories",
        "text_trajectories",
    ),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)


def __dir__() -> list[str]:
    return sorted(__all__)
