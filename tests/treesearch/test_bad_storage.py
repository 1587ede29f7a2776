"""An Optuna journal given as ``--storage journal:PATH`` that cannot be one is refused when it
is opened (before any profiling), in one line: a pipe would block the search forever, a device
or foreign file would fail only after the profile was computed."""

from __future__ import annotations

import os
import stat

import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._storage import open_storage


def _make(kind: str, path):
    if kind == "pipe":
        os.mkfifo(path)
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except OSError as err:
            pytest.skip(f"cannot make a device node here ({err.strerror})")
    elif kind == "folder":
        path.mkdir()
    elif kind == "utf16":
        path.write_bytes('{"a": 1}'.encode("utf-16"))
    elif kind == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00")
    return path


@pytest.mark.parametrize("kind", ["pipe", "device", "folder", "utf16", "binary"])
def test_a_journal_that_cannot_be_one_is_refused_on_open(tmp_path, kind):
    path = _make(kind, tmp_path / "journal.log")
    with pytest.raises(EntmtpError) as info:
        open_storage(f"journal:{path}")
    assert "\n" not in str(info.value) and "journal" in str(info.value)


def test_a_new_or_existing_journal_opens(tmp_path):
    path = tmp_path / "journal.log"
    storage = open_storage(f"journal:{path}")
    from optuna.study import StudyDirection

    storage.create_new_study([StudyDirection.MAXIMIZE], "s")  # writes the first line
    assert open_storage(f"journal:{path}").get_all_studies()[0].study_name == "s"


def test_a_journal_with_a_cut_last_line_is_refused(tmp_path):
    path = tmp_path / "journal.log"
    path.write_bytes(b'{"a": ' + b"9" * 5000 + b"}")  # no newline: the next line would join it
    with pytest.raises(EntmtpError, match="not an Optuna journal"):
        open_storage(f"journal:{path}")
