"""Where a run folder keeps its checkpoints, which one is the latest, and what model a
path names (a run folder means its latest checkpoint's model).

Layout of ``runs/<name>/checkpoints/``::

    latest                 name of the newest complete checkpoint
    step_000010/           one checkpoint (see :mod:`hp_agent.runs` for what it holds)
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from hp_agent.errors import UserError, UserFileNotFoundError

CHECKPOINT_PREFIX = "step_"
MANIFEST_FILE = "manifest.json"

log = logging.getLogger(__name__)


class CheckpointDamagedError(UserError):
    """No checkpoint of a run matches its manifest, so none can be resumed."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{step:06d}"


def checkpoint_step(checkpoint: Path) -> int:
    """The step a checkpoint folder was written at (``step_000010`` -> 10)."""
    return int(checkpoint.name.removeprefix(CHECKPOINT_PREFIX))


def checkpoint_folders(run_dir: Path) -> list[Path]:
    """A run's checkpoint folders, oldest first."""
    return sorted(p for p in (run_dir / "checkpoints").glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if (path / "state.pt").is_file() else None


def resume_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint of a run whose files match its manifest (None: the run has none).

    Damaged newer ones (see :func:`checkpoint_damage`) are skipped with a one-line warning
    that names them and the one taken; :class:`CheckpointDamagedError` when all are damaged.
    """
    damaged = []
    for folder in reversed(checkpoint_folders(run_dir)):
        problem = checkpoint_damage(folder)
        if problem is None:
            if damaged:
                log.warning("damaged checkpoint %s; resuming from %s instead", "; ".join(damaged), folder)
            return folder
        damaged.append(f"{folder} ({problem})")
    if damaged:
        raise CheckpointDamagedError(f"no checkpoint of {str(run_dir)!r} can be resumed, each is damaged: "
                                     f"{'; '.join(damaged)}. Restore one from a copy, or start a new run")
    return None


def checkpoint_damage(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint folder, or None when every file its manifest lists is
    there with the size and SHA-256 the manifest gives."""
    try:
        files = json.loads((checkpoint / MANIFEST_FILE).read_text())["files"]
    except FileNotFoundError:
        return f"no {MANIFEST_FILE}: not completely written, or written before checkpoints had one"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"unreadable {MANIFEST_FILE} ({error})"
    for name, expected in files.items():  # sizes first: a truncated file is found without reading the others
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, {MANIFEST_FILE} says {expected['bytes']}"
    for name, expected in files.items():
        if file_sha256(checkpoint / name) != expected["sha256"]:
            return f"{name} does not match its SHA-256 in {MANIFEST_FILE}"
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def model_source(path: str) -> str:
    """A run folder resolves to the model of its newest checkpoint that matches its manifest
    (as a resume picks it: a damaged newer one is skipped aloud, ``latest`` is not trusted);
    anything else passes through."""
    candidate = Path(path)
    if (candidate / "checkpoints").is_dir():
        checkpoint = resume_checkpoint(candidate)
        if checkpoint is None:
            raise UserFileNotFoundError(f"run folder {path!r} has no complete checkpoint yet")
        return str(checkpoint / "model")
    return path
