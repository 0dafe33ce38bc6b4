"""One official ALFWorld game on the real engine, plus ALFWorld's handcoded expert, fixed.

The engine is set up as ``alfworld.agents.environment.alfred_tw_env.AlfredTWEnv`` does
it: TextWorld's PDDL environment, wrapped by ``AlfredDemangler`` (raw PDDL ids such as
``apple_bar__minus_00_dot_43_bar_...`` become the names players see, ``apple 1``) and
``AlfredInfos``, with ``won``, ``admissible_commands`` and, for the expert, ``facts``
requested. Domain randomization (shuffled names) is off, as in ALFWorld's evaluation.
One engine plays game after game (:meth:`AlfworldGame.load`), and its calls run under
:func:`~hp_agent.envs.alfworld.speedups.engine_speedups`: a game is translated once per
machine, its grammar parsed once per process, and steps skip needless deep copies
(``speedups=False`` runs the engine as shipped; episodes are the same).

The expert fix. alfworld 0.4.2 renamed the placement command from ``put X in/on Y``
to ``move X to Y`` in its grammar and in the expert's *output*, but the expert's state
tracking (``BasePolicy.update_state_tracking``) still tests ``"put" in last_action``.
So the expert never registers a placement: it believes it still holds the object,
and every pick-two game (and every game where it must put down a wrong object) runs
out of steps. :class:`FixedHandCodedTWAgent` hands the tracking code the command in
the old form it was written for; everything else is ALFWorld's code, unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import textworld
from textworld.envs.pddl.pddl import PddlEnv
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout, HandCodedTWAgent
from alfworld.agents.expert import handcoded_expert_tw as tw_policies

from hp_agent.envs.alfworld.data import stored_walkthrough
from hp_agent.envs.alfworld.speedups import argv_kept, engine_speedups

HELP_COMMAND = "help"
# The expert's first action, as AlfredExpert gives it: the expert only acts after it has
# seen the result of one command (it parses the receptacles from the intro text).
EXPERT_FIRST_ACTION = "look"


def legacy_placement_command(command: str) -> str:
    """``move X to Y`` (alfworld >= 0.4) written as ``put X in/on Y`` (alfworld <= 0.3).

    >>> legacy_placement_command("move apple 1 to countertop 1")
    'put apple 1 in/on countertop 1'
    >>> legacy_placement_command("go to countertop 1")
    'go to countertop 1'
    """
    if not command.startswith("move "):
        return command
    return "put " + command[len("move "):].replace(" to ", " in/on ", 1)


class _PlacementTrackingFix:
    """Mixin for ALFWorld's TW expert policies: state tracking sees placements again."""

    def update_state_tracking(self, game_state: Any, last_action: str) -> None:
        # Only the tracking code gets the old command form; act() keeps comparing the
        # real command (its "same action twice" guard must see what was played).
        super().update_state_tracking(game_state, legacy_placement_command(last_action))  # type: ignore[misc]


# One fixed class per ALFWorld TW policy, keyed by the traj_data task type.
_FIXED_POLICIES: dict[str, type] = {
    task_type: type(f"Fixed{base.__name__}", (_PlacementTrackingFix, base), {})
    for task_type, base in {
        "pick_and_place_simple": tw_policies.PickAndPlaceSimpleTWPolicy,
        "look_at_obj_in_light": tw_policies.LookAtObjInLightTWPolicy,
        "pick_clean_then_place_in_recep": tw_policies.PickCleanThenPlaceInRecepTWPolicy,
        "pick_heat_then_place_in_recep": tw_policies.PickHeatThenPlaceInRecepTWPolicy,
        "pick_cool_then_place_in_recep": tw_policies.PickCoolThenPlaceInRecepTWPolicy,
        "pick_two_obj_and_place": tw_policies.PickTwoObjAndPlaceTWPolicy,
    }.items()
}


