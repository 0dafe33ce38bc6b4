"""Where hp_agent keeps what it builds (one cache folder for models, games and translations),
and whether it runs from a source checkout."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    """hp_agent's cache: ``$HP_AGENT_CACHE``, else ``~/.cache/hp_agent``."""
    override = os.environ.get("HP_AGENT_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "hp_agent"


@contextmanager
def atomic_model_folder(out_dir: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``out_dir`` to write a model folder into, then rename it
    to ``out_dir``, so readers never see a half-written model.

    If another builder finished ``out_dir`` first (it holds a ``config.json``), its result is
    kept and this one is discarded; the temporary folder is removed whatever happens.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp_dir
        # mkdtemp (and safetensors) write private modes; a shared cache must be readable.
        for path in (tmp_dir, *tmp_dir.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            # rename(2) replaces an empty directory but refuses a non-empty one.
            tmp_dir.rename(out_dir)
        except OSError as error:
            if not (out_dir / "config.json").is_file():
                raise FileExistsError(f"{out_dir} exists and holds no model; remove it or pick another folder") from error
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


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
