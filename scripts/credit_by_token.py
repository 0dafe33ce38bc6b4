"""Where a run's HP-RLVR credit went, token by token: the sum and mean of the credit each
(position in the action, token, episode won) received over a run's first steps, scored
and credited as the trainer does (default options) by a model of your choice, usually
the run's starting model.

    python scripts/credit_by_token.py --model runs/demo-<time>-warm --run runs/demo-<time> --steps 5
"""

from __future__ import annotations

import argparse
import collections
import json

import torch

from hp_agent.config import TrainConfig
from hp_agent.credit.baseline import HistoricalBaseline
from hp_agent.credit.registry import CREDIT_RULES
from hp_agent.hindsight import ScoringOptions, score_trajectories
from hp_agent.policies import load_policy
from hp_agent.credit.assembly import assign_credit
from hp_agent.trajectory import Trajectory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model that scores (the run's starting model)")
    parser.add_argument("--run", required=True, help="run folder with trajectories.jsonl")
    parser.add_argument("--steps", type=int, default=5, help="first N steps of the run")
    parser.add_argument("--top", type=int, default=24, help="rows to print, most frequent first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = load_policy(args.model)
    records = [json.loads(line) for line in open(f"{args.run}/trajectories.jsonl", encoding="utf-8")]
    baseline, rule = HistoricalBaseline(rate=0.1), CREDIT_RULES["hp-rlvr"]
    credit_of: dict[tuple[int, str, bool], list[float]] = collections.defaultdict(list)
    for step in range(args.steps):
        trajectories = [Trajectory.from_dict({k: v for k, v in r.items() if k != "step"}) for r in records if r["step"] == step]
        scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
        samples, _ = assign_credit(trajectories, scores, rule, TrainConfig().credit_options, baseline)
        for trajectory, turns in zip(trajectories, samples):
            for turn, sample in zip(trajectory.turns, turns):
                for position, (token, credit) in enumerate(zip(turn.action_ids, sample.credit.tolist())):
                    credit_of[(position, policy.tokenizer.decode([token]), trajectory.success)].append(credit)
    print("position  token  won  count  credit sum  credit mean")
    for (position, token, won), values in sorted(credit_of.items(), key=lambda kv: -len(kv[1]))[: args.top]:
        print(f"{position:8d}  {token!r:12}  {won!s:5}  {len(values):5d}  {sum(values):10.3f}  {sum(values) / len(values):11.3f}")


if __name__ == "__main__":
    main()
