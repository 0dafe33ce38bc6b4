"""Rollout: play many episodes at once and record them token in, token out.

Each turn, every live episode's observation is rendered to prompt ids (system prompt +
user observation, through the model's chat template), all prompts are sampled in one
batched call, each action is decoded, and all actions go to the env pool in one
``step_many`` call (envs step in parallel when the pool has worker processes).
Generation and environment time are measured separately (paper Table 2's "rollout
generation" and "environment stepping"). An env that fails (raises, crashes its
worker, times out) ends its episode as ``errored``; the others go on.

What answers the prompts is an :class:`Actor`: :func:`collect` plays a model
(:class:`ModelActor`), :func:`play` any actor, e.g. the scripted ALFWorld players of
:mod:`hp_agent.scripted_play`. Both go through the one loop below, so a
demonstration's prompts are rendered exactly as a model's RL prompts are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hp_agent.constraint import ActionTrie
from hp_agent.envs.base import TextEnv
from hp_agent.envs.pool import EnvError, EnvPool, LocalPool
from hp_agent.errors import UserValueError
from hp_agent.policies import Generation, Policy, SamplingParams
from hp_agent.trajectory import Trajectory, Turn


@dataclass(frozen=True)
class Episode:
    """One episode to play: which task, and which prompt group it belongs to."""

    task_id: str
    group: int = 0


@dataclass
class PhaseTimes:
    """Seconds spent per phase; keys are the metric names (``time/...``)."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds


@dataclass(frozen=True)
class Ask:
    """One live episode's prompt: ``episode`` is its index in the played list (the key
    of any per-episode state), ``info`` the env's latest info (its reset's, then each step's)."""

    episode: int
    messages: list[dict[str, str]]
    info: dict[str, Any]


@dataclass
class Reply:
    """An actor's response to one :class:`Ask`: its text, and for a model the token ids
    it was sampled as. A reply without ids (a scripted one) is recorded as text only."""

    text: str
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = True  # False: cut before the end-of-turn token (Turn.truncated)
    allowed: list[list[int] | None] | None = None
    prompt_messages: list[dict[str, str]] | None = None  # set where the actor shortened the ask's conversation


class Actor(Protocol):
    """What answers every live episode's prompt, turn after turn."""

    def start(self, episode: int, seed: int, info: dict[str, Any]) -> None:
        """Episode ``episode`` was reset with ``seed`` and answered ``info``."""
        ...

    def act(self, asks: list[Ask]) -> list[Reply]:
        """One reply per ask, in order (all live episodes' turns in one call: a model batches them)."""
        ...


@dataclass
class ModelActor:
    """A model sampled with ``sampling``. ``action_template`` set: every response is one of
    the env's ``info["admissible_actions"]`` in that template (``rollout.constrain_to_admissible``)."""

    policy: Policy
    sampling: SamplingParams
    env_name: str
    action_template: str | None = None
    history_tokens: int | None = None  # rollout.history_tokens: the bound of a chat-history prompt

    def start(self, episode: int, seed: int, info: dict[str, Any]) -> None:
        """Nothing to prepare: sampling draws from torch's generator, seeded by the caller."""

    def act(self, asks: list[Ask]) -> list[Reply]:
        fitted = [bounded_history(ask.messages, self.policy.render, self.history_tokens) for ask in asks]
        prompts = [prompt_ids for _, prompt_ids in fitted]
        template = self.action_template
        tries = [self._action_trie(ask.info, template) for ask in asks] if template is not None else None
        generations = self.policy.generate(prompts, self.sampling, tries)
        return [self._reply(ask, messages, prompt_ids, g) for ask, (messages, prompt_ids), g in zip(asks, fitted, generations)]

    def _reply(self, ask: Ask, messages: list[dict[str, str]], prompt_ids: list[int], g: Generation) -> Reply:
        return Reply(self.policy.decode(g.token_ids), prompt_ids, g.token_ids, g.logprobs, g.finished, g.allowed,
                     messages if messages is not ask.messages else None)

    def _action_trie(self, info: dict[str, Any], template: str) -> ActionTrie | None:
        """The trie of the responses a turn may end as: the admissible actions in the env's template.
        None where the env admits nothing (a dead end): that turn is sampled free, as it would be unrestricted."""
        actions = info.get("admissible_actions")
        if actions is None:
            raise UserValueError(f"rollout.constrain_to_admissible needs an env that lists info['admissible_actions']; "
                                 f"{self.env_name} lists none (valid for alfworld, keys, keystep, fetch)")
        if not actions:
            return None
        responses = [template.format(action=action) for action in actions]
        return ActionTrie.of_responses(responses, lambda text: self.policy.tokenizer.encode(text, add_special_tokens=False),
                                       self.policy.eos_token_id)


