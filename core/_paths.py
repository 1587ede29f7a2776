"""Where entmtp keeps what it caches for the user (dequantized models, prepared datasets)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """$ENTMTP_CACHE, else $XDG_CACHE_HOME/entmtp, else ~/.cache/entmtp."""
    if os.environ.get("ENTMTP_CACHE"):
        return Path(os.environ["ENTMTP_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "entmtp"
