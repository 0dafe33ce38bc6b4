"""hp-agent against TRL's GRPOTrainer on the same work: seconds per step, per generated token, by phase.

    make bench-trl        # builds .venv-trl (trl with the CPU torch), then runs this
    .venv-trl/bin/python bench/vs_trl.py [--prompts 4 --group 8 --max-new-tokens 64 --steps 6 --repeats 2]

Four runs, each in its own process with one torch thread, alternated ``--repeats``
times so that the machine's load hits them alike:

* ``trl``: TRL's ``GRPOTrainer`` (transformers ``generate`` on transformers' ``sdpa``
  attention, ``beta=0`` so no reference model, one optimizer step per generation batch,
  no gradient checkpointing), on our prompts' token ids;
* ``trl-own``: the same on TRL's own default for a conversational dataset, the question
  as the one user message (no system prompt), as a TRL user would start: the second row;
* ``grpo``: ``hp_agent.train`` with GRPO, G rollouts per prompt;
* ``hp-rlvr``: ``hp_agent.train`` with HP-RLVR, one rollout per prompt.

All train the same model (the embedded tiny Qwen3) on the same math prompts, in
the same order, rendered to the same token ids in the first row (checked: the script stops
if TRL's chat template gives other ids), with the same sampling (temperature 1, no top-p, no top-k),
completion cap, learning rate and one optimizer step per step. Step times are medians
over steps 2..N (the first step pays one-off costs). What cannot be equalled is printed
with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LR = 1e-5
SEED = 0


def _tasks(prompts: int, steps: int) -> list[str]:
    """The task ids hp_agent's trainer plays, step by step, in its order."""
    from hp_agent.envs import make
    from hp_agent.trainer import TaskSampler

    sampler = TaskSampler(make("math", split="train").task_ids(), SEED)
    return [task for _ in range(steps) for task in sampler.take(prompts)]


def _run_trl(args: argparse.Namespace, out: Path, own_prompts: bool = False) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hp_agent.envs import make
    from hp_agent.policies import load_policy
    from hp_agent.rollout import prompt_messages

    torch.set_num_threads(1)
    policy = load_policy("tiny")
    env = make("math", split="train")
    rows = []
    for task_id in _tasks(args.prompts, args.steps):
        observation, _ = env.reset(options={"task_id": task_id})
        messages = [{"role": "user", "content": observation}] if own_prompts else prompt_messages(env, observation)
        rows.append({"prompt": messages, "answer": env.reference_answer(task_id), "ids": policy.render(messages)})
    rendered = [policy.tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                                     enable_thinking=False, return_dict=False) for r in rows]
    if [list(ids) for ids in rendered] != [r["ids"] for r in rows]:
        raise SystemExit("TRL's chat template renders other token ids than hp_agent's: the work is not the same")

    def reward(completions, answer, **_):
        from hp_agent.verifiers.math import verify_math

        return [verify_math(c[-1]["content"] if isinstance(c, list) else c, a).reward for c, a in zip(completions, answer)]

    times: dict[str, list[float]] = {"step": [], "generation": []}
    tokens: list[int] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.started, self.generated = time.perf_counter(), 0.0

        def on_step_end(self, *_, **__):
            times["step"].append(time.perf_counter() - self.started)
            times["generation"].append(self.generated)

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "completions/mean_length" in logs:  # TRL's own count, end-of-turn token included
                tokens.append(round(float(logs["completions/mean_length"]) * args.prompts * args.group))

    clock = StepClock()
    config = GRPOConfig(output_dir=str(out), per_device_train_batch_size=args.prompts * args.group,
                        num_generations=args.group, max_completion_length=args.max_new_tokens, learning_rate=LR,
                        lr_scheduler_type="constant", beta=0.0, num_iterations=1, gradient_accumulation_steps=1, max_steps=args.steps,
                        temperature=1.0, top_p=1.0, top_k=0, logging_steps=1, report_to="none", save_strategy="no",
                        use_cpu=True, bf16=False, seed=SEED, shuffle_dataset=False, gradient_checkpointing=False,
                        chat_template_kwargs={"enable_thinking": False}, disable_dropout=True, dataloader_num_workers=0)
    model = policy.model
    model.set_attn_implementation("sdpa")  # as a TRL user loads it: transformers' default, not our decode attention
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, processing_class=policy.tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]),
                          callbacks=[clock])
    generate = trainer.model.generate

    def timed_generate(*a, **k):  # measurement only: how long TRL's rollout takes
        started = time.perf_counter()
        output = generate(*a, **k)
        clock.generated += time.perf_counter() - started
        return output

    trainer.model.generate = timed_generate
    trainer.train()
    return {"step_s": times["step"], "generation_s": times["generation"], "completion_tokens": tokens,
            "prompt_tokens": statistics.mean(len(r["ids"]) for r in rows)}


