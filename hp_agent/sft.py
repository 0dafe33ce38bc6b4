"""Supervised warm-up: teach a policy an env's answer format before RL.

A randomly initialized model never produces a verifiable answer, so every reward is 0
and neither algorithm has anything to learn from. A short pass of next-token training
on an env's demonstrations (the math env's worked solutions) gives a starting policy
whose rewards vary. The loss is the mean negative log-likelihood of the response tokens
(the eligible ones), end-of-turn token included; prompt tokens carry no loss.
"""

from __future__ import annotations

import io
import random
import shutil
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hp_agent.batching import span_hidden_states, token_budget_batches
from hp_agent.config import TrainConfig
from hp_agent.kernels import chunked_logprobs
from hp_agent.envs import make
from hp_agent.envs.alfworld.env import action_template_of
from hp_agent.errors import UserFileExistsError, UserValueError
from hp_agent.files import atomic_folder, atomic_write_bytes
from hp_agent.hindsight import ScoringOptions, hindsight_sequences, hindsight_span
from hp_agent.devices import resolve_device, resolve_dtype
from hp_agent.policies import LoadOptions, Policy, SamplingParams
from hp_agent.policies.lora import save_model
from hp_agent.progress import LoopProgress
from hp_agent.rollout import Episode, prompt_messages
from hp_agent.trajectory import Trajectory, read_jsonl, write_jsonl

LOG_EVERY = 50  # steps per plain progress line when the output is not a terminal


@dataclass
class SFTResult:
    out_dir: Path
    steps: int
    examples: int
    first_loss: float
    last_loss: float


# A supervised example: token ids, and the [start, end) spans of the tokens it teaches (a
# response; a chat-history episode's every answer).
Example = tuple[list[int], list[tuple[int, int]]]
MICRO_BATCH_TOKENS = 8192  # padded tokens a forward and backward pass of the warm-up holds at once


def demonstration_sequences(policy: Policy, env_name: str, env_kwargs: dict | None = None) -> list[Example]:
    """(prompt + response ids, the response's span) for every demonstration of an env."""
    env = make(env_name, **(env_kwargs or {}))
    sequences = []
    for observation, response in env.demonstrations():
        prompt = policy.render(prompt_messages(env, observation))
        ids = prompt + _response_ids(policy, response)
        sequences.append((ids, [(len(prompt), len(ids))]))
    if not sequences:
        raise UserValueError(f"env {env_name!r} gave no demonstrations")
    return sequences


def trajectory_sequences(path: str | Path, vocab_size: int) -> list[Example]:
    """The turns of a trajectory JSONL file as examples: a turn's prompt + action ids with
    the action's span, where a turn's prompt begins with the previous turn's prompt and
    action (a chat-history episode, e.g. ALFWorld's append mode) joined to it, so that an
    episode is one sequence teaching every answer, its shared prefix run once.

    The ids are used as stored (token in, token out); ids outside the model's vocabulary
    mean the file was tokenized for another model.
    """
    sequences: list[Example] = []
    for trajectory in read_jsonl(path):
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        for turn in trajectory.turns:
            if not turn.action_ids:
                continue
            if not ids or turn.prompt_ids[: len(ids)] != ids:
                if ids:
                    sequences.append((ids, spans))
                spans = []
            ids = turn.prompt_ids + turn.action_ids
            spans.append((len(turn.prompt_ids), len(ids)))
        if ids:
            sequences.append((ids, spans))
    if not sequences:
        raise UserValueError(f"{path}: no turns with action tokens to learn from")
    return _within_vocabulary(path, sequences, vocab_size)


def _within_vocabulary(path: str | Path, sequences: list[Example], vocab_size: int) -> list[Example]:
    """``sequences``, after checking that a file's stored ids fit the model being warmed up."""
    largest = max(max(ids) for ids, _ in sequences)
    if largest >= vocab_size:
        raise UserValueError(f"{path}: token id {largest} is outside the model's vocabulary ({vocab_size}); "
                             "write the file with the same --model you warm up")
    return sequences


@dataclass
class WarmupState:
    """What a warm-up needs to continue where it stopped: step, losses, optimizer,
    schedule and batch-sampler state (the model's weights are saved beside it)."""

    step: int
    losses: list[float]
    optimizer: dict
    schedule: dict
    shuffle: tuple


