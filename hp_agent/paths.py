"""Where hp_agent keeps what it builds (one cache folder for models, games and translations),
and whether it runs from a source checkout."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hp_agent.files import FolderExistsError, atomic_folder


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
    try:
        with atomic_folder(out_dir) as tmp_dir:
            yield tmp_dir
    except FolderExistsError as error:
        if not (out_dir / "config.json").is_file():
            raise FileExistsError(f"{out_dir} exists and holds no model (it holds: {_contents(out_dir)}); "
                                  "remove it or pick another folder") from error


def _contents(path: Path) -> list[str] | str:
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else "not a folder"


def cached_model_folder(path: Path, build: Callable[[Path], None]) -> Path:
    """``path``, a model folder in hp_agent's cache, built by ``build(folder)`` on first use.

    Concurrent first uses (torchrun ranks, pytest workers) build once: the first takes a lock
    beside ``path`` and builds, the others wait on it and then find the finished folder. The
    cache is hp_agent's own, so a folder there without a ``config.json`` (left by something
    other than a build, which renames a complete folder into place) is set aside and rebuilt.
    """
    if (path / "config.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f".{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "config.json").is_file():
            return path
        if path.exists():
            print(f"{path} holds no model (it holds: {_contents(path)}); rebuilding it", file=sys.stderr, flush=True)
            damaged = Path(tempfile.mkdtemp(prefix=f".{path.name}.damaged-", dir=path.parent))
            path.rename(damaged / path.name)
            shutil.rmtree(damaged, ignore_errors=True)
        with atomic_model_folder(path) as tmp_dir:
            build(tmp_dir)
    return path


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
