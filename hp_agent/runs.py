"""Run folders: resolved config, metrics JSONL, TensorBoard events, checkpoints.

Layout of ``runs/<name>/``::

    config.yaml            the resolved TrainConfig
    metrics.jsonl          one JSON object per step: {"step": k, "rollout/...": ..., ...}
    trajectories.jsonl     every step's trajectories (token ids included)
    events.out.tfevents.*  TensorBoard scalars, same names as metrics.jsonl
    checkpoints/latest     name of the newest complete checkpoint
    checkpoints/step_000010/{model/, optimizer.pt, state.pt, manifest.json}
                           (learner.parallel=fsdp2, or mixed precision on a
                           bf16 model: learner/ holds the training copy's and
                           the optimizer's shards instead of optimizer.pt)

Every file that a kill could leave half-written is written through :mod:`hp_agent.files`,
so a reader sees the old version or the new one, never a mix (where checkpoints live and
which is the latest: :mod:`hp_agent.run_folder`). Appended JSONL
files are cut back to their last complete line when a run resumes. A checkpoint's
``manifest.json`` holds the size and SHA-256 of each of its files, so that a resume
finds one damaged afterwards (a truncated copy, a bad disk) and takes the one before.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hp_agent.distributed import SINGLE, Ranks, all_gather
from hp_agent.errors import MissingPackageError, UserError
from hp_agent.files import atomic_write_text
from hp_agent.run_folder import MANIFEST_FILE, checkpoint_dir, checkpoint_folders, checkpoint_step, file_sha256, latest_checkpoint


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (a full disk, no permission); the run can resume from the last good one."""


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


class JsonlLog:
    """Append-only JSONL file keyed by ``step``, safe to resume after a kill.

    On opening with ``resume_step``, records with ``step >= resume_step`` and any torn
    last line are dropped (those steps will be redone), then appending continues.
    """

    def __init__(self, path: Path, resume_step: int | None = None, max_bytes: int | None = None):
        self.path, self.max_bytes = path, max_bytes
        if resume_step is not None and path.exists():
            self._truncate(resume_step)
        self._file = path.open("a", encoding="utf-8")

    def _truncate(self, resume_step: int) -> None:
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by the kill
            if record.get("step", -1) < resume_step:
                kept.append(line + "\n")
        atomic_write_text(self.path, "".join(kept))

    @property
    def full(self) -> bool:
        """The file holds ``max_bytes`` (or more): :meth:`write` writes nothing more."""
        return self.max_bytes is not None and self._file.tell() >= self.max_bytes

    def write(self, record: dict[str, Any]) -> bool:
        """Append ``record``; False (and nothing written) once the file is :attr:`full`."""
        if self.full:
            return False
        line = json.dumps({key: _json_safe(value) for key, value in record.items()}, ensure_ascii=False)
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        return True

    def close(self) -> None:
        self._file.close()


