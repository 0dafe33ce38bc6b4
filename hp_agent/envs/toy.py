"""Two small box-and-key envs, made for learning tests: fast, short prompts, held-out tasks.

* ``keys`` (:class:`KeysEnv`, multi-turn): a few closed boxes, labelled with digits; one
  hides the key. Actions ``open N`` and ``use key``. Opening a closed box shows whether the
  key was in it; ``use key`` while holding the key wins (R = 1). Reopening a box, opening
  one that is not there, using a key not held, or any other text is an invalid action:
  it costs ``invalid_cost`` (``info["shaping"] = -invalid_cost``) and uses up the turn.
  An episode has ``num_boxes + 1`` turns, exactly what the worst case needs (open every
  box, then use the key), so every wasted turn can lose the game; out of turns, R = 0.
* ``keyhint`` (:class:`KeyHintEnv`, single-step): a note names the box that holds the
  key; the answer ``open N`` wins (R = 1) when N is that box. Opening another listed box
  is a valid miss (R = 0); anything else is invalid (R = 0, cost ``invalid_cost``).

Tasks are a set of box labels (``num_boxes`` distinct digits 1-9) and the key's box; the
task id is ``"<labels>-<key>"``, e.g. ``"257-5"``. Splits divide the label *sets*: a
fixed quarter of them is ``test``, the rest ``train``, so a held-out task never shows a
set of boxes seen in training.

Both envs can give noisy demonstrations (``demo_mistakes``): an expert that, with that
probability at each step, makes a mistake instead. A short supervised warm-up on them
gives a policy that knows the action format but succeeds well below the ceiling, the
starting point that the learning tests (tests/test_learning.py) train from.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from itertools import combinations
from typing import Any, ClassVar

from hp_agent.envs.base import SingleStepTaskEnv, TextEnv, find_task
from hp_agent.verifiers import Verdict

SPLITS = ("train", "test")
LABELS = "123456789"
USE_KEY = "use key"
# Fraction of the label sets held out as the test split.
TEST_FRACTION = 0.25


@dataclass(frozen=True)
class BoxTask:
    """One task: box labels in listing order, the box holding the key, and the first
    observation (``question``) the single-step env shows."""

    id: str
    boxes: tuple[str, ...]
    key: str
    task_type: str
    difficulty: str
    question: str


def _hint_question(boxes: tuple[str, ...], key: str) -> str:
    # The key's box comes last, a fixed number of tokens before the reply starts: a
    # small model learns to copy from a fixed offset far faster than to search the text.
    return f"Closed boxes: {' '.join(boxes)}. The key is in box {key}."


@cache
def _label_sets(split: str, num_boxes: int, seed: int) -> tuple[tuple[str, ...], ...]:
    """The label sets of ``split``: a seeded shuffle of all sets, the first quarter for
    test, the rest for train (so the splits never share a set of boxes)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if not 2 <= num_boxes <= len(LABELS) - 1:
        raise ValueError(f"num_boxes must lie in [2, {len(LABELS) - 1}], got {num_boxes}")
    sets = list(combinations(LABELS, num_boxes))
    random.Random(seed).shuffle(sets)
    held_out = max(1, round(len(sets) * TEST_FRACTION))
    chosen = sets[:held_out] if split == "test" else sets[held_out:]
    return tuple(sorted(chosen))


def box_tasks(split: str, num_boxes: int, seed: int = 0) -> list[BoxTask]:
    """Every (label set of ``split``, key box) pair, in a fixed order."""
    return [
        BoxTask(f"{''.join(boxes)}-{key}", boxes, key, f"{num_boxes} boxes", "easy", _hint_question(boxes, key))
        for boxes in _label_sets(split, num_boxes, seed)
        for key in boxes
    ]


def parse_action(text: str) -> tuple[str, str] | None:
    """``"open 5"`` -> ("open", "5"); ``"use key"`` -> ("use", "key"); else None.

    Exact up to surrounding whitespace and case: a format the policy must learn, and a
    reply with anything else in it is invalid rather than guessed at.
    """
    words = text.strip().lower().split()
    if " ".join(words) == USE_KEY:
        return "use", "key"
    if len(words) == 2 and words[0] == "open":
        return "open", words[1]
    return None


def random_action(rng: random.Random) -> str:
    """A demonstration's mistake: ``use key`` or ``open`` a random digit, all ten alike
    (valid by chance at best: the digit may name no closed box, or the key is not held)."""
    return rng.choice([USE_KEY] + [f"open {label}" for label in LABELS])


