"""What the server sends and the client reads: an action, an observation, the env's attributes.

OpenEnv drops an observation's ``metadata`` when it serializes one, so everything a trainer
needs (the admissible actions, the win flag, the verdict) is an explicit field here.
What only the server should know (ALFWorld's expert action, walkthroughs, game files)
travels only in ``privileged``, and only when the server is started with ``--privileged``.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation
from pydantic import BaseModel, Field

from hp_agent.verifiers import Verdict

ATTRIBUTES_ROUTE = "/hp_agent/env"
# info keys that are the episode's public record; every other key is privileged
PUBLIC_INFO = ("task_id", "task_type", "difficulty", "admissible_actions", "won", "game_text", "action",
               "invalid_action", "shaping", "subgoals", "steps")


class TextAction(Action):
    """The policy's response, as text."""

    text: str = Field(description="The response the env parses into an action.")


class TextObservation(Observation):
    """One reset or step of a text env; ``done`` and ``reward`` are OpenEnv's own fields."""

    text: str = Field("", description="The observation the policy is prompted with.")
    truncated: bool = Field(False, description="The episode ended by a limit (steps), not by its outcome.")
    task_id: str | None = None
    task_type: str | None = None
    difficulty: str | int | float | None = None
    admissible_actions: list[str] | None = Field(None, description="Multi-turn envs: the actions valid now.")
    won: bool | None = None
    game_text: str | None = Field(None, description="The new game text alone, where `text` is a whole prompt.")
    action: str | None = Field(None, description="The action the env parsed from the response.")
    invalid_action: bool | None = None
    shaping: float | None = None
    subgoals: list[str] | None = None
    steps: int | None = None
    verdict: dict[str, Any] | None = Field(None, description="At the episode's end: reward, feedback, success.")
    privileged: dict[str, Any] | None = Field(None, description="Only from a server started with --privileged.")


class EnvAttributesMessage(BaseModel):
    """What the client needs before its first reset (GET ``ATTRIBUTES_ROUTE``)."""

    env: str
    system_prompt: str | None
    answer_format: str | None
    action_template: str
    max_turns: int
    reward_bounds: tuple[float, float]
    task_ids: list[str] | None


def observation_of(text: str, info: dict[str, Any], reward: float | None, terminated: bool, truncated: bool,
                   privileged: bool) -> TextObservation:
    """A reset's or step's Gymnasium results as the observation sent over the wire."""
    fields = {key: info[key] for key in PUBLIC_INFO if info.get(key) is not None}
    verdict = info.get("verdict")
    if isinstance(verdict, Verdict):
        fields["verdict"] = {"reward": verdict.reward, "feedback": verdict.feedback, "success": verdict.success}
    if privileged:
        fields["privileged"] = {key: _plain(value) for key, value in info.items() if key not in PUBLIC_INFO and key != "verdict"}
    return TextObservation(text=text, reward=reward, done=terminated or truncated, truncated=truncated, **fields)


def info_of(observation: dict[str, Any]) -> dict[str, Any]:
    """The Gymnasium info dict the client returns for a received observation."""
    info = {key: observation[key] for key in PUBLIC_INFO if observation.get(key) is not None}
    verdict = observation.get("verdict")
    if verdict is not None:
        info["verdict"] = Verdict(float(verdict["reward"]), str(verdict["feedback"]), bool(verdict["success"]))
    info.update(observation.get("privileged") or {})
    return info


def _plain(value: Any) -> Any:
    """``value`` as JSON can carry it (paths and other objects become their text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return str(value)