# Tokens allowed for one turn's own prompt text (system prompt, observation, chat template)
# when bounding a rollout's sequences. The shipped envs' longest, measured with the tiny
# model's tokenizer (a small vocabulary: more tokens per word than Qwen3's): ALFWorld 809
# (12 train games, 7 turns each), code 403, fetch 94, math 103, keys 57.
PROMPT_TOKENS = 2048
# rollout.history_tokens' default (tests/test_prompt_modes.py checks they agree): the bound
# of a chat-history prompt where no config gives one (evaluation).
HISTORY_TOKENS = 4096


def sampled_tokens_bound(max_new_tokens: int, turns: int, chat_history: bool, history_tokens: int | None = HISTORY_TOKENS,
                         prompt_tokens: int = PROMPT_TOKENS) -> int:
    """The longest sequence (prompt and answer) that one sampling request of a rollout
    reaches when each turn's own prompt text is at most ``prompt_tokens``: one prompt and
    its answer, or with ``chat_history`` the conversation at its last turn, ``turns``
    prompts and answers (see :func:`_next_messages`), at most ``history_tokens`` of prompt
    (:func:`bounded_history`; the task and the latest observation always stay). The vllm
    engine's default ``max_model_len``; hindsight blocks are scored by the transformers
    copy, not sampled."""
    if not chat_history:
        return prompt_tokens + max_new_tokens
    conversation = turns * (prompt_tokens + max_new_tokens)
    if history_tokens is None:
        return conversation
    return min(conversation, max(history_tokens, 2 * prompt_tokens) + max_new_tokens)


def bounded_history(messages: list[dict[str, str]], render: Callable[[list[dict[str, str]]], list[int]],
                    history_tokens: int | None) -> tuple[list[dict[str, str]], list[int]]:
    """``messages`` and their prompt ids, shortened where they render to more than
    ``history_tokens`` (None: no bound): the system prompt and the first user message (the
    task) stay, and the oldest exchanges after them go, an (assistant, user) pair at a
    time, until at most half the bound is left or only the last answer and the latest
    observation follow the task (roles still alternate). Halving, not trimming to the bound, lets the following turns again extend one
    cached prefix for a while instead of each dropping a pair and running everything again."""
    prompt_ids = render(messages)
    if history_tokens is None or len(prompt_ids) <= history_tokens:
        return messages, prompt_ids
    head = next(i for i, message in enumerate(messages) if message["role"] == "user") + 1
    kept = messages[head:]
    while len(kept) > 2:
        kept = kept[2:]
        prompt_ids = render(messages[:head] + kept)
        if len(prompt_ids) <= history_tokens // 2:
            break
    return messages[:head] + kept, prompt_ids


def prompt_messages(env: TextEnv | EnvPool, observation: str) -> list[dict[str, str]]:
    system = [{"role": "system", "content": env.system_prompt}] if env.system_prompt else []
    return system + [{"role": "user", "content": observation}]


def _next_messages(pool: EnvPool, previous: Turn | None, observation: str, chat_history: bool) -> list[dict[str, str]]:
    """The prompt of a turn: the env's observation alone, or with ``chat_history`` the
    whole conversation so far (earlier prompts, the actions taken, the new observation)."""
    if chat_history and previous is not None:
        return previous.prompt_messages + [
            {"role": "assistant", "content": previous.action_text},
            {"role": "user", "content": observation},
        ]
    return prompt_messages(pool, observation)


def _mark_errored(trajectory: Trajectory, error: EnvError) -> None:
    trajectory.errored = True
    trajectory.info["error"] = str(error)
    trajectory.info["traceback"] = error.traceback


