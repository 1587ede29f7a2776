"""entmtp.calibrate: model + heads loading, task datasets, the profiler, head training, and the
calibration pipeline that runs them (run folder, profile / latency / search stages, retarget).

Names are imported on first use, so ``import entmtp.calibrate`` does not import torch; the
pipeline's offline parts (run folder, search stage, retarget, demo) never do.
"""

from importlib import import_module

_EXPORTS = {
    "BaseModel": "._model",
    "load_base_model": "._model",
    "model_fingerprint": "._model",
    "resolve_dtype": "._model",
    "random_model": "._random_model",
    "TASKS": "._tasks",
    "CODE_INSTRUCTION": "._tasks",
    "TaskPrompt": "._tasks",
    "load_prompts": "._tasks",
    "cache_keyword": "._cache_keyword",
    "project_rows": "._row_gemm",
    "linear_kernel": "._row_gemm",
    "row_kernel": "._row_gemm",
    "entropy_from_logits": "._stats",
    "topk_ranks": "._stats",
    "profile_prompts": "._profiler",
    "profile_trajectories": "._profiler",
    "shard_prompts": "._profiler",
    "resolve_shard": "._profiler",
    "greedy_generate": "._greedy",
    "greedy_steps": "._greedy",
    "DraftHeads": "._heads",
    "MedusaHeads": "._heads",
    "HydraHeads": "._heads",
    "load_heads": "._heads",
    "draft_columns": "._heads",
    "draft_projection_weight": "._heads",
    "draft_token_ids": "._heads",
    "draft_vocab_problem": "._heads",
    "MIN_DRAFT_VOCAB": "._heads",
    "check_draft_vocab_size": "._heads",
    "read_heads_config": "._heads",
    "target_token_counts": "._draft_vocab",
    "frequent_tokens": "._draft_vocab",
    "draft_vocab_coverage": "._draft_vocab",
    "new_heads": "._heads",
    "save_heads": "._heads",
    "train_heads": "._train",
    "train_on_trajectories": "._train",
    "Trajectory": "._train",
    "fit_heads": "._train",
    "generate_trajectories": "._train",
    "load_trajectories": "._train",
    "save_trajectories": "._train",
    "text_trajectories": "._train",
    "accuracy_table": "._train",
    "head_accuracy": "._train",
    "head_ranks": "._train",
    "HeadRanks": "._train",
    "check_heads_target": "._heads",
    # head data recorded for training
    "DataItem": "._headdata",
    "encode_item": "._headdata",
    "read_head_data": "._headdata",
    "read_head_data_index": "._headdata",
    "read_jsonl_items": "._headdata",
    "record_trajectories": "._headdata",
    "cached_trajectories": "._headdata",
    "trajectories_from_shard": "._headdata",
    "check_first_shard": "._headdata",
    "write_head_data": "._headdata",
    # the model and heads a command names, checked before the slow load
    "ENGINES": "._loading",
    "SHIPPED_HEADS": "._loading",
    "check_device": "._loading",
    "check_device_and_dtype": "._loading",
    "check_engine": "._loading",
    "check_head_type": "._loading",
    "load_base": "._loading",
    "load_heads_for": "._loading",
    "load_model_and_heads": "._loading",
    "quiet_transformers": "._loading",
    "resolve_dtype_name": "._loading",
    "resolve_heads": "._loading",
    "shipped_heads_path": "._loading",
    # entmtp latency's measurement
    "describe_hardware": "._measure",
    "load_for_latency": "._measure",
    "measure_latency": "._measure",
    # the run folder
    "RunDir": "._rundir",
    "check_front": "._rundir",
    "check_run_arguments": "._rundir",
    "load_acceptance": "._rundir",
    "load_front": "._rundir",
    "record_run_arguments": "._rundir",
    "remove_stale_temp_files": "._rundir",
    "start_afresh": "._rundir",
    # the pipeline
    "CalibrateArguments": "._pipeline",
    "Event": "._pipeline",
    "Progress": "._pipeline",
    "calibrate": "._pipeline",
    "check_demo_folder": "._pipeline",
    "check_latency_model": "._pipeline",
    "command_line": "._pipeline",
    "DEMO_LATENCIES": "._pipeline",
    "DEMO_SCHEDULE_TRIALS": "._pipeline",
    "demo_run": "._pipeline",
    "latency_stage": "._pipeline",
    "profile_stage": "._pipeline",
    "retarget_run": "._pipeline",
    "run_settings": "._pipeline",
    "search_stage": "._pipeline",
    "source_run": "._pipeline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
