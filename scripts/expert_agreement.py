"""How often a model, answering greedily, picks exactly the expert's action on the expert's own prompts.

A cheap diagnostic of a warm start between full evaluations: DEMOS is a file from
`hp-agent data alfworld --demos` (e.g. the first 24 valid_seen games), so each prompt is
one the expert met on its way to a win. Prints the agreeing turns over all turns, and
with --show every disagreement.

Usage: python scripts/expert_agreement.py MODEL DEMOS [--games 24] [--show]
"""

from __future__ import annotations

import argparse

import torch

from hp_agent.policies import SamplingParams, load_policy
from hp_agent.trajectory import read_jsonl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("demos")
    parser.add_argument("--games", type=int, default=24)
    parser.add_argument("--show", action="store_true", help="print every disagreement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = load_policy(args.model)
    agree = total = 0
    for trajectory in list(read_jsonl(args.demos))[: args.games]:
        generations = policy.generate([turn.prompt_ids for turn in trajectory.turns], SamplingParams(max_new_tokens=24, greedy=True))
        for turn, generation in zip(trajectory.turns, generations):
            answer, wanted = policy.decode(generation.token_ids).strip(), turn.action_text.strip()
            total += 1
            agree += answer == wanted
            if args.show and answer != wanted:
                print(f"  expert {wanted!r:50s} model {answer!r}")
    print(f"{args.model}: agrees with the expert on {agree}/{total} turns ({agree / max(total, 1):.1%})")


if __name__ == "__main__":
    main()
