"""Two small box-and-key envs, made for learning tests: fast, short prompts, held-out tasks.

The game: a row of closed boxes, each a different colour; one holds the key. The agent
stands at the first box. Actions (exact words, case and surrounding space ignored):

* ``open``: open the box it stands at (invalid if already open). Opening the key's box
  gives the agent the key.
* ``next``: walk to the next box (invalid at the last box). There is no way back, so
  walking past a closed box that holds the key loses the game, a mistake whose cost only
  shows turns later.
* ``use key``: win, if the agent holds the key (invalid otherwise).

Anything else is invalid too. An invalid action costs ``invalid_cost`` (``info["shaping"]
= -invalid_cost``, included in the step reward) and uses up the turn.

* ``keys`` (:class:`KeysEnv`, multi-turn): play the game. The outcome reward R is 1 for
  a win, 0 when the turns run out. An episode has ``2 * num_boxes`` turns, what the worst
  case needs (open and walk on at every box, then use the key at the last), so a wasted
  turn can lose the game.
* ``keystep`` (:class:`KeyStepEnv`, single-step): one state of the game; the answer is
  the expert's action there (``open`` a closed box, ``use key`` once held, else ``next``).
  R = 1 for it, 0 for another valid action; an invalid one also costs ``invalid_cost``.

The expert's choice depends only on the state words (closed, empty, holding the key),
which a few-million-parameter model can learn to read in a short warm-up; the colours
are what differs between tasks. Splits divide the colour *sets*: a fixed quarter of them
is ``test``, the rest ``train``, so a held-out task never shows a set of boxes seen in
training. Each observation holds the whole state, so the default rollout (each turn
prompted with the latest observation alone) plays the game fully.

Both envs give noisy demonstrations (``demo_mistakes``): the expert, except that with
that probability at each step it takes one of the other two actions. A short supervised
warm-up on them gives a policy that knows the actions but succeeds well below the
ceiling, the starting point of the learning tests (tests/test_learning.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import combinations, permutations
from typing import Any, ClassVar

from hp_agent.envs.base import SingleStepTaskEnv, TextEnv, find_task
from hp_agent.errors import UserValueError
from hp_agent.verifiers import Verdict

SPLITS = ("train", "test")
COLOURS = ("red", "blue", "yellow", "black", "pink", "gray", "orange", "green")
OPEN, NEXT, USE_KEY = "open", "next", "use key"
ACTIONS = (OPEN, NEXT, USE_KEY)
# Fraction of the colour sets held out as the test split.
TEST_FRACTION = 0.25


@cache
def colour_sets(split: str, num_boxes: int, seed: int = 0) -> tuple[tuple[str, ...], ...]:
    """The colour sets of ``split``: a seeded shuffle of all ``num_boxes``-sets of
    :data:`COLOURS`, the first quarter ``test``, the rest ``train`` (disjoint splits)."""
    if split not in SPLITS:
        raise UserValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if not 2 <= num_boxes < len(COLOURS):
        raise UserValueError(f"num_boxes must lie in [2, {len(COLOURS) - 1}], got {num_boxes}")
    sets = list(combinations(COLOURS, num_boxes))
    random.Random(seed).shuffle(sets)
    held_out = max(1, round(len(sets) * TEST_FRACTION))
    return tuple(sets[:held_out] if split == "test" else sets[held_out:])


def box_rows(split: str, num_boxes: int, seed: int = 0) -> list[tuple[str, ...]]:
    """Every ordering of every colour set of ``split``: the rows of boxes its tasks use."""
    return [row for colours in colour_sets(split, num_boxes, seed) for row in permutations(colours)]


def parse_action(text: str, actions: Collection[str] = ACTIONS) -> str | None:
    """The action of ``actions`` that ``text`` names, or None.

    Exact up to case and whitespace: the format is part of what the policy must learn,
    and a reply with anything else in it is invalid rather than guessed at.
    """
    words = " ".join(text.strip().lower().split())
    return words if words in actions else None


def state_text(colour: str, position: int, num_boxes: int, is_open: bool, has_key: bool) -> str:
    """The state as the agent sees it, e.g. ``"The red box (1 of 3) is closed."``."""
    text = f"The {colour} box ({position + 1} of {num_boxes}) is {'empty' if is_open else 'closed'}."
    return f"{text} You hold the key." if has_key else text


def allowed_actions(position: int, num_boxes: int, is_open: bool, has_key: bool) -> list[str]:
    """The valid actions of a state: open a closed box, walk on from any box but the
    last, use the key once held."""
    valid = [] if is_open else [OPEN]
    valid += [NEXT] if position < num_boxes - 1 else []
    return valid + ([USE_KEY] if has_key else [])


def expert_action(is_open: bool, has_key: bool) -> str:
    """The best action of a state: use the key once held, open a closed box, else walk on."""
    return USE_KEY if has_key else (NEXT if is_open else OPEN)


def play_demonstrations(env: TextEnv, task_ids: Iterable[str], episodes: int,
                        choose: Callable[[dict[str, Any]], str]) -> Iterator[tuple[str, str]]:
    """(observation, action) for every turn of ``episodes`` episodes of each task, played on
    ``env`` with ``choose(info)`` picking each action (from the last reset or step info)."""
    task_ids = list(task_ids)
    for _ in range(episodes):
        for task_id in task_ids:
            observation, info = env.reset(options={"task_id": task_id})
            done = False
            while not done:
                action = choose(info)
                yield observation, action
                observation, _, terminated, truncated, info = env.step(action)
                done = terminated or truncated


def demo_action(rng: random.Random, best: str, mistakes: float, actions: Sequence[str] = ACTIONS) -> str:
    """``best``, or with probability ``mistakes`` one of the other ``actions``."""
    if rng.random() < mistakes:
        return rng.choice([action for action in actions if action != best])
    return best


def check_options(split: str, invalid_cost: float, demo_mistakes: float, demo_episodes: int) -> None:
    """Refuse a split, cost, mistake rate or demonstration count the toy envs cannot take."""
    if split not in SPLITS:
        raise UserValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if invalid_cost < 0:
        raise UserValueError(f"invalid_cost is a cost and must be >= 0, got {invalid_cost}")
    if not 0.0 <= demo_mistakes <= 1.0:
        raise UserValueError(f"demo_mistakes is a probability, got {demo_mistakes}")
    if demo_episodes < 1:
        raise UserValueError(f"demo_episodes must be >= 1, got {demo_episodes}")


@dataclass(frozen=True)
class KeysTask:
    """A row of boxes (colours in order) and the index of the one holding the key."""

    id: str
    boxes: tuple[str, ...]
    key: int
    task_type: str


class KeysEnv(TextEnv):
    """Multi-turn key finding (see the module docstring). Task ids: colours, then the
    key's box, e.g. ``"red-blue-pink:1"`` (key in the blue box).

    split:         "train" or "test" (held-out colour sets).
    num_boxes:     boxes per task (2-7); an episode has ``2 * num_boxes`` turns.
    invalid_cost:  cost of an invalid action (shaping ``-invalid_cost``, in the step reward).
    demo_mistakes: probability that the demonstrating expert takes another action at a step.
    demo_episodes: demonstration episodes per task.
    demo_seed:     seed of the demonstrations' mistakes.
    seed:          seed of the split (which colour sets are held out).
    """

    system_prompt: ClassVar[str | None] = "Find the key and use it. Actions: open, next, use key."
    reward_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    # Actions are bare words: no markup to tell apart from content.
    answer_format: ClassVar[str | None] = None
    eval_split: ClassVar[str | None] = "test"  # colour sets never seen in training

    def __init__(self, split: str = "train", num_boxes: int = 3, invalid_cost: float = 0.1,
                 demo_mistakes: float = 0.0, demo_episodes: int = 1, demo_seed: int = 0, seed: int = 0):
        super().__init__(max_observation_chars=512, max_action_chars=4096)
        check_options(split, invalid_cost, demo_mistakes, demo_episodes)
        self.split, self.num_boxes, self.seed, self.demo_seed = split, num_boxes, seed, demo_seed
        self.invalid_cost, self.demo_mistakes, self.demo_episodes = float(invalid_cost), demo_mistakes, demo_episodes
        self.max_turns = 2 * num_boxes  # the worst case: open and walk on at every box, use the key at the last
        tasks = [KeysTask(f"{'-'.join(row)}:{key}", row, key, f"{num_boxes} boxes")
                 for row in box_rows(split, num_boxes, seed) for key in range(num_boxes)]
        self._tasks = {task.id: task for task in tasks}
        self._task: KeysTask | None = None
        self._done = True

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def _state(self) -> str:
        assert self._task is not None
        return state_text(self._task.boxes[self.position], self.position, self.num_boxes,
                          self.position in self.opened, self.has_key)

    def _info(self) -> dict[str, Any]:
        assert self._task is not None
        return {"task_id": self._task.id, "task_type": self._task.task_type, "admissible_actions": self.admissible_actions()}

    def admissible_actions(self) -> list[str]:
        """The valid actions of the current state."""
        return allowed_actions(self.position, self.num_boxes, self.position in self.opened, self.has_key)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a task at the first box, every box closed, no key."""
        super().reset(seed=seed)
        self._task = find_task(self._tasks, self.task_id_for_reset(seed, options), self)
        self.position, self.opened, self.has_key = 0, set(), False
        self.turns, self.invalid_turns, self._done = 0, 0, False
        return self._state(), self._info()

    def _apply(self, action: str | None) -> tuple[str, bool, bool]:
        """Carry out one parsed action: (event text, valid, won)."""
        assert self._task is not None
        if action is None:
            return "Unknown action.", False, False
        if action not in self.admissible_actions():
            return "You cannot do that.", False, False
        if action == USE_KEY:
            return "You unlock the door with the key.", True, True
        if action == NEXT:
            self.position += 1
            return "You walk on.", True, False
        self.opened.add(self.position)
        if self.position == self._task.key:
            self.has_key = True
            return "You found the key!", True, False
        return "Nothing inside.", True, False

    def _feedback(self, won: bool) -> str:
        # What the agent did, never where a key it did not find was.
        outcome = "won: used the key" if won else "lost: out of turns"
        found = "found the key" if self.has_key else "did not find the key"
        return (f"{outcome} after {self.turns} turns; opened {len(self.opened)} of {self.num_boxes} boxes; "
                f"{found}; invalid actions: {self.invalid_turns}.")

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one action; the game ends on a win or after ``max_turns`` turns."""
        if self._task is None or self._done:
            raise RuntimeError(f"{type(self).__name__} episode is over or not started; call reset() first")
        parsed = parse_action(action)
        event, valid, won = self._apply(parsed)
        self.turns += 1
        self.invalid_turns += not valid
        shaping = 0.0 if valid else -self.invalid_cost
        truncated = not won and self.turns >= self.max_turns
        self._done = won or truncated
        observation = event if won else f"{event} {self._state()}"
        info = {**self._info(), "action": parsed or "", "invalid_action": not valid, "shaping": shaping}
        if self._done:
            info["verdict"] = Verdict(float(won), self._feedback(won), won)
        return observation, float(won) + shaping, won, truncated, info

    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """(observation, action) for every turn of ``demo_episodes`` episodes per task of
        this split, played by the expert with ``demo_mistakes`` (each observation is the
        whole prompt, so every turn is a demonstration). Plays on this env: it ends any
        episode in progress."""
        rng = random.Random(self.demo_seed)
        yield from play_demonstrations(self, self._tasks, self.demo_episodes, lambda info: demo_action(
            rng, expert_action(self.position in self.opened, self.has_key), self.demo_mistakes))

    @classmethod
    def corpus_texts(cls) -> Iterator[str]:
        """Observations and actions of demonstrations with mistakes (for a tokenizer)."""
        for observation, action in cls(demo_mistakes=0.3).demonstrations():
            yield observation
            yield action


@dataclass(frozen=True)
class StepTask:
    """One state of the game (the question), its valid actions and the expert's one."""

    id: str
    question: str
    answer: str
    valid: tuple[str, ...]
    task_type: str
    difficulty: str = "easy"


