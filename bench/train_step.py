"""One training step of HP-RLVR (G=1) versus GRPO (G=8) at equal prompts per step.

    .venv/bin/python bench/train_step.py --prompts 4 --steps 2
    .venv/bin/python bench/train_step.py --env math --prompts 8

Both algorithms train the same model from the same seed on the same tasks (ALFWorld train
games by default) through :func:`hp_agent.train`; the phases come from the run's
``metrics.jsonl`` (``time/generation``, ``time/env_step``, ``time/hindsight`` or
``time/replay``, ``time/train``). The first step of each run is a warm-up and is left out
when ``--steps`` > 1. Runs alternate (HP-RLVR, GRPO, HP-RLVR, ...) ``--repeats`` times so
that load from other processes hits both alike; the medians are reported. Printed: seconds
per phase for each algorithm, GRPO / HP-RLVR step-time ratio (the cost HP-RLVR saves) and
the hindsight share of HP-RLVR's generation time.

The untrained tiny model rarely ends a turn early, so every turn samples about
``--max-new-tokens`` tokens: generation time grows with it, while scoring a turn costs
about the privileged block (up to 384 tokens) plus the answer, so the hindsight share
falls as answers lengthen. ``make bench`` runs 24 tokens (the demo's CPU-scale setting)
and 128 (closer to an agent that writes a short ``<think>`` before its action).

``--learner-packing`` times the learner alone instead: one GRPO batch (``--prompts`` x
``--group`` rollouts of ``--max-new-tokens``; ``--group 1``: one rollout per prompt,
credited by the historical baseline) is sampled and credited once, then
``Learner.step`` runs on it with ``learner.packed`` true and false in turn (``--repeats``
times each, every step from the same weights, after one warm-up each), counting the token
slots the decoder runs (padding included). Printed: median step seconds and tokens run
for each, and the packed / padded ratios::

    .venv/bin/python bench/train_step.py --learner-packing --env math --env-kwargs '{}' --max-new-tokens 64 --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import hp_agent
from hp_agent.files import read_jsonl_records

PHASES = ("time/generation", "time/env_step", "time/hindsight", "time/replay", "time/train", "time/total")


def run_once(algo: str, group: int, args: argparse.Namespace, run_dir: Path, index: int) -> dict[str, float]:
    """Median phase seconds over the measured steps of one fresh run."""
    config = {
        "env": {"name": args.env, "kwargs": json.loads(args.env_kwargs), "num_workers": args.workers},
        "model": {"name": args.model},
        "algo": {"name": algo, "group_size": group},
        "rollout": {"max_new_tokens": args.max_new_tokens},
        "trainer": {"steps": args.steps, "prompts_per_step": args.prompts, "run_dir": str(run_dir),
                    "name": f"{algo}-{index}", "save_trajectories": False, "checkpoint_every": 10**6},
    }
    summary = hp_agent.train(config, progress=False)
    records = read_jsonl_records(summary.run_dir / "metrics.jsonl")
    measured = records[1:] if len(records) > 1 else records
    return {phase: statistics.median(r.get(phase, 0.0) for r in measured) for phase in PHASES}


def learner_packing(args: argparse.Namespace) -> None:
    """``--learner-packing``: the learner step on one rollout batch, packed against padded."""
    import torch

    from hp_agent.config import TrainConfig
    from hp_agent.credit.baseline import HistoricalBaseline
    from hp_agent.credit.registry import credit_rule
    from hp_agent.envs import make
    from hp_agent.hindsight import unreplayed_scores
    from hp_agent.learner import Learner, TrainingSample
    from hp_agent.policies import SamplingParams, load_policy
    from hp_agent.rollout import Episode, collect
    from hp_agent.credit.assembly import assign_credit

    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy = load_policy(args.model)
    envs = [make(args.env, split="train", **json.loads(args.env_kwargs)) for _ in range(args.prompts * args.group)]
    tasks = envs[0].task_ids()[: args.prompts]
    episodes = [Episode(task, group=g) for g, task in enumerate(tasks) for _ in range(args.group)]
    trajectories = collect(policy, envs, args.env, episodes, SamplingParams(max_new_tokens=args.max_new_tokens))

    algo = "grpo" if args.group > 1 else "reinforce"  # --group 1: HP-RLVR's shape, its prompts all different

    def config(packed: bool) -> TrainConfig:  # one optimizer step on the batch, as the trainer takes without replay
        return TrainConfig.model_validate({"algo": {"name": algo, "group_size": args.group},
                                           "learner": {"mini_batch_prompts": args.prompts, "packed": packed}})

    samples, _ = assign_credit(trajectories, unreplayed_scores(trajectories), credit_rule(algo),
                               config(True).credit_options, HistoricalBaseline(initial=0.5))

    def one_step(packed: bool) -> tuple[float, int]:
        """Seconds and decoder token slots of one learner step from the sampling weights."""
        learner = Learner.from_config(copy.deepcopy(policy), config(packed))
        slots: list[int] = []
        learner.model.trained.get_decoder().register_forward_pre_hook(
            lambda _, __, kwargs: slots.append(kwargs["input_ids"].numel()), with_kwargs=True)
        started = time.perf_counter()
        learner.step(samples)
        return time.perf_counter() - started, sum(slots)

    runs: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for packed in (True, False):
            result = one_step(packed)
            if repeat:
                runs[packed].append(result)
    turns: list[TrainingSample] = [turn for trajectory in samples for turn in trajectory]
    prompt = statistics.mean(turn.action_start for turn in turns)
    action = statistics.mean(turn.num_action_tokens for turn in turns)
    print(f"learner step, {algo} batch: env={args.env} model={args.model} {args.prompts} prompts x G={args.group}, "
          f"{len(turns)} sequences, prompt {prompt:.1f} + action {action:.1f} tokens on average, "
          f"{sum(len(t.input_ids) for t in turns)} tokens unpadded; repeats={args.repeats}")
    seconds = {packed: statistics.median(t for t, _ in results) for packed, results in runs.items()}
    slots = {packed: results[0][1] for packed, results in runs.items()}
    print(f"{'learner.packed':<16}{'s/step':>10}{'tokens run':>12}")
    for packed in (True, False):
        print(f"{str(packed).lower():<16}{seconds[packed]:>10.3f}{slots[packed]:>12}")
    print(f"packed / padded: time {seconds[True] / seconds[False]:.2f}x, tokens run {slots[True] / slots[False]:.2f}x "
          f"({1 - slots[True] / slots[False]:.1%} fewer)")


def main() -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="alfworld")
    parser.add_argument("--env-kwargs", default='{"max_steps": 10}', help="JSON env kwargs (CPU-scale episode length)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", type=int, default=4, help="prompts (tasks) per step, equal for both")
    parser.add_argument("--group", type=int, default=8, help="GRPO group size")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="env worker processes")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--learner-packing", action="store_true",
                        help="time the learner step alone on one GRPO batch, learner.packed true against false")
    args = parser.parse_args()
    if args.learner_packing:
        learner_packing(args)
        return

    results: dict[str, list[dict[str, float]]] = {"hp-rlvr": [], "grpo": []}
    with tempfile.TemporaryDirectory(prefix="bench_train_step_") as tmp:
        for index in range(args.repeats):
            results["hp-rlvr"].append(run_once("hp-rlvr", 1, args, Path(tmp), index))
            results["grpo"].append(run_once("grpo", args.group, args, Path(tmp), index))
    median = {algo: {p: statistics.median(r[p] for r in runs) for p in PHASES} for algo, runs in results.items()}
    print(f"env={args.env} {args.env_kwargs} model={args.model} prompts/step={args.prompts} "
          f"max new tokens/turn={args.max_new_tokens} "
          f"GRPO G={args.group} steps={args.steps} repeats={args.repeats}")
    print(f"{'phase (s/step)':<18}{'HP-RLVR G=1':>14}{'GRPO G=' + str(args.group):>14}")
    for phase in PHASES:
        print(f"{phase:<18}{median['hp-rlvr'][phase]:>14.2f}{median['grpo'][phase]:>14.2f}")
    hp, grpo = median["hp-rlvr"], median["grpo"]
    print(f"step-time ratio GRPO / HP-RLVR: {grpo['time/total'] / hp['time/total']:.2f}x (target >= 3x)")
    print(f"hindsight / generation (HP-RLVR): {hp['time/hindsight'] / max(hp['time/generation'], 1e-9):.2f} "
          "(target <= 0.30)")


if __name__ == "__main__":
    main()
