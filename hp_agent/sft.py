"""Supervised warm-up: teach a policy an env's answer format before RL.

A randomly initialized model never produces a verifiable answer, so every reward is 0
and neither algorithm has anything to learn from. A short pass of next-token training
on an env's demonstrations (the math env's worked solutions) gives a starting policy
whose rewards vary. The loss is the mean negative log-likelihood of the response tokens
(the eligible ones), end-of-turn token included; prompt tokens carry no loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import Progress

from hp_agent.batching import span_hidden_states
from hp_agent.credit import chunked_logprobs
from hp_agent.envs import make
from hp_agent.policies import Policy, load_policy
from hp_agent.rollout import prompt_messages
from hp_agent.trajectory import read_jsonl


@dataclass
class SFTResult:
    out_dir: Path
    steps: int
    examples: int
    first_loss: float
    last_loss: float


def demonstration_sequences(policy: Policy, env_name: str, env_kwargs: dict | None = None) -> list[tuple[list[int], int]]:
    """(prompt + response ids, response start) for every demonstration of an env."""
    env = make(env_name, **(env_kwargs or {}))
    sequences = []
    for observation, response in env.demonstrations():
        prompt = policy.render(prompt_messages(env, observation))
        response_ids = policy.tokenizer.encode(response, add_special_tokens=False) + [policy.tokenizer.eos_token_id]
        sequences.append((prompt + response_ids, len(prompt)))
    if not sequences:
        raise ValueError(f"env {env_name!r} gave no demonstrations")
    return sequences


def trajectory_sequences(path: str | Path, vocab_size: int) -> list[tuple[list[int], int]]:
    """(prompt + action ids, action start) for every turn of a trajectory JSONL file.

    The ids are used as stored (token in, token out); ids outside the model's vocabulary
    mean the file was tokenized for another model.
    """
    sequences = [
        (turn.prompt_ids + turn.action_ids, len(turn.prompt_ids))
        for trajectory in read_jsonl(path)
        for turn in trajectory.turns
        if turn.action_ids
    ]
    if not sequences:
        raise ValueError(f"{path}: no turns with action tokens to learn from")
    largest = max(max(ids) for ids, _ in sequences)
    if largest >= vocab_size:
        raise ValueError(f"{path}: token id {largest} is outside the model's vocabulary ({vocab_size}); "
                         "write the demonstrations with the same --model you warm up")
    return sequences


def supervised_warmup(
    policy: Policy, sequences: list[tuple[list[int], int]], steps: int, batch_size: int = 16, lr: float = 1e-3, seed: int = 0, progress: bool = False
) -> list[float]:
    """Train on ``sequences`` for ``steps`` AdamW steps; returns the loss of each step."""
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0 - k / max(steps, 1))
    shuffle = random.Random(seed)
    pad_id = policy.tokenizer.pad_token_id or 0
    losses = []
    policy.model.train()
    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task("sft", total=steps)
        for _ in range(steps):
            batch = shuffle.sample(sequences, min(batch_size, len(sequences)))
            hidden = span_hidden_states(policy, [s for s, _ in batch], [(start, len(s)) for s, start in batch], 1 << 20, pad_id)
            logprobs = torch.cat([chunked_logprobs(h, torch.tensor(s[start:]), policy.project) for h, (s, start) in zip(hidden, batch)])
            loss = -logprobs.mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            bar.update(job, advance=1, description=f"sft loss {loss.item():.3f}")
    policy.model.eval()
    return losses


def sft(
    out_dir: str | Path,
    env: str = "alfworld",
    model: str = "tiny",
    steps: int = 300,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    data: str | Path | None = None,
    progress: bool = False,
    env_kwargs: dict | None = None,
) -> SFTResult:
    """Warm up ``model`` on ``data`` (trajectory JSONL) or else on ``env``'s train
    demonstrations (``env_kwargs`` for the env, e.g. the toy envs' ``demo_mistakes``),
    and save it as a Hugging Face folder."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{str(out_dir)!r} exists and is not empty; choose another --out")
    torch.manual_seed(seed)
    policy = load_policy(model)
    if data is not None:
        sequences = trajectory_sequences(data, policy.model.get_input_embeddings().num_embeddings)
    else:
        sequences = demonstration_sequences(policy, env, {"split": "train", **(env_kwargs or {})})
    losses = supervised_warmup(policy, sequences, steps, batch_size, lr, seed, progress)
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    policy.model.save_pretrained(tmp, safe_serialization=True)
    policy.tokenizer.save_pretrained(tmp)
    if out_dir.exists():
        out_dir.rmdir()  # empty: checked above
    tmp.replace(out_dir)
    return SFTResult(out_dir, steps, len(sequences), losses[0] if losses else float("nan"), losses[-1] if losses else float("nan"))