def supervised_warmup(
    policy: Policy,
    sequences: list[Example],
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress: bool = False,
    resume: WarmupState | None = None,
    save: Callable[[WarmupState], None] | None = None,
    save_every: int = 100,
    prompt_loss: float = 0.0,
    compute_dtype: str = "float32",
) -> list[float]:
    """Train on ``sequences`` for ``steps`` AdamW steps; returns the loss of each step.

    ``compute_dtype`` other than float32: forward and backward under autocast in that
    dtype, on the model's own (float32) weights, gradients and AdamW state.

    The loss is the mean NLL of the response tokens plus ``prompt_loss`` times that of the
    prompt tokens (0: responses only). A batch runs in micro-batches of at most
    ``MICRO_BATCH_TOKENS`` padded tokens, their gradients summed: the same update.

    ``resume`` continues an earlier call (same sequences and settings); ``save`` receives
    the state every ``save_every`` steps, after the weights of that step.
    """
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0 - k / max(steps, 1))
    shuffle = random.Random(seed)
    losses: list[float] = []
    if resume is not None:
        optimizer.load_state_dict(resume.optimizer)
        schedule.load_state_dict(resume.schedule)
        shuffle.setstate(resume.shuffle)
        losses = list(resume.losses)
    pad_id = policy.tokenizer.pad_token_id or 0
    device_type = next(policy.model.parameters()).device.type
    compute = (nullcontext() if compute_dtype == "float32"
               else torch.autocast(device_type, dtype=getattr(torch, compute_dtype)))
    policy.model.train()
    with LoopProgress("sft", steps, enabled=progress, every=LOG_EVERY, completed=len(losses)) as bar:
        for step in range(len(losses), steps):
            batch = shuffle.sample(sequences, min(batch_size, len(sequences)))
            optimizer.zero_grad(set_to_none=True)
            counts = _token_counts(batch, prompt_loss)
            loss = torch.zeros(())
            for micro in token_budget_batches([len(ids) for ids, _ in batch], MICRO_BATCH_TOKENS):
                with compute:
                    part = _batch_loss(policy, [batch[i] for i in micro], pad_id, prompt_loss, counts)
                part.backward()
                loss += part.detach().float().cpu()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            recent = losses[-LOG_EVERY:]
            bar.advance(1, f"loss {loss.item():.3f} (mean of the last {len(recent)}: {sum(recent) / len(recent):.4f})")
            if save is not None and (step + 1) % save_every == 0 and step + 1 < steps:
                save(WarmupState(step + 1, losses, optimizer.state_dict(), schedule.state_dict(), shuffle.getstate()))
    policy.model.eval()
    return losses


def expert_label_sequences(policy: Policy, path: str | Path) -> list[Example]:
    """DAgger: (prompt ids + the expert's advice, advice start) for every distinct turn of
    ``path`` that recorded one (:attr:`Turn.expert_action`), whatever action was taken
    there. A policy stuck in a loop sees one prompt many times: it is learnt once."""
    unique = {
        (tuple(turn.prompt_ids), action_template_of(turn.prompt_messages).format(action=turn.expert_action))
        for trajectory in read_jsonl(path)
        for turn in trajectory.turns
        if turn.expert_action
    }
    labelled = [(list(prompt), list(prompt) + _response_ids(policy, advice)) for prompt, advice in sorted(unique)]
    sequences = [(ids, [(len(prompt), len(ids))]) for prompt, ids in labelled]
    if not sequences:
        raise UserValueError(f"{path}: no turn records the expert's advice (write it with `hp-agent data alfworld --dagger`)")
    return _within_vocabulary(path, sequences, policy.model.get_input_embeddings().num_embeddings)


def _response_ids(policy: Policy, response: str) -> list[int]:
    return policy.tokenizer.encode(response, add_special_tokens=False) + [policy.tokenizer.eos_token_id]


def tokenize_demonstration(trajectory: Trajectory, policy: Policy) -> Trajectory:
    """Fill a text demonstration's prompt and action ids with ``policy``'s chat template
    and tokenizer. Demonstrations were not sampled, so ``sample_logprobs`` stays empty."""
    for turn in trajectory.turns:
        turn.prompt_ids = policy.render(turn.prompt_messages)
        turn.action_ids = _response_ids(policy, turn.action_text)
    return trajectory


