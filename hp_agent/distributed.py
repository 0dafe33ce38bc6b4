"""Data-parallel training on ``torch.distributed``, launched by ``torchrun``.

Each rank plays its share of a step's prompts on its own env pool, scores hindsight and
assigns credit for its own trajectories. Three things make a step across W ranks the
step one process would take on the same global batch (rank 0's trajectories first):

* the historical baseline is read for, and updated with, every rank's trajectories in
  that order (:func:`all_gather`), so its state is the same on every rank;
* a mini-batch is a run of ``mini_batch_prompts`` prompts of the global order, so a
  rank may hold part of one or none of it, and its loss is normalised by the global
  count of eligible tokens (:func:`all_reduce_sum`);
* gradients are summed over ranks before clipping and the optimizer step, by DDP or
  FSDP2 (:mod:`hp_agent.parallel`).

Rank 0 alone writes the run folder. One process without torchrun is the W = 1 case:
every function here is then a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # this process's place on its machine (torchrun's LOCAL_RANK): its GPU

    def device(self, device: str) -> str:
        """``cuda`` becomes this rank's own GPU (``cuda:<local_rank>``) when there are several ranks."""
        return f"cuda:{self.local_rank}" if self.enabled and device == "cuda" else device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


SINGLE = Ranks()


def init_from_env(device: str) -> Ranks:
    """Join the process group ``torchrun`` describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``MASTER_PORT``): gloo on CPU, NCCL on CUDA (one GPU a rank). Without
    them, one process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return SINGLE
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)  # before NCCL starts, so that each rank's communicator uses its GPU
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(), local_rank)


def shard(items: list, ranks: Ranks) -> list:
    """This rank's contiguous block of ``items`` (whose length W divides)."""
    if len(items) % ranks.world_size:
        raise ValueError(f"{len(items)} items do not split evenly over {ranks.world_size} ranks")
    size = len(items) // ranks.world_size
    return items[ranks.rank * size : (ranks.rank + 1) * size]


def all_gather(value: Any, ranks: Ranks) -> list[Any]:
    """Every rank's ``value`` (any picklable object), in rank order."""
    if not ranks.enabled:
        return [value]
    gathered: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def all_reduce_sum(values: list[float], ranks: Ranks) -> list[float]:
    """Element-wise sums of ``values`` over ranks (float64)."""
    if not ranks.enabled:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def barrier(ranks: Ranks) -> None:
    if ranks.enabled:
        dist.barrier()
