"""A fetch game that can only be won by reading the prompt, made for learning tests.

The box-and-key games (:mod:`hp_agent.envs.toy`) are won from their state words alone.
Here, as in ALFWorld, the right action names the thing that holds the goal, so it is found
only by matching the goal's word against the lists the observation shows:

    Find the box. The garden has: lettuce, towel, egg. The house has: knife, pan, mug. The shop has: cup, box, apple.

The reply ``go to shop`` leads to the second (last) stage, in the shop:

    Find the box. You are in the shop. The table has: cup. The drawer has: box. The shelf has: apple.

and ``go to drawer`` wins (test task ``box:shop.drawer:2``). The three places (house,
garden, shop) and the three spots in each (drawer, shelf, table) are the same in every
game, listed in an order of its group's (below); nine of the 16 items fill the nine spots. Each
observation holds the goal and the whole state, so the default rollout (each turn
prompted with the latest observation alone) plays the game fully. Actions (exact words,
case and surrounding space ignored) are ``go to`` and a name: three tokens of the
embedded tiny model's tokenizer (and of SmolLM2's); ``info["admissible_actions"]`` lists
the three of the current stage and ``info["expert_action"]`` the right one.

* Going to a place or spot that lacks the goal loses: the game ends (terminated), R = 0.
* Taking the goal wins: R = 1.
* Anything else is invalid: it costs ``invalid_cost`` (``info["shaping"] = -invalid_cost``,
  in the step reward), changes nothing and uses up the turn. An episode has three turns,
  the two a win takes and one spare, so one malformed reply need not lose the game; two
  do (truncated, R = 0).

**Chance.** The games come in groups of nine that share the goal and the listing order
and put the goal on each of the nine (place, spot) routes once. So a policy that does not
read the lists' contents wins exactly 1/9 of each split's games, whatever it makes of
the goal word and the order: the same two names every game, the same two positions, or
uniformly among the admissible actions (1/9 in expectation). A reader wins them all.

**Held-out split.** A seeded quarter of the items (4 of 16) are the goals of ``test``
games and never the goal of a ``train`` game, and the other 12 are the goals of ``train``.
Every item still appears in both splits' lists, so the words are all seen in training;
what is new in a test game is the goal, and with it every observation (each one names
the goal). With the default 4 layouts per goal and route: 432 train games, 144 test.

Demonstrations (``demo_mistakes``) are the expert's games, except that with that
probability at each turn it goes to one of the two other names instead, which loses.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from itertools import product
from typing import Any, ClassVar

from hp_agent.envs.base import TextEnv, find_task
from hp_agent.envs.toy import SPLITS, TEST_FRACTION, check_options, demo_action, parse_action, play_demonstrations
from hp_agent.errors import UserValueError
from hp_agent.verifiers import Verdict

PLACES = ("house", "garden", "shop")
SPOTS = ("drawer", "shelf", "table")
# Each one token of the tiny model's tokenizer (after a space), so a list costs little.
ITEMS = ("apple", "mug", "cup", "book", "knife", "egg", "bread", "potato",
         "lettuce", "pan", "towel", "pillow", "key", "ball", "box", "lamp")
GO = "go to "
ACTIONS = frozenset(GO + name for name in PLACES + SPOTS)


@cache
def goal_items(split: str, seed: int = 0) -> tuple[str, ...]:
    """The goals of ``split``'s games: a seeded shuffle of :data:`ITEMS`, the first
    quarter ``test``, the rest ``train`` (disjoint)."""
    if split not in SPLITS:
        raise UserValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    items = list(ITEMS)
    random.Random(seed).shuffle(items)
    held_out = round(len(items) * TEST_FRACTION)
    return tuple(items[:held_out] if split == "test" else items[held_out:])


@dataclass(frozen=True)
class FetchTask:
    """One game: the goal, the places and spots in the order the game lists them, and
    ``grid[i][j]``, the item at spot ``spots[j]`` of place ``places[i]``."""

    id: str
    goal: str
    places: tuple[str, ...]
    spots: tuple[str, ...]
    grid: tuple[tuple[str, ...], ...]

    @property
    def task_type(self) -> str:
        """The goal: evaluation then reports success per goal word."""
        return self.goal

    @property
    def place(self) -> str:
        """The place that holds the goal."""
        return next(place for place, items in zip(self.places, self.grid) if self.goal in items)

    @property
    def spot(self) -> str:
        """The spot (in :attr:`place`) that holds the goal."""
        return self.spots[self.grid[self.places.index(self.place)].index(self.goal)]


@cache
def fetch_tasks(split: str, layouts: int = 4, seed: int = 0) -> tuple[FetchTask, ...]:
    """Every game of ``split``: for each goal and layout number, a seeded listing order of
    the places and of the spots, and the nine games that put the goal on each (place, spot)
    route in turn, the other spots filled with a seeded sample of the other items. Task ids:
    ``goal:place.spot:layout``, e.g. ``"box:shop.drawer:2"``. In a seeded shuffled order, so
    that a prefix (``eval --limit N``) mixes goals and routes."""
    if layouts < 1:
        raise UserValueError(f"layouts must be >= 1, got {layouts}")
    rng = random.Random(f"fetch-{split}-{seed}")
    cells = len(PLACES) * len(SPOTS)
    tasks = []
    for goal, layout in product(goal_items(split, seed), range(layouts)):
        # The nine games share the goal and the order, so neither tells where the goal is.
        places, spots = tuple(rng.sample(PLACES, len(PLACES))), tuple(rng.sample(SPOTS, len(SPOTS)))
        for cell in range(cells):
            items = rng.sample([item for item in ITEMS if item != goal], cells - 1)
            items.insert(cell, goal)
            grid = tuple(tuple(items[i : i + len(SPOTS)]) for i in range(0, cells, len(SPOTS)))
            place, spot = places[cell // len(SPOTS)], spots[cell % len(SPOTS)]
            tasks.append(FetchTask(f"{goal}:{place}.{spot}:{layout}", goal, places, spots, grid))
    rng.shuffle(tasks)
    return tuple(tasks)


class FetchEnv(TextEnv):
    """Multi-turn fetching (see the module docstring).

    split:         "train" or "test" (held-out goal items).
    layouts:       games per goal and route (each a different filling and order of the lists).
    invalid_cost:  cost of an invalid action (shaping ``-invalid_cost``, in the step reward).
    demo_mistakes: probability that the demonstrating expert goes to a wrong name at a turn.
    demo_episodes: demonstration episodes per task.
    demo_seed:     seed of the demonstrations' mistakes.
    seed:          seed of the split (which items are held out) and of the layouts.
    """

    system_prompt: ClassVar[str | None] = ("Find the item: go to the place that has it, then to the spot that has it. "
                                           "Reply: go to NAME.")
    reward_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    answer_format: ClassVar[str | None] = None  # bare words: no markup to tell apart from content
    eval_split: ClassVar[str | None] = "test"  # goals never fetched in training
    max_turns = 3  # the two turns a win takes, and one spare for a malformed reply

    def __init__(self, split: str = "train", layouts: int = 4, invalid_cost: float = 0.1,
                 demo_mistakes: float = 0.0, demo_episodes: int = 1, demo_seed: int = 0, seed: int = 0):
        super().__init__(max_observation_chars=512, max_action_chars=4096)
        check_options(split, invalid_cost, demo_mistakes, demo_episodes)
        self.split, self.seed, self.demo_seed = split, seed, demo_seed
        self.invalid_cost, self.demo_mistakes, self.demo_episodes = float(invalid_cost), demo_mistakes, demo_episodes
        self._tasks = {task.id: task for task in fetch_tasks(split, layouts, seed)}
        self._task: FetchTask | None = None
        self.place: str | None = None  # where the agent went; None before the places
        self.wrong: str | None = None  # the name of a lost game's wrong turn
        self.turns, self.invalid_turns, self._done = 0, 0, True

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def task(self, task_id: str) -> FetchTask:
        """The game ``task_id``, where the goal lies included (never shown to the policy)."""
        return find_task(self._tasks, task_id, self)

    def admissible_actions(self) -> list[str]:
        """``go to`` each name the current stage lists, in its order."""
        assert self._task is not None
        return [GO + name for name in (self._task.places if self.place is None else self._task.spots)]

    def _holder(self) -> str:
        """The name of the current stage that holds the goal."""
        assert self._task is not None
        return self._task.place if self.place is None else self._task.spot

    def _state(self) -> str:
        task = self._task
        assert task is not None
        if self.place is None:
            lists = " ".join(f"The {place} has: {', '.join(items)}." for place, items in zip(task.places, task.grid))
            return f"Find the {task.goal}. {lists}"
        items = task.grid[task.places.index(self.place)]
        lists = " ".join(f"The {spot} has: {item}." for spot, item in zip(task.spots, items))
        return f"Find the {task.goal}. You are in the {self.place}. {lists}"

    def _info(self) -> dict[str, Any]:
        assert self._task is not None
        return {"task_id": self._task.id, "task_type": self._task.task_type,
                "admissible_actions": self.admissible_actions(), "expert_action": GO + self._holder()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a game before the places."""
        super().reset(seed=seed)
        self._task = self.task(self.task_id_for_reset(seed, options))
        self.place, self.wrong = None, None
        self.turns, self.invalid_turns, self._done = 0, 0, False
        return self._state(), self._info()

    def _apply(self, action: str | None) -> tuple[str, bool, bool | None]:
        """Carry out one parsed action: (event text, valid, won: None while the game goes on)."""
        task = self._task
        assert task is not None
        if action is None:
            return "Unknown action.", False, None
        if action not in self.admissible_actions():
            return "You cannot do that.", False, None
        name = action.removeprefix(GO)
        if name != self._holder():
            self.wrong = name
            return f"The {name} has no {task.goal}.", True, False
        if self.place is None:
            self.place = name
            return "", True, None  # the next state says where the agent is
        return f"You take the {task.goal} from the {name}.", True, True

    def _feedback(self, won: bool | None) -> str:
        # What the agent did, never where a goal it did not find was.
        assert self._task is not None
        goal, tally = self._task.goal, f"after {self.turns} turns; invalid actions: {self.invalid_turns}."
        if won:
            return f"won: took the {goal} {tally}"
        if won is False:
            return f"lost: went to the {self.wrong}, which has no {goal}, {tally}"
        where = f"in the {self.place}" if self.place else "before choosing a place"
        return f"lost: out of turns {where} {tally}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one action; the game ends on a win, a wrong name or after ``max_turns`` turns."""
        if self._task is None or self._done:
            raise RuntimeError(f"{type(self).__name__} episode is over or not started; call reset() first")
        parsed = parse_action(action, ACTIONS)
        event, valid, won = self._apply(parsed)
        self.turns += 1
        self.invalid_turns += not valid
        shaping = 0.0 if valid else -self.invalid_cost
        terminated = won is not None
        truncated = not terminated and self.turns >= self.max_turns
        self._done = terminated or truncated
        observation = event if terminated else " ".join(filter(None, (event, self._state())))
        info = {**self._info(), "action": parsed or "", "invalid_action": not valid, "shaping": shaping}
        success = won is True
        if self._done:
            info["verdict"] = Verdict(float(success), self._feedback(won), success)
        return observation, float(success) + shaping, terminated, truncated, info

    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """(observation, action) for every turn of ``demo_episodes`` episodes per task of
        this split, played by the expert with ``demo_mistakes`` (each observation is the
        whole prompt, so every turn is a demonstration). Plays on this env: it ends any
        episode in progress."""
        rng = random.Random(self.demo_seed)
        yield from play_demonstrations(self, self._tasks, self.demo_episodes, lambda info: demo_action(
            rng, info["expert_action"], self.demo_mistakes, info["admissible_actions"]))
