"""Files that a kill never leaves half-written, and JSONL reading: the one writer every module uses.

Each write goes to a temporary sibling with a unique name (two processes writing the same
path never share one), is flushed to disk and renamed over the target, so a reader sees
the old version or the new one, never a mix. A failed write removes its temporary file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """An open temporary sibling of ``path`` (``mode`` "w" for UTF-8 text, "wb" for bytes)
    that replaces ``path`` once the block ends without an error."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with open(descriptor, mode, encoding="utf-8" if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's file is private; the file it replaces was not
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    with atomic_file(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) through a temporary file and a rename."""
    with atomic_file(path) as f:
        f.write(text)


class FolderExistsError(FileExistsError):
    """:func:`atomic_folder`'s target exists and is not empty (and was not to be replaced)."""


@contextmanager
def atomic_folder(out_dir: Path, replace: bool = False) -> Iterator[Path]:
    """A temporary sibling folder of ``out_dir`` to write into, renamed to ``out_dir`` once
    the block ends without an error; removed whatever happens.

    ``replace``: an existing ``out_dir`` is removed first. Otherwise the rename takes the
    place of a missing or empty ``out_dir`` only, and :class:`FolderExistsError` is raised
    for a non-empty one, which stays as it was.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        # mkdtemp (and safetensors) write private modes; a shared cache must be readable.
        for path in (tmp, *tmp.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        if replace and out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            tmp.rename(out_dir)  # rename(2) replaces an empty directory, refuses a non-empty one
        except OSError as error:
            raise FolderExistsError(f"{out_dir} exists and is not empty") from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_jsonl_records(path: Path, missing_ok: bool = False) -> list[dict[str, Any]]:
    """All records of a JSONL file (raises on a malformed line); ``missing_ok``: [] for a missing file."""
    path = Path(path)
    if missing_ok and not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