def _run_ours(args: argparse.Namespace, algo: str, out: Path) -> dict:
    import hp_agent
    from hp_agent.files import read_jsonl_records

    group = args.group if algo == "grpo" else 1
    config = {"env": {"name": "math"}, "model": {"name": "tiny"},
              "algo": {"name": algo, **({"group_size": group} if algo == "grpo" else {})},
              "rollout": {"max_new_tokens": args.max_new_tokens, "temperature": 1.0, "top_p": 1.0},
              "learner": {"lr": LR, "mini_batch_prompts": args.prompts},
              "trainer": {"steps": args.steps, "prompts_per_step": args.prompts, "run_dir": str(out), "name": algo,
                          "seed": SEED, "torch_threads": 1, "checkpoint_every": 10**6, "views_per_step": 0}}
    run = hp_agent.train(config, progress=False).run_dir
    metrics = read_jsonl_records(run / "metrics.jsonl")
    trajectories = read_jsonl_records(run / "trajectories.jsonl")
    tokens = [sum(len(turn["action_ids"]) for t in trajectories if t["step"] == step for turn in t["turns"])
              for step in range(args.steps)]
    prompts = [len(turn["prompt_ids"]) for t in trajectories for turn in t["turns"]]
    return {"step_s": [m["time/total"] for m in metrics], "generation_s": [m["time/generation"] for m in metrics],
            "completion_tokens": tokens, "prompt_tokens": statistics.mean(prompts),
            "phases": {k: statistics.median(m[k] for m in metrics[1:]) for k in metrics[0] if k.startswith("time/")}}


def _one(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as folder:
        if args.one.startswith("trl"):
            result = _run_trl(args, Path(folder), own_prompts=args.one == "trl-own")
        else:
            result = _run_ours(args, args.one, Path(folder))
    print("RESULT " + json.dumps(result))


def _median_after_first(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=["trl", "trl-own", "grpo", "hp-rlvr"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return _one(args)
    runs: dict[str, list[dict]] = {"trl": [], "trl-own": [], "grpo": [], "hp-rlvr": []}
    for _ in range(args.repeats):
        for name in runs:
            command = [sys.executable, __file__, "--one", name, "--prompts", str(args.prompts), "--group", str(args.group),
                       "--max-new-tokens", str(args.max_new_tokens), "--steps", str(args.steps)]
            done = subprocess.run(command, capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not lines:
                raise SystemExit(f"{name} run failed:\n{done.stderr[-3000:]}")
            runs[name].append(json.loads(lines[-1].removeprefix("RESULT ")))
    print(f"{args.prompts} prompts x G={args.group} (HP-RLVR: G=1), at most {args.max_new_tokens} new tokens, "
          f"{args.steps} steps, medians of steps 2-{args.steps}, {args.repeats} runs each, alternated; one torch thread")
    print("| run | s/step | generation s/step | completion tokens/step | tokens/s | prompt tokens |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for name, results in runs.items():
        step = [_median_after_first(r["step_s"]) for r in results]
        generation = [_median_after_first(r["generation_s"]) for r in results]
        tokens = [statistics.mean(r["completion_tokens"]) for r in results]
        summary[name] = {"step": statistics.median(step), "tokens": statistics.median(tokens),
                         "generation": statistics.median(generation)}
        print(f"| {name} | {' / '.join(f'{s:.2f}' for s in step)} | {' / '.join(f'{g:.2f}' for g in generation)} | "
              f"{statistics.median(tokens):.0f} | {' / '.join(f'{t / s:.0f}' for t, s in zip(tokens, step))} | "
              f"{statistics.mean(r['prompt_tokens'] for r in results):.1f} |")
    rounds = [(_median_after_first(t["step_s"]) / _median_after_first(g["step_s"]),
               _median_after_first(o["step_s"]) / _median_after_first(g["step_s"]),
               _median_after_first(t["step_s"]) / _median_after_first(h["step_s"]))
              for t, o, g, h in zip(runs["trl"], runs["trl-own"], runs["grpo"], runs["hp-rlvr"])]
    print("per alternated round, TRL's GRPO step / ours, identical ids: " + ", ".join(f"{r[0]:.2f}x" for r in rounds)
          + "; TRL on its own default prompts / ours: " + ", ".join(f"{r[1]:.2f}x" for r in rounds)
          + "; TRL's GRPO / our HP-RLVR: " + ", ".join(f"{r[2]:.2f}x" for r in rounds))
    trl, own, grpo, hp = summary["trl"], summary["trl-own"], summary["grpo"], summary["hp-rlvr"]
    per_token = (trl["step"] / trl["tokens"]) / (grpo["step"] / grpo["tokens"])
    print(f"ratios of the medians, TRL's GRPO step / our GRPO step: identical ids {trl['step'] / grpo['step']:.2f}x "
          f"(target >= 1.5), per generated token {per_token:.2f}x; each on its own default prompts "
          f"{own['step'] / grpo['step']:.2f}x; TRL's GRPO step / our HP-RLVR step = {trl['step'] / hp['step']:.2f}x; "
          f"generation tokens/s ours / TRL's = "
          f"{(grpo['tokens'] / grpo['generation']) / (trl['tokens'] / trl['generation']):.2f}x (target >= 1.0)")
    print("our phases (median s/step): " + "; ".join(
        f"{name}: " + ", ".join(f"{k.removeprefix('time/')} {v:.2f}" for k, v in runs[name][0]["phases"].items())
        for name in ("grpo", "hp-rlvr")))
    print("not equalled: TRL computes rewards on decoded completions through its own dataloader and logging; "
          "ours plays each completion through the math env (verify + verdict) and logs trajectories and metrics to disk")


if __name__ == "__main__":
    main()
