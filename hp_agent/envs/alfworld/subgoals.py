"""Training-time subgoal rewards for ALFWorld (off by default: the verl-agent protocol has none).

A won game pays ``win_reward`` and nothing else does, so a policy that almost never wins
gets almost no learning signal. With ``AlfworldEnv(subgoal_reward=r)`` the env also pays
``r``, once per episode each, for the two steps every solution of a task passes through:

* ``hold``:  picking up an object of the task's type (``take apple 2 from ...`` in a task
  about apples);
* ``apply``: applying the task's device to it while holding it (``heat``/``cool``/``clean``
  it, or ``use`` a desklamp in a look task); pick and pick2 tasks have no such step.

The payment is shaping (``info["shaping"]``, the turn's credit s_t), never part of the
outcome R, the verdict or success, so evaluation is untouched; the tracker reads only the
task id's object type and the commands the game accepted, not the game's hidden state.
"""

from __future__ import annotations

import re

DEVICE_TASKS = frozenset({"heat", "cool", "clean"})  # the command's verb is the task type
LAMP_TASK = "look"
_TAKE = re.compile(r"take (\w+) \d+ from ")
_MOVE = re.compile(r"move (\w+) \d+ to ")
_APPLY = re.compile(r"(heat|cool|clean) (\w+) \d+ with ")
_USE_LAMP = re.compile(r"use desklamp \d+$")


def task_object(task_id: str) -> str:
    """The object type of a task, as players see it, from its folder name.

    >>> task_object("valid_seen/pick_heat_then_place_in_recep-AppleSliced-None-CounterTop-23/trial_T1")
    'apple'
    """
    parts = task_id.split("/")
    if len(parts) < 2 or parts[-2].count("-") < 4:
        raise ValueError(f"task id {task_id!r} has no '<type>-<Object>-<Mover>-<Receptacle>-<scene>' folder")
    return parts[-2].split("-")[1].removesuffix("Sliced").lower()


class SubgoalTracker:
    """Which subgoals one episode has reached, from the commands the game accepted."""

    def __init__(self, task_id: str, task_type: str) -> None:
        self.target = task_object(task_id)
        self.task_type = task_type
        self.held: str | None = None  # the object type in hand
        self.reached: set[str] = set()

    def step(self, command: str, accepted: bool) -> list[str]:
        """The subgoals that ``command`` reached for the first time in this episode."""
        if not accepted:
            return []
        if match := _TAKE.match(command):
            self.held = match.group(1)
        elif _MOVE.match(command):
            self.held = None
        new = []
        if self.held == self.target:
            new.append("hold")
            if self._applies(command):
                new.append("apply")
        new = [goal for goal in new if goal not in self.reached]
        self.reached.update(new)
        return new

    def _applies(self, command: str) -> bool:
        if self.task_type in DEVICE_TASKS:
            match = _APPLY.match(command)
            return match is not None and match.group(1) == self.task_type and match.group(2) == self.target
        return self.task_type == LAMP_TASK and _USE_LAMP.match(command) is not None