class MetricsWriter:
    """Scalars to ``metrics.jsonl``, TensorBoard and (``wandb_project``) Weights & Biases,
    with the same names."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, wandb_project: str | None = None,
                 config: dict[str, Any] | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.jsonl = JsonlLog(run_dir / "metrics.jsonl", resume_step)
        self.tensorboard = SummaryWriter(log_dir=str(run_dir), purge_step=resume_step)
        self.wandb = _wandb_run(run_dir, wandb_project, config) if wandb_project else None

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.jsonl.write({"step": step, **metrics})
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for key, value in scalars.items():
            self.tensorboard.add_scalar(key, value, step)
        self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        self.jsonl.close()
        self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_run(run_dir: Path, project: str, config: dict[str, Any] | None) -> Any:
    """A W&B run named after the run folder, its files under it; a resumed run continues the
    same W&B run (steps it logged before are not logged again). ``WANDB_MODE=offline``
    keeps it on disk for ``wandb sync``."""
    try:
        import wandb
    except ImportError as error:
        raise MissingPackageError(f"trainer.wandb_project={project!r} is set, but the wandb package is not installed "
                                  f"({error}): pip install wandb, or leave trainer.wandb_project unset") from error
    run_id = f"{run_dir.name}-{hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]}"  # the same on resume
    return wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir), config=config)


def write_manifest(folder: Path) -> None:
    """Record the size and SHA-256 of every file under ``folder`` in its manifest (written atomically)."""
    files = {path.relative_to(folder).as_posix(): {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
             for path in sorted(folder.rglob("*")) if path.is_file()}
    atomic_write_text(folder / MANIFEST_FILE, json.dumps({"files": files}, indent=1) + "\n")


def save_checkpoint(
    run_dir: Path,
    step: int,
    write_model: Callable[[Path], None],
    write_learner: Callable[[Path], None],
    state: dict[str, Any],
    keep: int,
    ranks: Ranks = SINGLE,
) -> Path:
    """Write checkpoint ``step`` and point ``latest`` at it.

    ``write_model(folder)`` writes the model and tokenizer into ``folder``
    (:func:`hp_agent.policies.lora.save_model`: a Hugging Face folder, a LoRA model's
    adapter alone); ``write_learner(folder)`` writes the optimizer's state (``Learner.save``); ``state``
    the trainer's (step, baseline, RNG). With several ``ranks`` every rank calls this
    and ``write_learner``, which may write each rank's shards; rank 0 alone writes the
    rest and, once every rank is done, the manifest. The checkpoint is built in a
    temporary folder and renamed into place, then older ones beyond ``keep`` go.

    A write that fails on any rank (a full disk, no permission) removes the temporary
    folder, leaves ``latest`` and the older checkpoints as they were and raises
    :class:`CheckpointWriteError` on every rank, naming the cause and how to resume.
    """
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".tmp-{final.name}")  # one name for every rank: they all write into it

    def start() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)

    def finish() -> None:
        write_model(tmp / "model")
        with (tmp / "state.pt").open("wb") as f:  # through Python's file, a full disk raises OSError, errno and all
            torch.save(state, f)
        write_manifest(tmp)  # last, when every rank has written its part: its presence marks a complete checkpoint
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        atomic_write_text(run_dir / "checkpoints" / "latest", final.name)
        _prune_checkpoints(run_dir, keep)

    # Each part ends in an exchange of outcomes, the barrier that also stops every rank when one fails
    # (no rank runs ahead of a checkpoint it may have to resume from).
    for part in (start if ranks.is_main else None, lambda: write_learner(tmp), finish if ranks.is_main else None):
        _write_on_every_rank(part, run_dir, step, tmp, ranks)
    return final


def _write_on_every_rank(write: Callable[[], None] | None, run_dir: Path, step: int, tmp: Path, ranks: Ranks) -> None:
    """Run this rank's part of checkpoint ``step`` (``None``: none), then learn every rank's outcome.

    Should one fail, rank 0 removes ``tmp`` and every rank raises: :class:`CheckpointWriteError`
    when the file system refused a write, else the error itself (a bug keeps its traceback).
    """
    error: BaseException | None = None
    cause: str | None = None
    try:
        if write is not None:
            write()
    except BaseException as caught:  # raised again below, once the other ranks heard of it
        if isinstance(caught, (KeyboardInterrupt, SystemExit)):
            raise
        # BaseException: torch.distributed.checkpoint raises its CheckpointException on every rank
        error, cause = caught, _storage_cause(caught, tmp.parent)
    outcomes = all_gather(None if error is None else (cause, repr(error)), ranks)
    failures = [(rank, outcome) for rank, outcome in enumerate(outcomes) if outcome is not None]
    if not failures:
        return
    if ranks.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    if error is not None and cause is None:
        raise error
    rank, (cause, description) = failures[0]
    if cause is None:
        raise RuntimeError(f"rank {rank} failed while writing checkpoint {tmp}: {description}")
    last = latest_checkpoint(run_dir)
    good = (f"the last good checkpoint is step {checkpoint_step(last)} ({last})" if last
            else "there is no earlier checkpoint (a resume starts over)")
    raise CheckpointWriteError(f"could not write checkpoint {tmp} (step {step}): {cause}; removed it, {good}: "
                               f"fix that, then resume with `hp-agent train --resume {run_dir}`") from error


# How messages quote an OSError: Python's "[Errno 28] ..." (kept in torch.distributed.checkpoint's
# gathered failures) and Rust's "(os error 28)" (safetensors' writer).
_ERRNO_IN_MESSAGE = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)")


def _storage_cause(error: BaseException, folder: Path) -> str | None:
    """Why the file system refused a checkpoint's write that raised ``error`` (e.g. ``no space
    left on device``), or None when it did not: ``error`` is then not a write failure.

    An OSError anywhere in the chain, or an errno its messages quote, names the cause. torch's
    C++ writer loses the errno (``unexpected pos ...``), so then a small write asks the file
    system itself; the partial file it left keeps a full disk full.
    """
    chained: BaseException | None = error
    while chained is not None:
        if isinstance(chained, OSError):
            return _described(chained)
        if match := _ERRNO_IN_MESSAGE.search(str(chained)):
            return os.strerror(int(match.group(1) or match.group(2))).lower()
        chained = chained.__cause__ or chained.__context__
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        with probe.open("wb") as f:
            f.write(os.urandom(1 << 20))  # random: a compressing file system stores it in full
            f.flush()
            os.fsync(f.fileno())
    except OSError as refused:
        return _described(refused)
    finally:
        probe.unlink(missing_ok=True)
    return None


def _described(error: OSError) -> str:
    """An OSError's cause as a phrase, ``no space left on device``; its message when it has no errno."""
    return os.strerror(error.errno).lower() if error.errno else str(error)


def _prune_checkpoints(run_dir: Path, keep: int) -> None:
    for old in checkpoint_folders(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint (the optimizer's: ``Learner.load``)."""
    return torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=False)
