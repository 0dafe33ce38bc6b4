"""Wall time per training step, synchronous (trainer.off_policy_steps=0) against one-step-off (1).

    .venv/bin/python bench/off_policy.py --env keys
    .venv/bin/python bench/off_policy.py --env alfworld --env-kwargs '{"split": "id", "max_steps": 8}' --prompts 2

For each algorithm (HP-RLVR at G=1, GRPO at G=8, equal prompts per step) two fresh runs
train the tiny model from the same seed on the same tasks through :func:`hp_agent.train`,
one synchronous and one with a rollout process one step ahead (``trainer.torch_threads``
threads each: on 2 cores, one each). A step's wall time is the trainer's ``time/total``;
the first ``--warmup`` steps (the rollout process's start, and the first batch, which
nothing overlaps) and the last one (no next batch to play beside it) are left out of
both runs, and the ``--steps`` between them averaged. Runs alternate (synchronous,
one-step-off, ...) ``--repeats`` times so that load from other processes hits both alike,
and the medians are printed with their ratio, synchronous / one-step-off (above 1: one-step-off is faster).
A third run per algorithm is one-step-off with ``trainer.learner_scoring_share`` (``--share``):
the learner's process scores that share of each batch under the generating weights, the
rollout process the rest.

The gain is bounded by the larger side: a step takes about max(rollout + scoring,
learner) instead of their sum (max(rollout, scoring + learner) with the learner scoring), so
it is largest where the two are balanced. Credit views
are off (``trainer.views_per_step=0``), as in ``hp-agent compare``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import hp_agent
from hp_agent.files import read_jsonl_records

ALGORITHMS = (("hp-rlvr", 1), ("grpo", 8))


# (trainer.off_policy_steps, learner scores --share): synchronous, one-step-off, one-step-off with the learner scoring
VARIANTS = ((0, False), (1, False), (1, True))
ROLLOUT_SIDE = ("time/generation", "time/env_step", "time/hindsight", "time/replay")


def seconds_per_step(algo: str, group: int, off_policy: int, learner_scores: bool, args: argparse.Namespace, run_dir: Path,
                     name: str) -> dict[str, float]:
    """Means over the steps after the warm-up of one fresh run: ``time/total``, the rollout
    side's phases, ``time/train`` and the two waits."""
    config = {
        "env": {"name": args.env, "kwargs": json.loads(args.env_kwargs)},
        "model": {"name": args.model},
        "algo": {"name": algo, "group_size": group},
        "rollout": {"max_new_tokens": args.max_new_tokens, "max_turns": args.max_turns},
        "learner": {"lr": 1e-4},
        "trainer": {"steps": args.warmup + args.steps + 1, "prompts_per_step": args.prompts, "run_dir": str(run_dir),
                    "name": name, "save_trajectories": False, "checkpoint_every": 10**6, "views_per_step": 0,
                    "off_policy_steps": off_policy,
                    "learner_scoring_share": args.share if learner_scores else 0.0},
    }
    summary = hp_agent.train(config, progress=False)
    records = read_jsonl_records(summary.run_dir / "metrics.jsonl")[args.warmup:-1]
    return {"total": statistics.mean(r["time/total"] for r in records),
            "rollout": statistics.mean(sum(r.get(key, 0.0) for key in ROLLOUT_SIDE) for r in records),
            "train": statistics.mean(r["time/train"] for r in records),
            "wait_rollout": statistics.mean(r.get("time/wait_rollout", 0.0) for r in records),
            "wait_learner": statistics.mean(r.get("time/wait_learner", 0.0) for r in records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="keys")
    parser.add_argument("--env-kwargs", default="{}", help="the env's keyword arguments, as JSON")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--algos", default="hp-rlvr,grpo", help="comma-separated: hp-rlvr, grpo")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (GRPO plays 8 rollouts of each)")
    parser.add_argument("--max-new-tokens", type=int, default=5)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--steps", type=int, default=4, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run left out")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--share", type=float, default=0.5, help="trainer.learner_scoring_share of the third run")
    args = parser.parse_args()
    algos = [(algo, group) for algo, group in ALGORITHMS if algo in args.algos.split(",")]
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo, group in algos:
            runs: dict[tuple[int, bool], list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
            for repeat in range(args.repeats):
                for off_policy, learner_scores in VARIANTS:
                    runs[off_policy, learner_scores].append(seconds_per_step(algo, group, off_policy, learner_scores, args,
                                                                             Path(tmp), f"{algo}-{off_policy}-{learner_scores}-{repeat}"))
            sync, async_, learner = ({key: statistics.median(run[key] for run in runs[variant]) for key in runs[variant][0]}
                                     for variant in VARIANTS)
            ratio, learner_ratio = sync["total"] / async_["total"], sync["total"] / learner["total"]
            result.update({f"{algo}_sync_s": sync["total"], f"{algo}_one_step_off_s": async_["total"], f"{algo}_ratio": ratio,
                           f"{algo}_learner_scores_s": learner["total"], f"{algo}_learner_scores_ratio": learner_ratio})
            print(f"{algo} (G={group}) env={args.env} model={args.model} {args.prompts} prompts x G, "
                  f"{args.max_new_tokens} new tokens: synchronous {sync['total']:.2f} s/step (rollout and scoring "
                  f"{sync['rollout']:.2f}, train {sync['train']:.2f}), one-step-off {async_['total']:.2f} s/step (rollout "
                  f"and scoring {async_['rollout']:.2f}, train {async_['train']:.2f}, learner waiting "
                  f"{async_['wait_rollout']:.2f}, rollout waiting {async_['wait_learner']:.2f}), ratio {ratio:.2f}x; "
                  f"one-step-off with the learner scoring {args.share:g} of each batch {learner['total']:.2f} s/step "
                  f"(learner waiting {learner['wait_rollout']:.2f}, rollout waiting {learner['wait_learner']:.2f}), "
                  f"ratio {learner_ratio:.2f}x", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
