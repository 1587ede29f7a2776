"""entmtp.calibrate: the calibration pipeline (run folder, profile / latency / search stages,
resume, shards, retarget, demo), task datasets, the profiler over task prompts, and head data and
training.

Names are imported on first use, so ``import entmtp.calibrate`` does not import torch; the
pipeline's offline parts (run folder, search stage, retarget, demo) never do.

Layer 6 of 7. Depends on core, treesearch, model, runtime, evaluation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from entmtp.core import lazy_attributes

if TYPE_CHECKING:
    from ._accuracy import HeadRanks, accuracy_table, head_accuracy, head_ranks
    from ._head_training import TrainArguments, TrainedHeads, train_heads_run
    from ._headdata import (
        DataItem,
        encode_item,
        read_head_data,
        read_head_data_index,
        read_jsonl_items,
        record_trajectories,
        write_head_data,
    )
    from ._pipeline import (
        DEMO_LATENCIES,
        DEMO_SCHEDULE_TRIALS,
        CalibrateArguments,
        Event,
        Progress,
        calibrate,
        check_latency_model,
        command_line,
        demo_run,
        retarget_run,
        search_stage,
        source_run,
    )
    from ._profiler import profile_prompts
    from ._rundir import RunDir, load_acceptance, load_front
    from ._tasks import CODE_INSTRUCTION, TASKS, TaskPrompt, load_prompts
    from ._train import fit_heads
    from ._train_run import train_heads, train_on_trajectories
    from ._trajectories import (
        Trajectory,
        generate_trajectories,
        load_trajectories,
        save_trajectories,
        text_trajectories,
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
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