def step_tasks(split: str, num_boxes: int, seed: int = 0) -> list[StepTask]:
    """Every state the expert can meet, for every row of boxes of ``split``: at each box,
    closed; opened and empty (but at the last box, where the expert never stands without
    the key); holding the key. Task type: the expert's action."""
    tasks = []
    for row in box_rows(split, num_boxes, seed):
        for position, colour in enumerate(row):
            states = [(False, False), (True, True)] + ([(True, False)] if position < num_boxes - 1 else [])
            for is_open, has_key in states:
                answer = expert_action(is_open, has_key)
                status = "key" if has_key else ("empty" if is_open else "closed")
                question = state_text(colour, position, num_boxes, is_open, has_key)
                valid = tuple(allowed_actions(position, num_boxes, is_open, has_key))
                tasks.append(StepTask(f"{'-'.join(row)}@{position}:{status}", question, answer, valid, answer))
    return tasks


class KeyStepEnv(SingleStepTaskEnv):
    """Single-step: the best action in one state of the game (see the module docstring).

    split:         "train" or "test" (held-out colour sets).
    num_boxes:     boxes per row (2-7).
    invalid_cost:  cost of an invalid answer (shaping ``-invalid_cost``, in the step reward).
    demo_mistakes: probability that a demonstration gives one of the other two actions.
    demo_episodes: demonstrations per task.
    demo_seed:     seed of the demonstrations' mistakes.
    seed:          seed of the split (which colour sets are held out).
    """

    system_prompt: ClassVar[str | None] = "Choose the best action: open, next or use key."
    reward_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    answer_format: ClassVar[str | None] = None
    _tasks: dict[str, StepTask]

    def __init__(self, split: str = "train", num_boxes: int = 3, invalid_cost: float = 0.1,
                 demo_mistakes: float = 0.0, demo_episodes: int = 1, demo_seed: int = 0, seed: int = 0):
        super().__init__(max_observation_chars=512, max_action_chars=4096)
        check_options(split, invalid_cost, demo_mistakes, demo_episodes)
        self.num_boxes, self.seed, self.demo_seed = num_boxes, seed, demo_seed
        self.invalid_cost, self.demo_mistakes, self.demo_episodes = float(invalid_cost), demo_mistakes, demo_episodes
        self._set_tasks(split, step_tasks(split, num_boxes, seed))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Grade ``action``; always terminates. The observation after the end is ``""``."""
        task: StepTask = self._take_step()
        parsed = parse_action(action)
        valid = parsed is not None and parsed in task.valid
        won = valid and parsed == task.answer
        if won:
            feedback = f"correct: {parsed} was the best action"
        elif valid:
            feedback = f"wrong: {parsed} is allowed here but not the best action"
        else:
            feedback = f"invalid answer {action.strip()[:40]!r}: not an action allowed here"
        shaping = 0.0 if valid else -self.invalid_cost
        info = {
            "verdict": Verdict(float(won), feedback, won),
            "action": parsed or "",
            "invalid_action": not valid,
            "shaping": shaping,
            "task_id": task.id,
            "task_type": task.task_type,
        }
        return "", float(won) + shaping, True, False, info

    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """(question, action) ``demo_episodes`` times per task of this split: the expert's
        action, or with probability ``demo_mistakes`` one of the other two."""
        rng = random.Random(self.demo_seed)
        for _ in range(self.demo_episodes):
            for task in self._tasks.values():
                yield task.question, demo_action(rng, task.answer, self.demo_mistakes)

    @classmethod
    def corpus_texts(cls) -> Iterator[str]:
        """Each train question and its answer (for a tokenizer)."""
        for task in step_tasks("train", 3):
            yield task.question
            yield task.answer