class FixedHandCodedTWAgent(HandCodedTWAgent):
    """ALFWorld's handcoded TextWorld expert with placement tracking repaired."""

    def get_task_policy(self, task_param: dict[str, Any]) -> type:
        task_type = task_param["task_type"]
        if task_type not in _FIXED_POLICIES:
            raise ValueError(f"no expert policy for task type {task_type!r}; known: {', '.join(_FIXED_POLICIES)}")
        return _FIXED_POLICIES[task_type]


class HandcodedExpert:
    """Drives a handcoded agent beside a game, as ``AlfredExpert`` does, and says its next action.

    Differences from ``AlfredExpert``, each for a reason:
    * the agent's ``random`` draws (it breaks ties at random) use a private state seeded
      at reset, so an episode's expert actions depend on the seed only;
    * a command the game did not accept ("Nothing happens.") is not shown to the agent:
      the state did not change, so its last advice still holds, and garbage text (a
      model's unparsable output) cannot corrupt its tracking (``"go to" in last_action``);
    * ``help`` is not among the commands it may fall back to (the policy is not offered it);
    * when the agent gives up (timeout, no subgoal left, or an error in its code) the advice is None and
      :attr:`gave_up` says why, instead of an exception in the middle of an episode.
    """

    def __init__(self, agent_class: type[HandCodedTWAgent] = FixedHandCodedTWAgent, max_steps: int = 200):
        self.agent_class = agent_class
        self.max_steps = max_steps
        self.gave_up: str | None = None
        self._agent: HandCodedTWAgent | None = None
        self._random_state: tuple = random.Random(0).getstate()

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outer)

    def reset(self, game_file: Path, intro: str, seed: int) -> str:
        """Start on a new episode of ``game_file`` whose first text is ``intro``."""
        self._random_state = random.Random(seed).getstate()
        self.gave_up = None
        self._agent = self.agent_class(max_steps=self.max_steps)
        self._agent.reset(str(game_file))  # reads traj_data.json beside the game file
        self._agent.observe(intro)
        return EXPERT_FIRST_ACTION

    def advise(self, state: dict[str, Any], command: str) -> str | None:
        """The next action after ``command`` led to ``state`` (admissible commands, facts, feedback)."""
        if self._agent is None:
            raise RuntimeError("HandcodedExpert.advise() called before reset()")
        if self.gave_up is not None:
            return None
        offered = [c for c in state["admissible_commands"] if c != HELP_COMMAND]
        view = {**state, "admissible_commands": offered}
        try:
            with self._own_random():
                action = self._agent.act(view, 0, state["won"], command)
        except HandCodedAgentTimeout:
            self.gave_up = f"timeout: more than {self.max_steps} expert steps"
            return None
        except HandCodedAgentFailed:
            self.gave_up = "failed: all subgoals done but the goal is not reached"
            return None
        except Exception as error:  # noqa: BLE001 - the expert is advice; its bugs must not end the game
            # e.g. IndexError from random.choice over no visible object of the goal's class
            self.gave_up = f"crashed: {type(error).__name__}: {error}"
            return None
        # AlfredExpert's rule: advice that is not admissible becomes "look".
        return action if action in offered else EXPERT_FIRST_ACTION


def translate_command(command: str, names: dict[str, str]) -> str:
    """Replace raw engine ids in ``command`` by the names players see.

    >>> translate_command("go to desk_bar__minus_00_dot_57", {"desk_bar__minus_00_dot_57": "desk 1"})
    'go to desk 1'
    """
    # Raw ids never contain spaces, so a whitespace split finds every one of them.
    return " ".join(names.get(token, token) for token in command.split())


@dataclass
class GameStep:
    """What the engine says after a reset or a command.

    feedback:            the game's text ("You arrive at desk 1. On the desk 1, ...").
    admissible_commands: the engine's admissible commands, sorted (``help`` included).
    won:                 whether the goal holds now.
    expert_action:       the expert's next action (None without an expert or when it gave up).
    accepted:            whether the command was one the game could execute.
    """

    feedback: str
    admissible_commands: list[str]
    won: bool
    expert_action: str | None = None
    accepted: bool = True