def _finish_turn(trajectory: Trajectory, turn: Turn, step_out: tuple, failure_reward: float, truncated_invalid: bool) -> bool:
    """Record the env's answer to ``turn``; True when the episode is over."""
    observation, reward, terminated, truncated, info = step_out
    # Multi-turn envs whose observation is a whole prompt put the new game text alone in
    # info["game_text"]: that, not the prompt, is what hindsight shows as the future.
    turn.observation = str(info.get("game_text", observation) or "")
    turn.reward = float(reward)
    turn.shaping = float(info.get("shaping", 0.0))
    turn.action = str(info.get("action", turn.action_text))
    turn.invalid = bool(info.get("invalid_action", False)) or (truncated_invalid and turn.truncated)
    trajectory.turns.append(turn)
    verdict = info.get("verdict")
    if verdict is not None:
        trajectory.reward = verdict.reward
        trajectory.feedback = verdict.feedback
        trajectory.success = verdict.success
    if truncated and not terminated:
        if verdict is None:  # the env's own time limit, without a verdict of its own
            _cut_off(trajectory, len(trajectory.turns), failure_reward)
        trajectory.truncated = True
    return terminated or truncated


def collect(
    policy: Policy,
    envs: list[TextEnv] | EnvPool,
    env_name: str,
    episodes: list[Episode],
    sampling: SamplingParams,
    max_turns: int | None = None,
    seed: int = 0,
    times: PhaseTimes | None = None,
    chat_history: bool = False,
    truncated_invalid: bool = False,
    constrain: bool = False,
    on_wave: Callable[[list[Trajectory]], None] | None = None,
    history_tokens: int | None = HISTORY_TOKENS,
) -> list[Trajectory]:
    """Play ``episodes`` with a model sampled with ``sampling``: :func:`play` with a :class:`ModelActor`.

    ``constrain`` (``rollout.constrain_to_admissible``): every response is one of the env's
    ``info["admissible_actions"]`` in its ``action_template``, then the end-of-turn token
    (:mod:`hp_agent.constraint`); each turn records the allowed sets it was sampled among.
    ``history_tokens`` (``rollout.history_tokens``): with ``chat_history``, the bound of a
    prompt (:func:`bounded_history`).
    """
    pool = _as_pool(envs)
    actor = ModelActor(policy, sampling, env_name, pool.action_template if constrain else None,
                       history_tokens if chat_history else None)
    return play(actor, pool, env_name, episodes, max_turns, seed, times, chat_history, truncated_invalid, on_wave)


def play(
    actor: Actor,
    envs: list[TextEnv] | EnvPool,
    env_name: str,
    episodes: list[Episode],
    max_turns: int | None = None,
    seed: int = 0,
    times: PhaseTimes | None = None,
    chat_history: bool = False,
    truncated_invalid: bool = False,
    on_wave: Callable[[list[Trajectory]], None] | None = None,
) -> list[Trajectory]:
    """Play ``episodes`` on ``envs`` (one env slot per live episode, in waves) and return them in order.

    ``chat_history``: prompt each turn with the whole conversation so far instead of the
    env's latest observation alone (pair it with an env that sends only new text, e.g.
    ALFWorld's ``prompt_mode="chat"``).

    A turn whose reply stopped before the end-of-turn token is marked ``truncated``.
    ``truncated_invalid`` (``rollout.truncated_turn=invalid``) makes it an invalid action:
    the env is sent an empty action instead of the cut text, so it answers with its own
    invalid-action cost (``info["shaping"]``, e.g. ALFWorld's -0.1), and the turn is marked
    ``invalid`` whatever the env says.

    ``envs`` is an :class:`EnvPool` (envs stepped in worker processes) or a list of envs,
    played in this process. Episode ``k`` of a wave plays with seed ``seed + wave start + k``
    on slot ``pool.balanced_slots(len(wave))[k]``: adjacent episodes (a prompt's copies)
    on one worker, each worker as busy as the others. ``on_wave`` is called with each
    wave's trajectories as it ends (progress bars).
    """
    pool = _as_pool(envs)
    times = times if times is not None else PhaseTimes()
    results: list[Trajectory] = []
    for wave_start in range(0, len(episodes), pool.num_envs):
        wave = episodes[wave_start : wave_start + pool.num_envs]
        played = _play_wave(actor, pool, env_name, wave, wave_start, max_turns, seed + wave_start, times, chat_history,
                            truncated_invalid)
        results.extend(played)
        if on_wave is not None:
            on_wave(played)
    return results