def _check_common(split: str, invalid_cost: float, demo_mistakes: float, demo_episodes: int) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if invalid_cost < 0:
        raise ValueError(f"invalid_cost is a cost and must be >= 0, got {invalid_cost}")
    if not 0.0 <= demo_mistakes <= 1.0:
        raise ValueError(f"demo_mistakes is a probability, got {demo_mistakes}")
    if demo_episodes < 1:
        raise ValueError(f"demo_episodes must be >= 1, got {demo_episodes}")


class KeysEnv(TextEnv):
    """Multi-turn key finding (see the module docstring).

    split:         "train" or "test" (held-out label sets).
    num_boxes:     boxes per task (2-8); an episode has ``num_boxes + 1`` turns.
    invalid_cost:  cost of an invalid action (shaping ``-invalid_cost``, in the step reward).
    demo_mistakes: probability that the demonstrating expert acts at random at a step.
    demo_episodes: demonstration episodes per task.
    seed:          seed of the split (which label sets are held out).
    """

    system_prompt: ClassVar[str | None] = "Find the key: open N, then use key."
    reward_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    # The verb is the action's markup; the box label is its content.
    answer_format: ClassVar[str | None] = r"^\s*(open|use)\b"

    def __init__(self, split: str = "train", num_boxes: int = 3, invalid_cost: float = 0.1,
                 demo_mistakes: float = 0.0, demo_episodes: int = 1, seed: int = 0):
        super().__init__(max_observation_chars=512, max_action_chars=4096)
        _check_common(split, invalid_cost, demo_mistakes, demo_episodes)
        self.split, self.num_boxes, self.seed = split, num_boxes, seed
        self.invalid_cost, self.demo_mistakes, self.demo_episodes = float(invalid_cost), demo_mistakes, demo_episodes
        self.max_turns = num_boxes + 1  # the worst case: open every box, then use the key
        self._tasks = {task.id: task for task in box_tasks(split, num_boxes, seed)}
        self._task: BoxTask | None = None
        self._done = True

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    # --- state and text -------------------------------------------------------------

    def _state_text(self) -> str:
        closed = " ".join(self.closed) or "none"
        return f"Closed boxes: {closed}. " + ("You hold the key." if self.has_key else "No key yet.")

    def admissible_actions(self) -> list[str]:
        """The valid actions of the current state."""
        return [USE_KEY] if self.has_key else [f"open {box}" for box in self.closed]

    def _info(self) -> dict[str, Any]:
        assert self._task is not None
        return {"task_id": self._task.id, "task_type": self._task.task_type, "admissible_actions": self.admissible_actions()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a task: every box closed, no key."""
        super().reset(seed=seed)
        self._task = find_task(self._tasks, self.task_id_for_reset(seed, options), self)
        self.closed, self.opened = list(self._task.boxes), []
        self.has_key, self.turns, self.invalid_turns, self._done = False, 0, 0, False
        return self._state_text(), self._info()

    def _apply(self, parsed: tuple[str, str] | None) -> tuple[str, bool, bool]:
        """Carry out one parsed action: (event text, valid, won)."""
        assert self._task is not None
        if parsed is None:
            return "Unknown action.", False, False
        verb, target = parsed
        if verb == "use":
            return ("You unlock the door with the key.", True, True) if self.has_key else ("You have no key.", False, False)
        if target in self.opened:
            return f"Box {target} is already open.", False, False
        if target not in self.closed:
            return f"There is no box {target}.", False, False
        self.closed.remove(target)
        self.opened.append(target)
        if target == self._task.key:
            self.has_key = True
            return f"Box {target} has the key!", True, False
        return f"Box {target} is empty.", True, False

    def _feedback(self, won: bool) -> str:
        # What the agent did, never where an unopened key was.
        opened = " ".join(self.opened) or "none"
        key = "found the key" if self.has_key else "did not find the key"
        outcome = "won: used the key" if won else "lost: out of turns"
        return f"{outcome} after {self.turns} turns; opened boxes: {opened}; {key}; invalid actions: {self.invalid_turns}."

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one action; the game ends on ``use key`` with the key, or after ``max_turns`` turns."""
        if self._task is None or self._done:
            raise RuntimeError(f"{type(self).__name__} episode is over or not started; call reset() first")
        parsed = parse_action(action)
        event, valid, won = self._apply(parsed)
        self.turns += 1
        self.invalid_turns += not valid
        shaping = 0.0 if valid else -self.invalid_cost
        truncated = not won and self.turns >= self.max_turns
        self._done = won or truncated
        observation = event if won else f"{event} {self._state_text()}"
        info = self._info()
        info.update(action=" ".join(parsed) if parsed and parsed[0] == "open" else (USE_KEY if parsed else ""),
                    invalid_action=not valid, shaping=shaping)
        if self._done:
            info["verdict"] = Verdict(float(won), self._feedback(won), won)
        return observation, float(won) + shaping, won, truncated, info

    # --- demonstrations -------------------------------------------------------------

    def _demo_action(self, rng: random.Random) -> str:
        """The expert's action: use the key once held, else open the last closed box
        listed (always the same choice, so a demonstration is a clean signal to imitate).
        With probability ``demo_mistakes`` it acts at random instead (:func:`random_action`)."""
        if rng.random() < self.demo_mistakes:
            return random_action(rng)
        return USE_KEY if self.has_key else f"open {self.closed[-1]}"

    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """(observation, action) for every turn of ``demo_episodes`` expert episodes per
        task of this split (each observation is the whole prompt, so any turn is a
        demonstration). Plays on this env: it ends any episode in progress."""
        rng = random.Random(self.seed)
        for _ in range(self.demo_episodes):
            for task_id in self._tasks:
                observation, _ = self.reset(options={"task_id": task_id})
                done = False
                while not done:
                    action = self._demo_action(rng)
                    yield observation, action
                    observation, _, terminated, truncated, _ = self.step(action)
                    done = terminated or truncated

    @classmethod
    def corpus_texts(cls) -> Iterator[str]:
        """Sample observations and actions (for a tokenizer that should know this env)."""
        env = cls(demo_mistakes=0.3)
        for observation, action in env.demonstrations():
            yield observation
            yield action


class KeyHintEnv(SingleStepTaskEnv):
    """Single-step: open the box the note names (see the module docstring).

    split:         "train" or "test" (held-out label sets).
    num_boxes:     boxes per task (2-8).
    invalid_cost:  cost of an invalid answer (shaping ``-invalid_cost``, in the step reward).
    demo_mistakes: probability that a demonstration is a random action instead.
    demo_episodes: demonstrations per task.
    seed:          seed of the split (which label sets are held out).
    """

    system_prompt: ClassVar[str | None] = "Open the box with the key: open N."
    reward_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    answer_format: ClassVar[str | None] = r"^\s*open\b"
    _tasks: dict[str, BoxTask]

    def __init__(self, split: str = "train", num_boxes: int = 4, invalid_cost: float = 0.1,
                 demo_mistakes: float = 0.0, demo_episodes: int = 1, seed: int = 0):
        super().__init__(max_observation_chars=512, max_action_chars=4096)
        _check_common(split, invalid_cost, demo_mistakes, demo_episodes)
        self.num_boxes, self.seed = num_boxes, seed
        self.invalid_cost, self.demo_mistakes, self.demo_episodes = float(invalid_cost), demo_mistakes, demo_episodes
        self._set_tasks(split, box_tasks(split, num_boxes, seed))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Grade ``action``; always terminates. The observation after the end is ``""``."""
        task: BoxTask = self._take_step()
        parsed = parse_action(action)
        valid = parsed is not None and parsed[0] == "open" and parsed[1] in task.boxes
        won = valid and parsed[1] == task.key
        if won:
            feedback = f"correct: opened box {parsed[1]}, which holds the key"
        elif valid:
            feedback = f"wrong: opened box {parsed[1]}, which is empty"
        else:
            feedback = f"invalid answer {action.strip()[:40]!r}: reply open N with N a listed box"
        shaping = 0.0 if valid else -self.invalid_cost
        info = {
            "verdict": Verdict(float(won), feedback, won),
            "action": f"open {parsed[1]}" if valid else "",
            "invalid_action": not valid,
            "shaping": shaping,
            "task_id": task.id,
            "task_type": task.task_type,
        }
        return "", float(won) + shaping, True, False, info

    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """(question, answer) ``demo_episodes`` times per task of this split: ``open`` the
        key's box or, with probability ``demo_mistakes``, a random action
        (:func:`random_action`)."""
        rng = random.Random(self.seed)
        for _ in range(self.demo_episodes):
            for task in self._tasks.values():
                yield task.question, random_action(rng) if rng.random() < self.demo_mistakes else f"open {task.key}"

    @classmethod
    def corpus_texts(cls) -> Iterator[str]:
        """Each train question and its answer (for a tokenizer that should know this env)."""
        for task in box_tasks("train", 4):
            yield task.question
            yield f"open {task.key}"

