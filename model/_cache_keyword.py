"""The KV-cache keyword of a transformers model's ``forward``, across transformers versions.

transformers 5.24 renamed the argument that carries the KV cache from ``past_key_values`` to
``cache`` (and the output field likewise). An unknown keyword is swallowed by the models'
``**kwargs``, so passing the wrong one silently runs without the cache: look it up instead.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


def cache_keyword(module: Any) -> str:
    """``"cache"`` where ``module.forward`` takes it, else ``"past_key_values"``."""
    return _keyword_of(type(module))


@functools.cache
def _keyword_of(module_type: type) -> str:
    parameters = inspect.signature(module_type.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a model output carries (``cache`` or, before 5.24, ``past_key_values``)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
