"""Where a model's hindsight JSD weights land on its own episodes, in any env.

For each model: play ``--games`` train tasks once each (sampled at temperature 1, as in
training), score every episode with the hindsight scorer (the trainer's default options)
and print, over all action tokens:

* ``format_share``: the share of the total weight on answer-format tokens (the env's
  ``answer_format``, e.g. ALFWorld's ``<action>`` tags, and the end-of-turn token) rather
  than on the action's words;
* mean weight per content token and per format token, and on each turn's first token;
* ``share_near_zero``: the share of action tokens whose weight is below 0.01;
* ALFWorld: mean weight per content token on interaction turns (take, move, heat, cool,
  clean, use: the steps that advance the task) and on navigation turns (go to, open,
  close, examine, look, inventory), split by the episode's outcome.

Usage (one torch thread): python scripts/jsd_shares.py --model runs/warm/sft-A --model runs/warm/sft-H
                          python scripts/jsd_shares.py --env keys --model runs/keys-warm --games 64
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hp_agent.envs import make
from hp_agent.hindsight import ScoringOptions, score_trajectories
from hp_agent.policies import SamplingParams, load_policy
from hp_agent.rollout import Episode, collect
from hp_agent.credit.assembly import answer_format_masks

INTERACTIONS = ("take", "move", "put", "heat", "cool", "clean", "use", "slice")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def weight_shares(model: str, env: str, games: int, max_turns: int, max_new_tokens: int, seed: int) -> dict[str, float]:
    policy = load_policy(model)
    kwargs = {"num_games": games, "max_steps": max_turns} if env == "alfworld" else {}
    envs = [make(env, split="train", **kwargs) for _ in range(min(games, 16))]
    episodes = [Episode(task_id, group=g) for g, task_id in enumerate(envs[0].task_ids()[:games])]
    torch.manual_seed(seed)
    trajectories = collect(policy, envs, env, episodes, SamplingParams(max_new_tokens=max_new_tokens), max_turns, seed=seed)
    for env in envs:
        env.close()
    scores = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    masks = answer_format_masks(policy, trajectories, envs[0].answer_format)
    content, format_, first = [], [], []
    by_kind: dict[str, list[float]] = {}
    for trajectory, score, traj_masks in zip(trajectories, scores, masks):
        outcome = "success" if trajectory.success else "failure"
        for turn, weights, mask in zip(trajectory.turns, score.weights, traj_masks):
            values = weights.tolist()
            first += values[:1]
            turn_content = [w for w, is_format in zip(values, mask) if not is_format]
            content += turn_content
            format_ += [w for w, is_format in zip(values, mask) if is_format]
            if env == "alfworld":
                kind = "interaction" if turn.action.split(" ")[0] in INTERACTIONS else "navigation"
                by_kind.setdefault(f"{kind}_{outcome}", []).extend(turn_content)
    total = sum(content) + sum(format_)
    return {
        "episodes": len(trajectories),
        "success_rate": _mean([float(t.success) for t in trajectories]),
        "turns": sum(len(t.turns) for t in trajectories),
        "format_share": sum(format_) / total if total else float("nan"),
        "mean_weight_content": _mean(content),
        "mean_weight_format": _mean(format_),
        "mean_weight_first_token": _mean(first),
        "share_near_zero": _mean([float(w < 0.01) for w in content + format_]),
        **{f"mean_weight_{key}": _mean(values) for key, values in sorted(by_kind.items())},
        **{f"tokens_{key}": len(values) for key, values in sorted(by_kind.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="model folder (repeat to compare)")
    parser.add_argument("--env", default="alfworld", help="any registered env with a train split")
    parser.add_argument("--games", type=int, default=48, help="train tasks, played once each")
    parser.add_argument("--max-turns", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {model: weight_shares(model, args.env, args.games, args.max_turns, args.max_new_tokens, args.seed)
               for model in args.model}
    for model, figures in results.items():
        print(f"== {model}")
        for key, value in figures.items():
            print(f"  {key:44s} {value:.4f}" if isinstance(value, float) else f"  {key:44s} {value}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
