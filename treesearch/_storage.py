"""Optuna storages: in memory, a journal file shared by processes, or a database URL."""

from __future__ import annotations

import os
from typing import Any

from entmtp.core import EntmtpError

JOURNAL_PREFIX = "journal:"


def import_optuna():
    try:
        import optuna
    except ImportError as err:  # pragma: no cover - optuna is a core dependency
        raise EntmtpError("the search needs optuna: pip install 'optuna>=3.4'") from err
    return optuna


def open_storage(storage: str | None) -> Any:
    """``None`` (in memory), an Optuna database URL, or ``journal:PATH`` -> an Optuna storage.

    Raises ``EntmtpError`` when the storage cannot be opened.
    """
    if storage is None:
        return None
    if not isinstance(storage, str) or not storage.strip():
        raise EntmtpError(f"Optuna storage must be a URL or journal:PATH, got {storage!r}")
    optuna = import_optuna()
    if storage.startswith(JOURNAL_PREFIX):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = storage[len(JOURNAL_PREFIX) :]
        if not path:
            raise EntmtpError("journal storage needs a file: use journal:PATH")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise EntmtpError(
                f"cannot open Optuna journal {path!r}: folder {folder} does not exist; create it"
            )
        try:
            return JournalStorage(JournalFileBackend(path))
        except Exception as err:  # noqa: BLE001 - any failure means the journal is unusable
            raise EntmtpError(
                f"cannot open Optuna journal {path!r} ({type(err).__name__}: {err}); "
                "give a writable file path"
            ) from err
    try:
        return optuna.storages.RDBStorage(storage)
    except Exception as err:  # noqa: BLE001 - sqlalchemy raises many kinds
        raise EntmtpError(
            f"cannot open Optuna storage {storage!r} ({type(err).__name__}); use journal:PATH "
            "or a database URL such as sqlite:///study.db"
        ) from err