def _as_pool(envs: list[TextEnv] | EnvPool) -> EnvPool:
    pool = envs if isinstance(envs, EnvPool) else LocalPool(envs) if envs else None
    if pool is None:
        raise ValueError("collect needs at least one env")
    return pool


def _play_wave(
    actor: Actor,
    pool: EnvPool,
    env_name: str,
    wave: list[Episode],
    first_index: int,
    max_turns: int | None,
    seed: int,
    times: PhaseTimes,
    chat_history: bool,
    truncated_invalid: bool,
) -> list[Trajectory]:
    """Play one wave; its episode ``k`` is episode ``first_index + k`` of the played list."""
    multi_turn = pool.max_turns > 1
    trajectories = [Trajectory(env=env_name, task_id=e.task_id, task_type="", group=e.group, multi_turn=multi_turn) for e in wave]
    slot_of = pool.balanced_slots(len(wave))  # episode k plays on slot slot_of[k]
    started = time.perf_counter()
    resets = pool.reset_many([(slot_of[k], seed + k, {"task_id": e.task_id}) for k, e in enumerate(wave)])
    times.add("time/env_step", time.perf_counter() - started)
    observations: dict[int, str] = {}  # episode index -> observation, for live episodes
    infos: dict[int, dict[str, Any]] = {}  # episode index -> the env's latest info (expert advice, admissible actions)
    for k, (trajectory, result) in enumerate(zip(trajectories, resets)):
        if isinstance(result, EnvError):  # one broken episode must not stop the batch
            _mark_errored(trajectory, result)
            continue
        observations[k], infos[k] = result
        actor.start(first_index + k, seed + k, infos[k])
        trajectory.task_id = infos[k].get("task_id", trajectory.task_id)
        trajectory.task_type = infos[k].get("task_type", "")
    turn_limit = max_turns or pool.max_turns
    for _ in range(turn_limit):
        if not observations:
            break
        live = list(observations)
        asks = [
            Ask(first_index + k, _next_messages(pool, trajectories[k].turns[-1] if trajectories[k].turns else None,
                                                observations[k], chat_history), infos[k])
            for k in live
        ]
        started = time.perf_counter()
        replies = actor.act(asks)
        times.add("time/generation", time.perf_counter() - started)
        turns = [
            Turn(reply.prompt_messages or ask.messages, reply.prompt_ids, reply.token_ids, reply.logprobs, reply.text,
                 expert_action=ask.info.get("expert_action"), truncated=not reply.finished, allowed=reply.allowed)
            for ask, reply in zip(asks, replies)
        ]
        actions = ["" if truncated_invalid and turn.truncated else turn.action_text for turn in turns]
        started = time.perf_counter()
        steps = pool.step_many([(slot_of[k], action) for k, action in zip(live, actions)])
        times.add("time/env_step", time.perf_counter() - started)
        for k, turn, result in zip(live, turns, steps):
            trajectory = trajectories[k]
            if isinstance(result, EnvError):
                trajectory.turns.append(turn)
                _mark_errored(trajectory, result)
                del observations[k]
            elif _finish_turn(trajectory, turn, result, pool.reward_bounds[0], truncated_invalid):
                del observations[k]
            else:
                observations[k], infos[k] = result[0], result[4]
    for k in observations:  # cut off by rollout.max_turns before the env ended it
        _cut_off(trajectories[k], turn_limit, pool.reward_bounds[0])
    return trajectories


def _cut_off(trajectory: Trajectory, turn_limit: int, failure_reward: float) -> None:
    """An episode the rollout stopped is a failure with a verdict that says so: the
    baseline and hindsight see an outcome, not an empty reward."""
    trajectory.truncated = True
    trajectory.reward, trajectory.success = failure_reward, False
    trajectory.feedback = f"The episode was cut off after {turn_limit} turns without finishing the task."

