"""Where hp_agent keeps what it builds: one cache folder for models, games and translations."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """hp_agent's cache: ``$HP_AGENT_CACHE``, else ``~/.cache/hp_agent``."""
    override = os.environ.get("HP_AGENT_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "hp_agent"