class AlfworldGame:
    """One engine that plays official games: load a game, then reset it for each episode.

    game_file:    path of a ``game.tw-pddl`` to load (``traj_data.json`` must sit beside
                  it for the expert); None: call :meth:`load` before :meth:`reset`.
    expert:       drive the handcoded expert beside the game (requests the engine's facts).
    expert_class: the expert agent; ALFWorld's own ``HandCodedTWAgent`` shows the 0.4.2 bug.
    speedups:     run the engine under :func:`~hp_agent.envs.alfworld.speedups.engine_speedups`
                  (translations and parses from caches); the game plays the same either way.
    """

    def __init__(self, game_file: str | Path | None = None, expert: bool = True,
                 expert_class: type[HandCodedTWAgent] = FixedHandCodedTWAgent, speedups: bool = True):
        request = textworld.EnvInfos(won=True, admissible_commands=True, facts=expert, extras=["gamefile"])
        # What textworld.start() builds for a .tw-pddl file, kept across games: each
        # PddlEnv loads its own copy of Fast Downward's library (33 MB), never unloaded.
        self._env = AlfredInfos(AlfredDemangler(PddlEnv(request), shuffle=False))
        self._engine_calls = engine_speedups if speedups else argv_kept
        self._expert = HandcodedExpert(expert_class) if expert else None
        self._state: Any = None
        self._expert_action: str | None = None
        self.game_file: Path | None = None
        self.names: dict[str, str] = {}
        if game_file is not None:
            self.load(game_file)

    def load(self, game_file: str | Path) -> None:
        """Play ``game_file`` from the next :meth:`reset` on."""
        game_file = Path(game_file)
        if not game_file.is_file():
            raise FileNotFoundError(f"ALFWorld game file {game_file} does not exist")
        self.game_file, self._state, self.names = None, None, {}
        with self._engine_calls():
            self._env.load(str(game_file))
        self.game_file = game_file

    def reset(self, seed: int = 0) -> GameStep:
        """A new episode; ``seed`` drives the expert's tie-breaking (the game itself is fixed)."""
        if self.game_file is None:
            raise RuntimeError("AlfworldGame.reset() called before load()")
        with self._engine_calls():
            self._state = self._env.reset()
        # The demangler renamed every entity; keep raw id -> shown name for walkthroughs.
        self.names = {raw_id: info.name.strip() for raw_id, info in self._state["_entity_infos"].items()}
        feedback = self._state["feedback"]
        self._expert_action = self._expert.reset(self.game_file, feedback, seed) if self._expert else None
        return self._game_step(accepted=True)

    def step(self, command: str) -> GameStep:
        """Play ``command``; a command the game does not know answers "Nothing happens."."""
        if self._state is None:
            raise RuntimeError("AlfworldGame.step() called before reset()")
        command = command.strip()  # the engine strips too; the expert must see the same text
        accepted = command in self._state["admissible_commands"]
        with self._engine_calls():
            self._state, _, _ = self._env.step(command)
        if self._expert is not None and accepted and not self._state["won"]:
            self._expert_action = self._expert.advise(self._state, command)
        elif self._state["won"]:
            self._expert_action = None
        return self._game_step(accepted=accepted)

    def _game_step(self, accepted: bool) -> GameStep:
        return GameStep(
            feedback=self._state["feedback"],
            admissible_commands=list(self._state["admissible_commands"]),
            won=bool(self._state["won"]),
            expert_action=self._expert_action,
            accepted=accepted,
        )

    @property
    def expert_gave_up(self) -> str | None:
        """Why the expert stopped advising, or None."""
        return self._expert.gave_up if self._expert else None

    def walkthrough(self) -> list[str] | None:
        """The game's stored solution in the names players see (None if it stores none).

        valid_unseen games store raw engine ids, valid_seen games the shown names; both
        come out as commands the player can type. Needs a reset first (names come from it).
        """
        if not self.names:
            raise RuntimeError("AlfworldGame.walkthrough() needs reset() first: names come from the engine")
        commands = stored_walkthrough(self.game_file)
        return None if commands is None else [translate_command(c, self.names) for c in commands]

    def close(self) -> None:
        """Release the engine."""
        self._env.close()
