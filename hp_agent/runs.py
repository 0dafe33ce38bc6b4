"""Run folders: resolved config, metrics JSONL, TensorBoard events, checkpoints.

Layout of ``runs/<name>/``::

    config.yaml            the resolved TrainConfig
    metrics.jsonl          one JSON object per step: {"step": k, "rollout/...": ..., ...}
    trajectories.jsonl     every step's trajectories (token ids included)
    events.out.tfevents.*  TensorBoard scalars, same names as metrics.jsonl
    checkpoints/latest     name of the newest complete checkpoint
    checkpoints/step_000010/{model/, optimizer.pt, state.pt}
                           (learner.parallel=fsdp2, or mixed precision on a
                           bf16 model: learner/ holds the training copy's and
                           the optimizer's shards instead of optimizer.pt)

Every file that a kill could leave half-written is written to a temporary name and
renamed, so a reader sees the old version or the new one, never a mix. Appended JSONL
files are cut back to their last complete line when a run resumes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hp_agent.distributed import SINGLE, Ranks, barrier
from hp_agent.lora import is_peft_model

CHECKPOINT_PREFIX = "step_"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) through a temporary file and a rename."""
    atomic_write_bytes(path, text.encode("utf-8"))


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


def read_jsonl_records(path: Path) -> list[dict[str, Any]]:
    """All records of a JSONL log (raises on a malformed line)."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


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
        raise ImportError(f"trainer.wandb_project={project!r} is set, but the wandb package is not installed "
                          f"({error}): pip install wandb, or leave trainer.wandb_project unset") from error
    run_id = f"{run_dir.name}-{hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]}"  # the same on resume
    return wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir), config=config)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{step:06d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if (path / "state.pt").is_file() else None


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    write_learner: Callable[[Path], None],
    state: dict[str, Any],
    keep: int,
    ranks: Ranks = SINGLE,
) -> Path:
    """Write checkpoint ``step`` (model as a Hugging Face folder; a LoRA model's adapter
    alone, see :mod:`hp_agent.lora`) and point ``latest`` at it.

    ``write_learner(folder)`` writes the optimizer's state (``Learner.save``); ``state``
    the trainer's (step, baseline, RNG). With several ``ranks`` every rank calls this
    and ``write_learner``, which may write each rank's shards; rank 0 alone writes the
    rest. The checkpoint is built in a temporary folder and renamed into place, then
    older ones beyond ``keep`` go.
    """
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".tmp-{final.name}")  # one name for every rank: they all write into it
    if ranks.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(ranks)
    write_learner(tmp)
    barrier(ranks)
    if ranks.is_main:
        # A LoRA model writes its adapter alone; its embeddings are never resized, so peft need not
        # look the base up on the hub to compare vocabulary sizes.
        options = {"save_embedding_layers": False} if is_peft_model(model) else {}
        model.save_pretrained(tmp / "model", safe_serialization=True, **options)
        tokenizer.save_pretrained(tmp / "model")
        torch.save(state, tmp / "state.pt")  # written last: its presence marks a complete checkpoint
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        atomic_write_text(run_dir / "checkpoints" / "latest", final.name)
        _prune_checkpoints(run_dir, keep)
    barrier(ranks)  # no rank runs ahead of a checkpoint it may have to resume from
    return final


def _prune_checkpoints(run_dir: Path, keep: int) -> None:
    folders = sorted(p for p in (run_dir / "checkpoints").glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir())
    for old in folders[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint (the optimizer's: ``Learner.load``)."""
    return torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=False)


def model_source(path: str) -> str:
    """A run folder resolves to its latest checkpoint's model; anything else passes through."""
    candidate = Path(path)
    if (candidate / "checkpoints").is_dir():
        checkpoint = latest_checkpoint(candidate)
        if checkpoint is None:
            raise FileNotFoundError(f"run folder {path!r} has no complete checkpoint yet")
        return str(checkpoint / "model")
    return path
