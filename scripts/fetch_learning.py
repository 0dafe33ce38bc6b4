"""Does RL raise smollm2-135m's held-out success on the fetch env (a game won only by
reading), and does a flipped credit fail? HP-RLVR and GRPO from one warm start, each with
its flipped-credit control, every model evaluated on all 144 held-out tasks, restricted
to admissible actions.

Usage: scripts/fetch_learning.py OUT WARM_MODEL [--steps N] [--lr LR] [--seeds 0,1] [--weight-norm max]
Resumable: a finished run or evaluation (its JSON in OUT) is kept, and a rerun does the rest.
WARM_MODEL: e.g. the warm start of ``hp-agent sft --env fetch --model smollm2-135m --steps 200
--batch-size 4 --lr 1e-4 --env-kwargs '{demo_mistakes: 0.5}' --out OUT/warm``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import hp_agent
from hp_agent.credit.rules import CreditBatch, CreditOptions, grpo_credit, hp_rlvr_credit
from hp_agent.credit.registry import register_credit
from hp_agent.evaluation import improvement_p_value, wilson_interval
from hp_agent.policies import SamplingParams

SAMPLING = SamplingParams(max_new_tokens=8, temperature=1.0)
EVAL_SEED = 1
# Equal episodes a step: HP-RLVR 8 prompts x 1 rollout, GRPO 1 prompt x 8.
SHAPES = {"hp-rlvr": (8, 1), "grpo": (1, 8)}


@register_credit("hp-rlvr-flipped", hindsight=True)
def _flipped_hp_rlvr(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    credit, metrics = hp_rlvr_credit(batch, options)
    return -credit, metrics


@register_credit("grpo-flipped", group_size=8, min_group_size=2)
def _flipped_grpo(batch: CreditBatch, options: CreditOptions) -> tuple[torch.Tensor, dict[str, float]]:
    credit, metrics = grpo_credit(batch, options)
    return -credit, metrics


def held_out(model: str, out: Path, name: str) -> dict:
    """Successes and episodes of ``model`` on every held-out task, kept in OUT/name.json."""
    path = out / f"{name}.json"
    if not path.is_file():
        result = hp_agent.evaluate(env="fetch", model=model, split="test", samples=1, sampling=SAMPLING,
                                   seed=EVAL_SEED, constrain=True)
        path.write_text(json.dumps({"successes": result.successes, "episodes": result.episodes}))
    return json.loads(path.read_text())


def train(warm: str, out: Path, algo: str, seed: int, steps: int, lr: float, weight_norm: str) -> str:
    """Train ``algo`` from ``warm`` (resuming a run cut short); return its run folder."""
    prompts, group = SHAPES[algo.removesuffix("-flipped")]
    name = f"{algo}-{seed}"
    run = out / name
    if (run / "done").is_file():
        return str(run)
    config = {
        "env": {"name": "fetch"},
        "model": {"name": warm},
        "algo": {"name": algo, "group_size": group},
        "hindsight": {"weight_norm": weight_norm},
        "rollout": {"max_new_tokens": SAMPLING.max_new_tokens, "temperature": SAMPLING.temperature,
                    "constrain_to_admissible": True},
        "learner": {"lr": lr},
        "trainer": {"steps": steps, "prompts_per_step": prompts, "seed": seed, "run_dir": str(out), "name": name,
                    "save_trajectories": False, "checkpoint_every": 4},
    }
    hp_agent.train(config, progress=False, resume=run if (run / "config.yaml").is_file() else None)
    (run / "done").write_text("")
    return str(run)


def line(label: str, score: dict, before: dict | None = None) -> str:
    low, high = wilson_interval(score["successes"], score["episodes"])
    text = (f"{label}: {score['successes']}/{score['episodes']} = {100 * score['successes'] / score['episodes']:.1f}% "
            f"[{100 * low:.1f}, {100 * high:.1f}]")
    if before is not None:
        p = improvement_p_value(before["successes"], before["episodes"], score["successes"], score["episodes"])
        text += f"  one-sided p = {p:.2g}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("warm")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seeds", default="0")
    # "max": a trajectory's most hindsight-changed token gets full weight (hindsight.weight_norm);
    # the weights' scale (about 0.01 here) would otherwise slow HP-RLVR by as much against GRPO.
    parser.add_argument("--weight-norm", default="max")
    parser.add_argument("--algos", default="hp-rlvr,grpo,hp-rlvr-flipped,grpo-flipped")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    before = held_out(args.warm, args.out, "warm-eval")
    print(line("warm start", before), flush=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        for algo in args.algos.split(","):
            run = train(args.warm, args.out, algo, seed, args.steps, args.lr, args.weight_norm)
            print(line(f"{algo} seed {seed}", held_out(run, args.out, f"{algo}-{seed}-eval"), before), flush=True)


if __name__ == "__main__":
    main()
