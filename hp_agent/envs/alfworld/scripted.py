"""Scripted ALFWorld players for evaluation, demonstrations and sanity checks (no model involved).

* ``walkthrough``: replays the game's stored solution (translated to the names players
  see); wins every official ID and OOD game if the env is right.
* ``expert``: ALFWorld's handcoded expert (fixed for alfworld 0.4's ``move`` command),
  i.e. ``info["expert_action"]``.
* ``random``: uniform over the admissible actions shown in the prompt, seeded per episode.

Each answers ``<action>...</action>`` so its output goes through the same parsing as a
model's. They answer from the env's info alone; :mod:`hp_agent.scripted_play` plays them
in the loop that plays models (:func:`hp_agent.rollout.play`), so their trajectories are
recorded, and their prompts rendered, exactly as RL's.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from hp_agent.errors import UserLookupError, UserValueError

SCRIPTED_POLICIES: tuple[str, ...] = ("walkthrough", "expert", "random")
FALLBACK_ACTION = "look"  # what a policy plays when its script has nothing left to say


class ScriptedPolicy:
    """One episode's script: built from the reset's info and seed, it answers from the env's info, not from a model."""

    name: ClassVar[str] = ""
    env_kwargs: ClassVar[dict[str, Any]] = {}  # what the policy needs the env built with

    def __init__(self, info: dict[str, Any], seed: int) -> None:
        """The episode began: ``info`` is its reset's."""

    def respond(self, info: dict[str, Any]) -> str:
        """The command to play in the state that ``info`` (the last reset/step info) describes
        (the actor writes it in the env's ``action_template``)."""
        raise NotImplementedError


class WalkthroughPolicy(ScriptedPolicy):
    """Replays the stored solution, then ``look`` if the game is somehow not won."""

    name = "walkthrough"
    env_kwargs = {"walkthrough_info": True}

    def __init__(self, info: dict[str, Any], seed: int) -> None:
        if "walkthrough" not in info:
            raise KeyError("info has no 'walkthrough'; the walkthrough policy needs AlfworldEnv(walkthrough_info=True)")
        if info["walkthrough"] is None:
            raise UserLookupError(f"game {info.get('task_id')} stores no walkthrough (games of its split have none); "
                                  "use the expert policy instead")
        self._commands = list(info["walkthrough"])

    def respond(self, info: dict[str, Any]) -> str:
        return self._commands.pop(0) if self._commands else FALLBACK_ACTION


class ExpertPolicy(ScriptedPolicy):
    """Plays the env's ``info["expert_action"]`` (``look`` when the expert gave up)."""

    name = "expert"
    env_kwargs = {"expert": True}

    def respond(self, info: dict[str, Any]) -> str:
        if "expert_action" not in info:
            raise KeyError("info has no 'expert_action'; the expert policy needs AlfworldEnv(expert=True)")
        return info["expert_action"] or FALLBACK_ACTION


class RandomPolicy(ScriptedPolicy):
    """Uniform over ``info["admissible_actions"]``; each episode's draws depend on its seed only."""

    name = "random"

    def __init__(self, info: dict[str, Any], seed: int) -> None:
        self._rng = random.Random(seed)

    def respond(self, info: dict[str, Any]) -> str:
        actions = info.get("admissible_actions")
        if not actions:
            raise KeyError("info has no 'admissible_actions'; the random policy needs a multi-turn env")
        return self._rng.choice(actions)


_POLICIES: dict[str, type[ScriptedPolicy]] = {policy.name: policy for policy in (WalkthroughPolicy, ExpertPolicy, RandomPolicy)}


def scripted_policy(name: str) -> type[ScriptedPolicy]:
    """The scripted policy called ``name``; a bad name lists the valid ones."""
    if name not in _POLICIES:
        raise UserValueError(f"unknown scripted policy {name!r}; valid: {', '.join(SCRIPTED_POLICIES)}")
    return _POLICIES[name]
