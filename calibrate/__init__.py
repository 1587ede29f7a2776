"""entmtp.calibrate: model + heads loading, task datasets, the profiler, head training, and the
calibration pipeline that runs them (run folder, profile / latency / search stages, retarget).

Names are imported on first use, so ``import entmtp.calibrate`` does not import torch; the
pipeline's offline parts (run folder, search stage, retarget, demo) never do.
"""

from importlib import import_module

_EXPORTS = {
    "DataItem": "._headdata",
    "cached_trajectories": "._headdata",
    "check_first_shard": "._headdata",
    "encode_item": "._headdata",
    "read_head_data": "._headdata",
    "read_head_data_index": "._headdata",
    "read_jsonl_items": "._headdata",
    "record_trajectories": "._headdata",
    "trajectories_from_shard": "._headdata",
    "write_head_data": "._headdata",
    "CalibrateArguments": "._pipeline",
    "DEMO_LATENCIES": "._pipeline",
    "DEMO_SCHEDULE_TRIALS": "._pipeline",
    "Event": "._pipeline",
    "Progress": "._pipeline",
    "calibrate": "._pipeline",
    "check_demo_folder": "._pipeline",
    "check_latency_model": "._pipeline",
    "command_line": "._pipeline",
    "demo_run": "._pipeline",
    "latency_stage": "._pipeline",
    "profile_stage": "._pipeline",
    "retarget_run": "._pipeline",
    "run_settings": "._pipeline",
    "search_stage": "._pipeline",
    "source_run": "._pipeline",
    "profile_prompts": "._profiler",
    "resolve_shard": "._profiler",
    "shard_prompts": "._profiler",
    "RunDir": "._rundir",
    "check_front": "._rundir",
    "check_run_arguments": "._rundir",
    "load_acceptance": "._rundir",
    "load_front": "._rundir",
    "record_run_arguments": "._rundir",
    "remove_stale_temp_files": "._rundir",
    "start_afresh": "._rundir",
    "CODE_INSTRUCTION": "._tasks",
    "TASKS": "._tasks",
    "TaskPrompt": "._tasks",
    "load_prompts": "._tasks",
    "HeadRanks": "._accuracy",
    "accuracy_table": "._accuracy",
    "head_accuracy": "._accuracy",
    "head_ranks": "._accuracy",
    "TrainArguments": "._head_training",
    "TrainedHeads": "._head_training",
    "train_heads_run": "._head_training",
    "fit_heads": "._train",
    "train_heads": "._train_run",
    "train_on_trajectories": "._train_run",
    "Trajectory": "._trajectories",
    "generate_trajectories": "._trajectories",
    "load_trajectories": "._trajectories",
    "save_trajectories": "._trajectories",
    "text_trajectories": "._trajectories",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
