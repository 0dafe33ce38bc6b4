"""Where a run folder keeps its checkpoints, which one is the latest, and what model a
path names (a run folder means its latest checkpoint's model).

Layout of ``runs/<name>/checkpoints/``::

    latest                 name of the newest complete checkpoint
    step_000010/           one checkpoint (see :mod:`hp_agent.runs` for what it holds)
"""

from __future__ import annotations

from pathlib import Path

from hp_agent.errors import UserFileNotFoundError

CHECKPOINT_PREFIX = "step_"


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


def model_source(path: str) -> str:
    """A run folder resolves to its latest checkpoint's model; anything else passes through."""
    candidate = Path(path)
    if (candidate / "checkpoints").is_dir():
        checkpoint = latest_checkpoint(candidate)
        if checkpoint is None:
            raise UserFileNotFoundError(f"run folder {path!r} has no complete checkpoint yet")
        return str(checkpoint / "model")
    return path
