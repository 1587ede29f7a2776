"""Names shared by every package: draft-head types and dtype names."""

from __future__ import annotations

from ._errors import EntmtpError

HEAD_TYPES = ("medusa", "hydra")

# The decoding runtimes (``--engine``; a latency file's ``hardware.engine`` records which one
# was measured): the static-shape engine (Llama family; CUDA graphs on a GPU), the eager decoder
# (any architecture), and "auto", the static engine wherever the model allows it.
STATIC_ENGINE, EAGER_ENGINE = "static", "eager"
ENGINES = ("auto", STATIC_ENGINE, EAGER_ENGINE)

# torch's dtype names: what profiles, latency files and heads folders record.
DTYPE_NAMES = ("float32", "float16", "bfloat16")
# Every spelling a user may give, lower case, to its torch name (the torch dtypes themselves are
# mapped in one place of the model code: entmtp.calibrate.resolve_dtype).
DTYPE_ALIASES = {
    "fp32": "float32", "float32": "float32",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
}


def dtype_name(dtype: object, *, option: str = "dtype") -> str:
    """``dtype`` (a spelling, any case, or a torch dtype) as torch's name (``bf16``,
    ``torch.bfloat16`` -> ``bfloat16``); ``option`` names it in the one-line error."""
    name = DTYPE_ALIASES.get(str(dtype).lower().removeprefix("torch."))
    if name is None:
        raise EntmtpError(f"{option} {dtype!r}: use bf16, fp16 or fp32")
    return name
