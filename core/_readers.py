"""Reading the files entmtp is given or left behind: one discipline for every reader.

Each way a file can be wrong (missing, a folder or a device, unreadable, too large, binary or
UTF-16, empty, not JSON, nested deeper than any entmtp file, an integer Python will not convert,
NaN or Infinity, the wrong top-level type) becomes one ``EntmtpError`` line:
``<source>: <what is wrong>: <the fix>``, where ``source`` names the kind of file and its path
(``"latency file runs/code/latency.json"``). Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._errors import EntmtpError

MAX_FILE_BYTES = 1 << 30  # no JSON or JSONL file entmtp reads comes near a gigabyte
MAX_NESTING = 64  # entmtp's own files nest a few levels; deeper input would exhaust recursion
MAX_INT_BITS = 64  # counts, ids and sizes in entmtp files fit in 64 bits
MAX_SHOWN = 120  # characters of an offending value quoted in an error

_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16",
}


class NonFinite:
    """Stands in for a NaN/Infinity literal until :func:`check_values` reports where it is."""

    def __init__(self, literal: str) -> None:
        self.literal = literal


def short(text: str) -> str:
    """``text`` on one line, cut to at most ``MAX_SHOWN`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def field_name(parts: Sequence[str | int]) -> str:
    """``("trees", 0, "paths")`` -> ``"trees[0].paths"``."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _join(*parts: str) -> str:
    return ": ".join(p for p in parts if p)


# -- bytes and text ---------------------------------------------------------------------------
def read_bytes(path: str | os.PathLike, *, source: str, fix: str = "",
               limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``), or one line saying why not."""
    path = Path(path).expanduser()
    info = check_regular_file(path, source=source, fix=fix)
    if info.st_size > limit:
        raise EntmtpError(_join(f"{source} is {info.st_size} bytes, more than the {limit} an "
                                "entmtp file can be", fix or "check the path"))
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise EntmtpError(_join(f"{source} cannot be read", err.strerror or str(err), fix)) from err
    if len(data) > limit:  # grew while being read
        raise EntmtpError(_join(f"{source} is larger than the {limit} bytes an entmtp file can be",
                                fix))
    return data


def check_regular_file(path: str | os.PathLike, *, source: str, fix: str = "") -> os.stat_result:
    """The stat of ``path`` if it is a regular file (links followed), else one line saying why
    not: missing, a folder, a device, pipe or socket (opening a pipe would wait forever)."""
    path = Path(path).expanduser()
    try:
        info = path.stat()
    except FileNotFoundError as err:
        raise EntmtpError(_join(f"{source} does not exist", fix or "check the path")) from err
    except NotADirectoryError as err:
        raise EntmtpError(_join(f"{source} does not exist (a parent is a file)",
                                fix or "check the path")) from err
    except OSError as err:
        raise EntmtpError(_join(f"{source} cannot be read", err.strerror or str(err), fix)) from err
    if stat.S_ISDIR(info.st_mode):
        raise EntmtpError(_join(f"{source} is a folder", fix or "give the file itself"))
    if not stat.S_ISREG(info.st_mode):
        raise EntmtpError(_join(f"{source} is not a regular file (a device, pipe or socket)",
                                fix or "give a file"))
    return info


def decode_text(data: bytes | str, *, source: str, fix: str = "") -> str:
    """UTF-8 text (a UTF-8 byte-order mark is dropped); binary and UTF-16/32 are refused."""
    if isinstance(data, str):
        return data
    for bom, name in _BOMS.items():
        if data.startswith(bom):
            raise EntmtpError(_join(f"{source}: not UTF-8 text: it is {name}",
                                    "save it as UTF-8" + (f", or {fix}" if fix else "")))
    if b"\x00" in data[:4096]:
        raise EntmtpError(_join(f"{source}: not UTF-8 text: it holds NUL bytes (binary data)",
                                fix or "give a UTF-8 text file"))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise EntmtpError(_join(f"{source}: not UTF-8 text (byte {err.start})",
                                fix or "give a UTF-8 text file")) from err


def read_text(path: str | os.PathLike, *, source: str, fix: str = "",
              limit: int = MAX_FILE_BYTES) -> str:
    return decode_text(read_bytes(path, source=source, fix=fix, limit=limit), source=source,
                       fix=fix)


# -- JSON -------------------------------------------------------------------------------------
def parse_json(text: str | bytes, *, source: str, fix: str = "",
               expect: type | tuple[type, ...] | None = dict,
               nan_as_null: bool = False) -> Any:
    """Parse JSON text and check it with :func:`check_values`; ``expect``: the top-level type.
    ``nan_as_null``: read NaN/Infinity literals as null instead of refusing them (for files
    whose numbers are informational, written before entmtp wrote them as null)."""
    text = decode_text(text, source=source, fix=fix)
    if not text.strip():
        raise EntmtpError(_join(f"{source}: the file is empty", fix))
    try:
        obj = json.loads(text, parse_constant=(lambda _: None) if nan_as_null else NonFinite)
    except json.JSONDecodeError as err:
        raise EntmtpError(_join(
            f"{source}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}",
            fix)) from err
    except RecursionError as err:
        raise EntmtpError(_join(f"{source}: JSON nested too deeply", fix)) from err
    except ValueError as err:  # an integer literal longer than Python converts (4300 digits)
        what = ("not a valid file: an integer literal is too long (thousands of digits)"
                if "digits" in str(err)
                else f"not a valid file: {short(str(err))}")
        raise EntmtpError(_join(f"{source}: {what}", fix)) from err
    check_values(obj, source=source, fix=fix)
    if expect is not None and not isinstance(obj, expect):
        kinds = expect if isinstance(expect, tuple) else (expect,)
        wanted = " or ".join(_JSON_KIND.get(k, k.__name__) for k in kinds)
        raise EntmtpError(_join(
            f"{source}: the top level is a {_kind(obj)}, expected {wanted}", fix))
    return obj


def read_json(path: str | os.PathLike, *, source: str, fix: str = "",
              expect: type | tuple[type, ...] | None = dict, limit: int = MAX_FILE_BYTES,
              nan_as_null: bool = False) -> Any:
    """Read, decode, parse and check one JSON file (see the module doc)."""
    return parse_json(read_bytes(path, source=source, fix=fix, limit=limit), source=source,
                      fix=fix, expect=expect, nan_as_null=nan_as_null)


def read_jsonl(path: str | os.PathLike, *, source: str, fix: str = "",
               expect: type | tuple[type, ...] | None = dict,
               limit: int = MAX_FILE_BYTES) -> list[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of a JSON Lines file."""
    return parse_jsonl(read_text(path, source=source, fix=fix, limit=limit), source=source,
                       fix=fix, expect=expect)


def parse_jsonl(text: str | bytes, *, source: str, fix: str = "",
                expect: type | tuple[type, ...] | None = dict) -> list[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of JSON Lines text."""
    text = decode_text(text, source=source, fix=fix)
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            rows.append((number, parse_json(line, source=f"{source} line {number}", fix=fix,
                                            expect=expect)))
    return rows


_JSON_KIND = {dict: "a JSON object", list: "a JSON list", str: "a string", int: "an integer",
              float: "a number", bool: "true/false"}


def _kind(obj: object) -> str:
    if obj is None:
        return "null"
    return {dict: "object", list: "list"}.get(type(obj), type(obj).__name__)


def check_values(obj: object, *, source: str, fix: str = "") -> None:
    """Refuse NaN/Infinity, integers beyond 64 bits and nesting deeper than ``MAX_NESTING``,
    naming the field; iterative, so it cannot itself run out of recursion."""
    stack: list[tuple[object, tuple[str | int, ...]]] = [(obj, ())]
    while stack:
        value, where = stack.pop()
        if len(where) > MAX_NESTING:
            raise EntmtpError(_join(f"{source}: {field_name(where[:3])}...: JSON nested too "
                                    f"deeply (over {MAX_NESTING} levels)", fix))
        if isinstance(value, NonFinite):
            raise EntmtpError(_join(f"{source}: {field_name(where)}: {value.literal} is not "
                                    "allowed: numbers must be finite", fix))
        if isinstance(value, float) and not math.isfinite(value):
            raise EntmtpError(_join(f"{source}: {field_name(where)}: {value} is not allowed: "
                                    "numbers must be finite", fix))
        if (isinstance(value, int) and not isinstance(value, bool)
                and value.bit_length() > MAX_INT_BITS):
            raise EntmtpError(_join(f"{source}: {field_name(where)}: an integer of "
                                    f"{len(str(abs(value)))} digits is too large", fix))
        if isinstance(value, dict):
            stack.extend((v, (*where, str(k))) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(value))


# -- fields -----------------------------------------------------------------------------------
def require(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], *, source: str,
            fix: str = "", where: str = "") -> Any:
    """``obj[key]`` if present and of ``kind`` (a bool is never a number), else one line."""
    name = f"{where}.{key}" if where else key
    if key not in obj:
        raise EntmtpError(_join(f"{source}: {name} is missing", fix))
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    numeric = any(k in (int, float) for k in kinds)
    if not isinstance(value, kinds) or (numeric and isinstance(value, bool)):
        wanted = " or ".join(_JSON_KIND.get(k, k.__name__) for k in kinds)
        raise EntmtpError(_join(f"{source}: {name}: {short(json.dumps(value))} is not {wanted}",
                                fix))
    return value
