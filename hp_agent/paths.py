"""Where hp_agent keeps what it builds (one cache folder for models, games and translations),
and whether it runs from a source checkout."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """hp_agent's cache: ``$HP_AGENT_CACHE``, else ``~/.cache/hp_agent``."""
    override = os.environ.get("HP_AGENT_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "hp_agent"


def source_checkout() -> Path | None:
    """The source checkout hp_agent runs from (the folder whose ``pyproject.toml`` sits beside
    the ``hp_agent`` package), or None for an installed package (a wheel in site-packages).
    Only development conveniences may use it; an installed package finds its data by setting."""
    root = Path(__file__).resolve().parent.parent
    if root.name in ("site-packages", "dist-packages"):
        return None
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or 'name = "hp_agent"' not in pyproject.read_text():
        return None
    return root
