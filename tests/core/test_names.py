"""entmtp.core's shared names, the missing-extra line, and that importing it needs no torch."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import requires

import pytest

from entmtp.core import (
    DTYPE_ALIASES,
    DTYPE_NAMES,
    HEAD_TYPES,
    EntmtpError,
    dtype_name,
    missing_extra,
)
from entmtp.core._extras import EXTRA_OF_MODULE


def test_importing_core_imports_no_torch():
    code = "import sys, entmtp.core; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_head_types():
    assert HEAD_TYPES == ("medusa", "hydra")


@pytest.mark.parametrize(("given", "name"), [
    ("bf16", "bfloat16"), ("BFloat16", "bfloat16"), ("fp16", "float16"), ("half", "float16"),
    ("float16", "float16"), ("fp32", "float32"), ("FLOAT32", "float32"),
])
def test_dtype_aliases_name_torch_dtypes(given, name):
    assert dtype_name(given) == name


def test_every_alias_is_a_dtype_name_and_names_itself():
    assert set(DTYPE_ALIASES.values()) == set(DTYPE_NAMES)
    assert all(DTYPE_ALIASES[name] == name for name in DTYPE_NAMES)


def test_an_unknown_dtype_is_a_one_line_error_naming_the_option():
    with pytest.raises(EntmtpError, match=r"^--dtype 'int8': use bf16, fp16 or fp32$"):
        dtype_name("int8", option="--dtype")


def test_the_torch_dtype_map_covers_every_dtype_name():
    torch = pytest.importorskip("torch")
    from entmtp.model import resolve_dtype

    assert {name: resolve_dtype(name) for name in DTYPE_NAMES} == {
        "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16


def test_a_torch_dtype_is_named_by_its_torch_name():
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert dtype_name(dtype) == str(dtype).removeprefix("torch.")
    with pytest.raises(EntmtpError, match="torch.int8"):
        dtype_name(torch.int8)


def test_the_extra_table_matches_the_model_extra_of_the_package():
    model_extra = set()
    for requirement in requires("entmtp") or []:
        if re.search(r"""extra\s*==\s*["']model["']""", requirement):
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
            model_extra.add(name.lower().replace("-", "_"))
    assert model_extra and model_extra == {m for m, e in EXTRA_OF_MODULE.items() if e == "model"}


def test_missing_extra_names_the_pip_install():
    err = ModuleNotFoundError("No module named 'torch.nn'", name="torch.nn")
    assert missing_extra(err) == ("this command needs the model extra (torch is not installed): "
                                  "pip install 'entmtp[model]'")
    assert missing_extra(ModuleNotFoundError("x", name="somethingelse")) is None
    assert missing_extra(ModuleNotFoundError("no name")) is None
    assert missing_extra(ValueError("torch")) is None