def play_first_tasks(policy: Policy | str, env_name: str, env_kwargs: dict, limit: int | None, sampling: SamplingParams,
                     parallel_envs: int = 32, seed: int = 0, progress: bool = False, label: str = "play",
                     chat_history: bool = False, constrain: bool = False, workers: int = 1,
                     load: LoadOptions | None = None) -> list[Trajectory]:
    """``policy`` plays the first ``limit`` tasks of ``make(env_name, **env_kwargs)`` once
    each (seeded as an evaluation is; ``chat_history`` as ``rollout.chat_history``,
    ``constrain`` as ``rollout.constrain_to_admissible``). Its trajectories are DAgger's
    data (every turn keeps the env's expert advice: :func:`expert_label_sequences`) and the
    hindsight warm-up's (their realized futures and verdicts: :func:`hindsight_copies`).
    ``workers`` > 1: ``policy`` is a model's name or folder, loaded in that many processes
    that play a contiguous share of the tasks each (as ``evaluate(workers=...)``). ``load``:
    device, dtype and backend of a ``policy`` given by name."""
    from hp_agent.evaluation import ModelPlayer, Player, sharded_player

    envs = [make(env_name, **env_kwargs) for _ in range(1 if workers > 1 else min(parallel_envs, limit or parallel_envs))]
    try:
        task_ids = envs[0].task_ids()[:limit]
        episodes = [Episode(task_id, group=g) for g, task_id in enumerate(task_ids)]
        if workers > 1:
            if not isinstance(policy, str):
                raise UserValueError(f"workers={workers} loads the model in each worker process: pass its name or folder")
            player: Player = sharded_player(policy, env_name, env_kwargs, sampling, None, workers, parallel_envs,
                                            constrain, chat_history, load)
        else:
            player = ModelPlayer((load or LoadOptions()).load(policy) if isinstance(policy, str) else policy, envs, env_name, sampling, None,
                                 label, constrain, chat_history)
        with LoopProgress(f"{label} {env_name}", len(episodes), enabled=progress, every=parallel_envs) as bar:
            return player.play(episodes, seed, bar.advance)
    finally:
        for env in envs:
            env.close()


def _token_counts(batch: list[Example], prompt_loss: float) -> tuple[int, int]:
    """Response and prompt tokens of a batch (the prompt's from the second token, and only
    where ``prompt_loss`` > 0): the means' denominators, for every micro-batch alike."""
    response = sum(end - start for _, spans in batch for start, end in spans)
    prompt = sum(len(ids) - 1 for ids, _ in batch) - response if prompt_loss > 0 else 0
    return response, prompt


def _batch_loss(policy: Policy, batch: list[Example], pad_id: int, prompt_loss: float,
                counts: tuple[int, int]) -> torch.Tensor:
    """This micro-batch's share of the batch's mean response NLL, plus ``prompt_loss`` x
    mean prompt NLL (``counts``: the batch's response and prompt tokens). Predicting the
    prompt too (an env's observations, its admissible actions that repeat what was
    observed) gives a small model many more copying examples per sequence than the
    response alone."""
    first = [1 if prompt_loss > 0 else spans[0][0] for _, spans in batch]
    hidden = span_hidden_states(policy, [ids for ids, _ in batch], [(a, len(ids)) for a, (ids, _) in zip(first, batch)],
                                1 << 20, pad_id)
    response, prompt = [], []
    for h, a, (ids, spans) in zip(hidden, first, batch):
        logprobs = chunked_logprobs(h, torch.tensor(ids[a:]), policy.project)
        taught = torch.zeros(len(ids) - a, dtype=torch.bool)
        for start, end in spans:
            taught[start - a : end - a] = True
        response.append(logprobs[taught])
        prompt.append(logprobs[~taught])
    response_tokens, prompt_tokens = counts
    loss = -torch.cat(response).sum() / response_tokens
    if prompt_loss > 0:
        loss = loss - prompt_loss * torch.cat(prompt).sum() / max(prompt_tokens, 1)
    return loss


def hindsight_copies(policy: Policy, trajectories: list[Trajectory], options: ScoringOptions) -> list[Example]:
    """Every segment of every trajectory with its privileged block, as the hindsight scorer
    renders it: (hindsight prompt + segment ids, the segment's span)."""
    return [(ids, [hindsight_span(segment, ids)]) for _, segment, ids in hindsight_sequences(policy, trajectories, options)]


