"""One training step's credit and update on this rank's share of a fixed global batch.

Run by tests/test_distributed.py under ``torchrun --nproc-per-node 2`` (and with no
torchrun, as one process on the whole batch): ``python tests/dist_step.py BATCH OUT
[PARALLEL [CHECKPOINTING [MIXED]]]`` (PARALLEL: ddp or fsdp2; CHECKPOINTING, MIXED: 1 turns
activation checkpointing, bf16 mixed precision on).
BATCH holds the trajectories and their scores (made once by the test); each process
writes its updated weights, baseline state and records to ``OUT/rank<r>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hp_agent.config import load_config
from hp_agent.credit.baseline import HistoricalBaseline
from hp_agent.credit.registry import credit_rule
from hp_agent.distributed import init_from_env, shard
from hp_agent.learner import Learner
from hp_agent.policies import load_policy
from hp_agent.credit.assembly import assign_credit

LEARNER = ["learner.lr=1e-3", "learner.mini_batch_prompts=3", "learner.record_batch_size=2"]


def main(batch_path: str, out: str, parallel: str = "ddp", checkpointing: str = "0", mixed: str = "0") -> None:
    torch.set_num_threads(1)
    ranks = init_from_env("cpu")
    batch = torch.load(batch_path, weights_only=False)
    trajectories, scores = shard(batch["trajectories"], ranks), shard(batch["scores"], ranks)
    policy = load_policy("tiny")
    config = load_config(overrides=[*LEARNER, f"learner.parallel={parallel}",
                                    f"learner.activation_checkpointing={checkpointing == '1'}",
                                    f"learner.mixed_precision={mixed == '1'}"])
    learner = Learner.from_config(policy, config, ranks)
    baseline = HistoricalBaseline()
    samples, metrics = assign_credit(trajectories, scores, credit_rule(batch["algo"]), config.credit_options, baseline,
                                     ranks=ranks)
    records = learner.step(samples)
    torch.save({"weights": policy.model.state_dict(), "baseline": baseline.state_dict(), "metrics": metrics,
                "grad_norms": [r.grad_norm for r in records], "losses": [r.loss for r in records]},
               Path(out) / f"rank{ranks.rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
