"""How well a placement prior learnt from one set of ALFWorld games predicts where the target lies in another.

A policy that memorises "apples lie on countertops" wins more games than one that must read
every receptacle's contents. This measures that prior, per source of train games: from
each game's initial state it counts the receptacle types holding an instance of the task's
target object type, then ranks, for each evaluation game, the receptacle types its room
has by how often they held that object type in the train games. A hit at k: one of the
top k holds a target. Prints hits for priors from the official train games and from the
synthesized ones, on the official valid_seen and valid_unseen games.

Usage: python scripts/alfworld_placement_prior.py [--k 1 2 3]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from hp_agent.envs.alfworld.data import list_games
from hp_agent.envs.alfworld.pddl import parse_problem
from hp_agent.envs.alfworld.sources import resolve_data_root


def target_placements(game_dir: Path) -> tuple[str, Counter, set[str]]:
    """The target object type, the receptacle types holding its instances, the room's receptacle types."""
    problem = parse_problem(json.loads((game_dir / "game.tw-pddl").read_text())["pddl_problem"])
    target = json.loads((game_dir / "traj_data.json").read_text())["pddl_params"]["object_target"]
    holders = Counter(problem.parent_type(o) for o, t in problem.objects.items()
                      if t == target and problem.parent_type(o) is not None)
    return target, holders, set(problem.receptacles.values())


def games(split: str, source: str) -> list[tuple[str, Counter, set[str]]]:
    return [target_placements(g.game_file.parent) for g in list_games(resolve_data_root(split, source), split)]


def fit_prior(train: list[tuple[str, Counter, set[str]]]) -> dict[str, Counter]:
    prior: dict[str, Counter] = defaultdict(Counter)
    for target, holders, _ in train:
        prior[target].update(holders)
    return prior


def hits_at(prior: dict[str, Counter], evaluation: list[tuple[str, Counter, set[str]]], k: int) -> tuple[int, int]:
    hits = 0
    for target, holders, room in evaluation:
        ranked = [r for r, _ in prior[target].most_common() if r in room][:k]
        hits += any(r in holders for r in ranked)
    return hits, len(evaluation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    evaluation = {"valid_seen": games("id", "official"), "valid_unseen": games("ood", "official")}
    for name, source in (("official train", "official"), ("synthesized train", "synth")):
        train = games("train", source)
        prior = fit_prior(train)
        for k in args.k:
            for split, ev in evaluation.items():
                hits, n = hits_at(prior, ev, k)
                print(f"prior from {len(train)} {name} games, top-{k} receptacle type holds a target, "
                      f"{split}: {hits}/{n} = {hits / n:.1%}")


if __name__ == "__main__":
    main()