def sft(
    out_dir: str | Path,
    env: str = "alfworld",
    model: str = "tiny",
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 2e-3,
    seed: int = 0,
    data: str | Path | None = None,
    progress: bool = False,
    env_kwargs: dict | None = None,
    hindsight: bool = False,
    save_every: int = 100,
    expert_data: str | Path | None = None,
    prompt_loss: float = 0.0,
    hindsight_episodes: int = 64,
    hindsight_max_new_tokens: int = 64,
    config: TrainConfig | None = None,
    device: str = "auto",
    dtype: str = "auto",
) -> SFTResult:
    """Warm up ``model`` on ``data`` (trajectory JSONL) or else on ``env``'s train
    demonstrations (``env_kwargs`` for the env, e.g. the toy envs' ``demo_mistakes``),
    and save it as a Hugging Face folder.

    ``hindsight``: also learn every turn under its privileged block, as the hindsight
    scorer shows it (realized future and outcome), so that the model reads the block
    before RL asks it to: the turns of ``data``, or, without ``data``, of
    the first ``hindsight_episodes`` train tasks, which ``model`` plays once each first
    (temperature 1, ``hindsight_max_new_tokens`` a turn), beside the env's demonstrations.
    Any env works, single-step or multi-turn. ``expert_data``: a DAgger file (``hp-agent data
    alfworld --dagger``) whose turns are learnt with the expert's advice as the label, on
    top of ``data`` or the env's demonstrations. ``prompt_loss``: weight of the prompt
    tokens' NLL beside the response's (see :func:`supervised_warmup`). ``config``: the run to warm up for, whose
    ``hindsight`` section renders the privileged blocks as its scorer will (None: the defaults). Every ``save_every`` steps the state goes to
    ``<out_dir>.partial/``; a call with the same arguments continues from there.
    ``device`` and ``dtype`` (auto: CUDA and bfloat16 where a GPU is, else the CPU and
    float32): the weights stay float32 (AdamW on bfloat16 weights drops most small
    updates), and a bfloat16 or float16 dtype is the compute's, under autocast.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserFileExistsError(f"{str(out_dir)!r} exists and is not empty; choose another --out")
    if hindsight and data is None and hindsight_episodes < 1:
        raise UserValueError(f"hindsight_episodes must be >= 1 to build privileged blocks without --data, got {hindsight_episodes}")
    device = resolve_device(device)
    compute_dtype = resolve_dtype(dtype, device)
    partial = out_dir.with_name(f"{out_dir.name}.partial")
    scoring = ScoringOptions.from_config(config)
    settings = {"env": env, "model": model, "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
                "data": str(data), "env_kwargs": env_kwargs or {}, "hindsight": hindsight,
                "expert_data": str(expert_data), "prompt_loss": prompt_loss, "hindsight_episodes": hindsight_episodes,
                "hindsight_max_new_tokens": hindsight_max_new_tokens, "scoring": asdict(scoring),
                "compute_dtype": compute_dtype}
    resume = _load_partial(partial, settings)
    torch.manual_seed(seed)
    policy = LoadOptions(device, "float32").load(str(partial / "model") if resume is not None else model)
    if data is not None:
        sequences = trajectory_sequences(data, policy.model.get_input_embeddings().num_embeddings)
        if hindsight:
            sequences += hindsight_copies(policy, list(read_jsonl(data)), scoring)
    else:
        sequences = demonstration_sequences(policy, env, {"split": "train", **(env_kwargs or {})})
        if hindsight:
            # Played by the starting model before the first step and kept beside the partial state, so that a
            # resumed warm-up learns the same copies.
            plays = partial / "hindsight_play.jsonl"
            if resume is None or not plays.is_file():
                played = play_first_tasks(policy, env, {"split": "train", **(env_kwargs or {})}, hindsight_episodes,
                                          SamplingParams(max_new_tokens=hindsight_max_new_tokens), seed=seed, label="hindsight")
                write_jsonl(plays, [t for t in played if not t.errored])
            sequences += hindsight_copies(policy, list(read_jsonl(plays)), scoring)
    if expert_data is not None:
        sequences += expert_label_sequences(policy, expert_data)

    def save(state: WarmupState) -> None:
        _save_model(policy, partial / "model")
        atomic_write_bytes(partial / "state.pt", _state_bytes({"settings": settings, "state": state}))

    losses = supervised_warmup(policy, sequences, steps, batch_size, lr, seed, progress, resume, save, save_every, prompt_loss,
                               compute_dtype)
    _save_model(policy, out_dir)
    shutil.rmtree(partial, ignore_errors=True)
    return SFTResult(out_dir, steps, len(sequences), losses[0] if losses else float("nan"), losses[-1] if losses else float("nan"))


def _save_model(policy: Policy, final: Path) -> None:
    """Write the model and tokenizer as ``final`` (replacing an empty --out, checked by sft, or
    the previous partial model), through a temporary folder."""
    with atomic_folder(final, replace=True) as tmp:
        save_model(policy.model, policy.tokenizer, tmp)


def _state_bytes(payload: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _load_partial(partial: Path, settings: dict) -> WarmupState | None:
    """The saved state of an interrupted warm-up with these ``settings``, else None."""
    if not (partial / "state.pt").is_file() or not (partial / "model").is_dir():
        return None
    payload = torch.load(partial / "state.pt", map_location="cpu", weights_only=False)
    if payload["settings"] != settings:
        changed = sorted(k for k in settings if payload["settings"].get(k) != settings[k])
        raise UserValueError(f"{partial} holds an interrupted warm-up with other settings ({', '.join(changed)}); "
                             "rerun with its settings or delete the folder")
    return payload["state"]
