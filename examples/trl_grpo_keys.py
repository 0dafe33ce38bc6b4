"""TRL's GRPOTrainer on an hp_agent env: keys here, any registered env the same way.

    make test-trl                                      # builds .venv-trl (trl 1.16), runs this once
    .venv-trl/bin/python examples/trl_grpo_keys.py --steps 1
    .venv-trl/bin/python examples/trl_grpo_keys.py --model Qwen/Qwen3-0.6B --env alfworld --steps 50   # a GPU

The env reaches TRL through ``hp_agent.envs.tool_env``: one instance per rollout, its
``act`` tool stepping the env, the episode's return as the reward. TRL needs a chat
template that renders tool calls and one whose calls it can parse (Qwen3's, Llama 3.1's,
...). A Qwen3 checkpoint has it. The embedded tiny model has a bare template, so this
script gives it the Qwen3 template that TRL ships, which is the same token layout
(``<|im_start|>``...). Neither the tiny model nor smollm2-135m (``--qwen3-template``) has
learned to call tools: on this machine each made 0 tool calls in 8 rollouts, so every
reward was 0 and the step's gradient was 0. The step shows TRL's loop, our env and its
reward running end to end; a tool-calling model (Qwen3) is what makes it learn.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2-135m, a folder or a hub id")
    parser.add_argument("--env", default="keys")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--qwen3-template", action="store_true", help="give the model TRL's Qwen3 chat template")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt (TRL's num_generations)")
    parser.add_argument("--max-completion-length", type=int, default=256)
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL 1.16
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from hp_agent.envs.tool_env import environment_factory, task_rows
    from hp_agent.policies import load_policy

    policy = load_policy(args.model)
    tokenizer, model = policy.tokenizer, policy.model
    if args.model == "tiny" or args.qwen3_template:
        tokenizer.chat_template = qwen3_chat_template
    model.set_attn_implementation("sdpa")  # transformers' default, as a TRL user loads a model
    rows = task_rows(args.env, limit=args.prompts * args.steps)
    config = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-keys-"), max_steps=args.steps,
                        per_device_train_batch_size=args.prompts * args.group, num_generations=args.group,
                        max_completion_length=args.max_completion_length, max_tool_calling_iterations=make_turns(args.env),
                        beta=0.0, learning_rate=1e-5, logging_steps=1, report_to="none", save_strategy="no",
                        use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(),
                        chat_template_kwargs={"enable_thinking": False}, shuffle_dataset=False, seed=0)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, environment_factory=environment_factory(args.env),
                          train_dataset=Dataset.from_list(rows), args=config)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    for entry in logged:
        tools = {key: value for key, value in entry.items() if key.startswith("tools/")}
        print(f"step {entry['step']}: reward {entry['reward']:+.3f} (std {entry.get('reward_std', 0.0):.3f}), "
              f"completion length {entry.get('completions/mean_length', 0.0):.1f}, {tools}")
    print(f"trained {trainer.state.global_step} GRPOTrainer step(s) on {args.env} "
          f"({args.prompts} prompts x {args.group} rollouts each)")


def make_turns(env: str) -> int:
    """TRL's bound on tool calls per rollout: the env's own turn limit."""
    from hp_agent.envs import make

    built = make(env)
    try:
        return built.max_turns
    finally:
        built.close()


if __name__ == "__main__":
    main()
