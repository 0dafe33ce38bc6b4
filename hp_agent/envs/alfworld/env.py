"""ALFWorld household text games as a multi-turn :class:`TextEnv`, on the real engine.

Protocol (``prompt_mode="verl-agent"``, the default) follows verl-agent's ALFWorld
environment manager (langfengQ/verl-agent, ``agent_system/environments/prompts/
alfworld.py`` and ``env_manager.py``) so success rates compare with published runs:

* The first observation is ``TEMPLATE_NO_HISTORY``: the game's intro text (room and
  "Your task is to: ...") and the admissible actions.
* Later observations are ``TEMPLATE``: the task, the number of steps taken, the last
  ``history_length`` steps as ``[Observation k: '<text the action answered>', Action k:
  '<action>']`` lines, the current game text and the admissible actions.
* Admissible actions are the engine's, without ``help``, each in single quotes, joined
  by ``"\\n "`` inside ``[...]``, exactly as verl-agent lists them.
* The action is the first ``<action>...</action>`` of the response, lowercased and
  stripped. A response without it is invalid: as in verl-agent, the game receives the
  response's last 30 characters (lowercased) and normally answers "Nothing happens.";
  the step costs ``invalid_penalty``.
* Reward: ``win_reward`` on the step that wins, minus ``invalid_penalty`` on each invalid
  step (``info["shaping"] = -invalid_penalty``, negative: a cost). Winning terminates; ``max_steps`` steps without a win
  truncate (Gymnasium-style). The verdict's reward is ``win_reward`` or 0. Training may add
  ``subgoal_reward`` shaping (:mod:`hp_agent.envs.alfworld.subgoals`; 0, the protocol, by default).

``prompt_mode="chat"``: the first observation is the same; later observations hold only
the new game text and the admissible actions, for rollouts that keep the whole chat.

``prompt_mode="append"``, for restricted decoding (``rollout.constrain_to_admissible``, whose
default it is) and small models: a short instruction and the game's intro once, then each
turn only the game's answer to the action, so that the conversation grows by appending
and every turn reuses the keys and values of all earlier ones. The admissible actions
are left out (the decoder restricts to them; ``list_actions=True`` lists them), and the
response is the bare action, without tags: it plays its first line, lowercased, and is
invalid (costing ``invalid_penalty``) where that is not an admissible action.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hp_agent.envs.alfworld.data import (
    SHORT_TASK_TYPES,
    GameInfo,
    interleave_by_type,
    list_games,
    short_task_types,
)
from hp_agent.envs.alfworld.sources import resolve_data_root
from hp_agent.envs.alfworld.subgoals import SubgoalTracker
from hp_agent.envs.base import TextEnv, find_task
from hp_agent.errors import MissingPackageError, UserLookupError, UserValueError
from hp_agent.verifiers import Verdict

# verl-agent's templates, character for character (its "observaitons" typo and the
# space after "tags." included): a prompt that differs is a different task. Written as
# joined lines so that no editor can strip the significant trailing space.
_INSTRUCTIONS = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be "
    "enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and "
    "present it within <action> </action> tags.\n"
)
TEMPLATE_NO_HISTORY = (
    "\nYou are an expert agent operating in the ALFRED Embodied Environment.\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n" + _INSTRUCTIONS
)
TEMPLATE = (
    "\nYou are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description}\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} "
    "observaitons and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n" + _INSTRUCTIONS
)

# Chat mode: one user turn per step; the instructions were given in the first turn.
CHAT_TURN_TEMPLATE = """{current_observation}
Your admissible actions of the current situation are: [{admissible_actions}]."""
# Append mode: the instruction once, then the game's text alone (and the actions with list_actions).
APPEND_FIRST_TEMPLATE = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Each turn, reply with one "
    "admissible action.\n{current_observation}"
)
ACTIONS_LINE = "\nAdmissible actions: [{admissible_actions}]."

HISTORY_ENTRY = "[Observation {step}: '{observation}', Action {step}: '{action}']"
PROMPT_MODES: tuple[str, ...] = ("verl-agent", "chat", "append")
# Modes whose observations after the first hold only new text: the rollout keeps the conversation.
CONVERSATION_MODES: tuple[str, ...] = ("chat", "append")
TASK_MARKER = "Your task is to: "
INVALID_TAIL_CHARS = 30  # verl-agent's projection keeps this much of an unparsable response
_ACTION_TAGS = re.compile(r"<action>(.*?)</action>", re.DOTALL)


def parse_action(response: str, require_think: bool = False) -> tuple[str, bool]:
    """The command a response plays and whether it was well formed (verl-agent's projection).

    >>> parse_action("<think>hm</think><action> Go to Desk 1 </action>")
    ('go to desk 1', True)
    >>> parse_action("go to desk 1")
    ('go to desk 1', False)
    """
    lowered = response.lower()
    match = _ACTION_TAGS.search(lowered)
    if match is None:
        return lowered[-INVALID_TAIL_CHARS:], False
    well_formed = not require_think or ("<think>" in response and "</think>" in response)
    return match.group(1).strip(), well_formed


def parse_bare_action(response: str, admissible: list[str]) -> tuple[str, bool]:
    """Append mode's projection: the first line, lowercased and stripped; well formed where
    it is one of the ``admissible`` actions.

    >>> parse_bare_action(" Go to desk 1\nmore", ["go to desk 1"])
    ('go to desk 1', True)
    """
    lines = response.strip().lower().splitlines()
    command = lines[0].strip() if lines else ""
    return command, command in admissible


def action_template_of(messages: list[dict[str, str]]) -> str:
    """The action template of the prompt mode ``messages`` were rendered in: append mode's
    bare action where the conversation opens with its instruction, else the tagged one."""
    opening = APPEND_FIRST_TEMPLATE.split("{", 1)[0]
    appended = any(m["role"] == "user" and m["content"].startswith(opening) for m in messages)
    return "{action}" if appended else "<action>{action}</action>"


def prompting(kwargs: dict[str, Any], constrain: bool, chat_history: bool | None) -> tuple[dict[str, Any], bool]:
    """The env kwargs and ``rollout.chat_history`` a run or an evaluation plays ALFWorld with:
    restricted decoding defaults to ``prompt_mode="append"``, and a mode whose later
    observations hold only new text needs the conversation kept (``chat_history`` None:
    not set, so it follows the mode; False with such a mode is refused)."""
    mode = kwargs.get("prompt_mode") or ("append" if constrain else "verl-agent")
    if mode in CONVERSATION_MODES and chat_history is False:
        raise UserValueError(f"env.kwargs.prompt_mode={mode} sends each turn's new text only, so it needs "
                             "rollout.chat_history=true (the whole conversation as the prompt); for a prompt without "
                             "the conversation set env.kwargs.prompt_mode=verl-agent")
    return {**kwargs, "prompt_mode": mode}, bool(chat_history) or mode in CONVERSATION_MODES


def offered_actions(admissible_commands: list[str]) -> list[str]:
    """The actions shown to the policy: the engine's, without ``help``."""
    return [command for command in admissible_commands if command != "help"]


def format_actions(actions: list[str]) -> str:
    """verl-agent's listing: ``'a'\\n 'b'``.

    >>> format_actions(["go to desk 1", "look"])
    "'go to desk 1'\\n 'look'"
    """
    return "\n ".join(f"'{action}'" for action in actions)


def task_description(intro: str) -> str:
    """The text after "Your task is to: " in a game's intro."""
    start = intro.find(TASK_MARKER)
    if start == -1:
        raise ValueError(f"no {TASK_MARKER!r} in the game's intro text: {intro[:200]!r}")
    return intro[start + len(TASK_MARKER):].strip()


def format_history(history: list[tuple[str, str]], history_length: int) -> str:
    """The last ``history_length`` (observation, action) pairs, numbered from the episode start."""
    recent = history[-history_length:] if history_length > 0 else []
    first = len(history) - len(recent) + 1
    return "\n".join(HISTORY_ENTRY.format(step=first + k, observation=observation, action=action)
                     for k, (observation, action) in enumerate(recent))


@dataclass
class _Episode:
    """The state of the episode in progress."""

    game: GameInfo
    task: str
    feedback: str  # the game's latest text
    actions: list[str]  # offered to the policy now
    history: list[tuple[str, str]] = field(default_factory=list)  # (text the action answered, action)
    expert_action: str | None = None
    won: bool = False
    done: bool = False
    subgoals: SubgoalTracker | None = None  # with subgoal_reward > 0


class AlfworldEnv(TextEnv):
    """The ALFWorld games of one split, played on the TextWorld engine.

    split:          ``train`` (official train folder, else the ``valid_train`` sample),
                    ``id`` (valid_seen, 140 games) or ``ood`` (valid_unseen, 134 games);
                    ALFWorld's folder names are accepted too.
    source:         ``auto`` (official games where found, else synthesized ones for
                    ``train``), ``official``, ``synth`` (built on first use) or ``alfred``;
                    see :mod:`hp_agent.envs.alfworld.sources`.
    data_root:      folder holding ``json_2.1.1/``; overrides ``source``.
    task_types:     keep only these task types (short names pick, look, clean, heat, cool,
                    pick2, or ALFWorld's long names); default all six.
    max_steps:      actions per episode before it is truncated (verl-agent: 50).
    num_games:      keep the first ``num_games`` games of :meth:`task_ids` (which cycles
                    through the task types, so any prefix is balanced).
    history_length: steps of history in each prompt (verl-agent: 2).
    prompt_mode:    ``"verl-agent"`` (full prompt every step), ``"chat"`` (new text and the
                    admissible actions) or ``"append"`` (new text only, bare actions).
    list_actions:   list the admissible actions in each prompt; None: as the mode does
                    (verl-agent and chat list them, append does not).
    invalid_penalty: subtracted from the reward of each step without ``<action>`` tags (in
                    append mode: each step whose action is not admissible).
    subgoal_reward: shaping paid once per episode for holding an object of the task's type
                    and once for heating/cooling/cleaning it or lighting the lamp with it
                    (:mod:`hp_agent.envs.alfworld.subgoals`); 0 (verl-agent) pays none. For
                    training only: success and the verdict never include it.
    win_reward:     reward of the winning step and of a won episode's verdict.
    require_think:  also count a response without ``<think>...</think>`` as invalid (verl-agent does).
    expert:         run ALFWorld's handcoded expert (fixed) beside the game for
                    ``info["expert_action"]``; off saves its bookkeeping.
    walkthrough_info: also put the game's stored solution (in the names players see; None
                    where the game stores none) in the reset's ``info["walkthrough"]``: the
                    scripted walkthrough player's script, read where the env lives (a worker
                    process, in a pool).
    speedups:       serve Fast Downward translations (also kept on disk, under
                    ``<cache>/alfworld_translations``) and grammar parses from caches and
                    skip needless deep copies (:mod:`hp_agent.envs.alfworld.speedups`), so a
                    game is translated once and a replay resets in tens of milliseconds;
                    off runs TextWorld's engine as shipped. Episodes are the same either way.
    """

    system_prompt: ClassVar[str | None] = None
    reward_bounds: ClassVar[tuple[float, float]] = (0.0, 10.0)
    answer_format: ClassVar[str | None] = r"</?action>|</?think>"
    action_template: ClassVar[str] = "<action>{action}</action>"
    eval_split: ClassVar[str | None] = "id"
    compare_splits: ClassVar[tuple[str, ...]] = ("id", "ood")  # in and out of distribution, as the paper reports
    task_type_order: ClassVar[tuple[str, ...]] = SHORT_TASK_TYPES
    limit_argument: ClassVar[str | None] = "num_games"  # synthesized games are built on first use
    # Prompts for the tokenizer corpus: games played and steps taken per game.

    def __init__(self, split: str = "train", source: str = "auto", data_root: str | Path | None = None,
                 task_types: list[str] | tuple[str, ...] | None = None, max_steps: int = 50,
                 num_games: int | None = None, history_length: int = 2, prompt_mode: str = "verl-agent",
                 list_actions: bool | None = None,
                 invalid_penalty: float = 0.1, win_reward: float = 10.0, require_think: bool = False,
                 expert: bool = True, speedups: bool = True, walkthrough_info: bool = False,
                 subgoal_reward: float = 0.0):
        super().__init__()
        if prompt_mode not in PROMPT_MODES:
            raise UserValueError(f"unknown prompt_mode {prompt_mode!r}; valid: {', '.join(PROMPT_MODES)}")
        if list_actions is False and prompt_mode != "append":
            raise UserValueError(f"list_actions=false is append mode's; prompt_mode={prompt_mode} always lists the actions")
        if max_steps < 1:
            raise UserValueError(f"max_steps must be >= 1, got {max_steps}")
        if history_length < 0:
            raise UserValueError(f"history_length must be >= 0, got {history_length}")
        if num_games is not None and num_games < 1:
            raise UserValueError(f"num_games must be >= 1 (or None for all), got {num_games}")
        if win_reward <= 0 or invalid_penalty < 0:
            raise UserValueError(f"need win_reward > 0 and invalid_penalty >= 0, got {win_reward} and {invalid_penalty}")
        if not 0 <= subgoal_reward < win_reward:
            raise UserValueError(f"subgoal_reward must be in [0, win_reward = {win_reward}), got {subgoal_reward}")
        self.split = split
        self.max_steps = self.max_turns = max_steps
        self.history_length = history_length
        self.prompt_mode = prompt_mode
        self.list_actions = prompt_mode != "append" if list_actions is None else bool(list_actions)
        if prompt_mode == "append":
            self.action_template = "{action}"  # type: ignore[misc]  # the bare action, no tags
        self.invalid_penalty = float(invalid_penalty)
        self.subgoal_reward = float(subgoal_reward)
        self.win_reward = float(win_reward)
        self.reward_bounds = (0.0, self.win_reward)  # the credit bound follows the knob
        self.require_think = require_think
        self.expert = expert
        self.walkthrough_info = walkthrough_info
        self.speedups = speedups
        self.data_root = resolve_data_root(split, source, data_root, num_games)
        games = interleave_by_type(list_games(self.data_root, split), short_task_types(task_types))
        self._games: dict[str, GameInfo] = {g.task_id: g for g in games[:num_games]}
        self._engine: Any = None  # engine.AlfworldGame, built on the first reset
        self._episode: _Episode | None = None

    # ---- tasks ---------------------------------------------------------------------------
    def task_ids(self) -> list[str]:
        """Task ids (``split/task-folder/trial``), cycling through the task types."""
        return list(self._games)

    def game(self, task_id: str) -> GameInfo:
        """The game behind ``task_id``."""
        return find_task(self._games, task_id, self, noun="games")

    def _load(self, game: GameInfo) -> Any:
        # One engine per env, loading game after game; a replay (GRPO groups, repeated
        # evaluation samples) skips the load, and the speed-ups make loads and resets cheap.
        if self._engine is None:
            try:
                from hp_agent.envs.alfworld.engine import AlfworldGame
            except ModuleNotFoundError as error:
                raise MissingPackageError(f"the ALFWorld engine needs alfworld and textworld[pddl] ({error}); "
                                          "install them with `pip install -e '.[alfworld]'`") from error
            self._engine = AlfworldGame(expert=self.expert, speedups=self.speedups)
        if self._engine.game_file != game.game_file:
            self._engine.load(game.game_file)
        return self._engine

    # ---- episode -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start ``options["task_id"]``, else the seed's game, else a random one."""
        super().reset(seed=seed)
        game = self.game(self.task_id_for_reset(seed, options))
        engine = self._load(game)
        start = engine.reset(seed=int(self.np_random.integers(2**31 - 1)))
        self._episode = _Episode(game=game, task=task_description(start.feedback), feedback=start.feedback,
                                 actions=offered_actions(start.admissible_commands), expert_action=start.expert_action,
                                 won=start.won)
        if self.subgoal_reward > 0:
            self._episode.subgoals = SubgoalTracker(game.task_id, game.task_type)
        info = self._info()
        if self.walkthrough_info:
            info["walkthrough"] = engine.walkthrough()
        return self._render(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play the first ``<action>`` of ``action``; see the module docstring for rewards."""
        episode = self._episode
        if episode is None:
            raise RuntimeError("AlfworldEnv.step() called before reset()")
        if episode.done:
            raise RuntimeError("AlfworldEnv episode is over; call reset() first")
        if self.prompt_mode == "append":
            command, valid = parse_bare_action(action, episode.actions)
        else:
            command, valid = parse_action(action, self.require_think)
        result = self._engine.step(command)
        episode.history.append((episode.feedback, command))
        episode.feedback = result.feedback
        episode.actions = offered_actions(result.admissible_commands)
        episode.expert_action = result.expert_action
        episode.won = result.won
        terminated = result.won
        truncated = not terminated and len(episode.history) >= self.max_steps
        episode.done = terminated or truncated
        shaping = 0.0 if valid else -self.invalid_penalty
        subgoals = episode.subgoals.step(command, result.accepted) if episode.subgoals is not None else []
        shaping += self.subgoal_reward * len(subgoals)
        reward = (self.win_reward if terminated else 0.0) + shaping
        info = self._info()
        info.update(action=command, invalid_action=not valid, shaping=shaping, accepted=result.accepted)
        if subgoals:
            info["subgoals"] = subgoals
        if episode.done:
            info["verdict"] = self._verdict()
        return self._render(), reward, terminated, truncated, info

    def _info(self) -> dict[str, Any]:
        episode = self._episode
        assert episode is not None
        return {
            "task_id": episode.game.task_id,
            "task_type": episode.game.task_type,
            "game_file": str(episode.game.game_file),
            "admissible_actions": list(episode.actions),
            "won": episode.won,
            "expert_action": episode.expert_action,
            "game_text": episode.feedback,
            "steps": len(episode.history),
        }

    def _verdict(self) -> Verdict:
        """What happened, never how to solve it (no expert advice, no walkthrough)."""
        episode = self._episode
        assert episode is not None
        steps = len(episode.history)
        if episode.won:
            return Verdict(self.win_reward, f"success: the task was completed in {steps} steps", True)
        feedback = f"failure: the task was not completed within {steps} steps; last observation: {episode.feedback}"
        return Verdict(0.0, feedback, False)

    def _render(self) -> str:
        """The text the policy is prompted with now (see the module docstring)."""
        episode = self._episode
        assert episode is not None
        actions = format_actions(episode.actions)
        steps = len(episode.history)
        if self.prompt_mode == "append":
            listed = ACTIONS_LINE.format(admissible_actions=actions) if self.list_actions else ""
            return (APPEND_FIRST_TEMPLATE.format(current_observation=episode.feedback) if steps == 0
                    else episode.feedback) + listed
        if steps == 0 or self.history_length == 0:
            # verl-agent uses the no-history template whenever history is off, too.
            return TEMPLATE_NO_HISTORY.format(current_observation=episode.feedback, admissible_actions=actions)
        if self.prompt_mode == "chat":
            return CHAT_TURN_TEMPLATE.format(current_observation=episode.feedback, admissible_actions=actions)
        return TEMPLATE.format(
            task_description=episode.task,
            step_count=steps,
            history_length=min(self.history_length, steps),
            action_history=format_history(episode.history, self.history_length),
            current_step=steps + 1,
            current_observation=episode.feedback,
            admissible_actions=actions,
        )

    # ---- privileged access for scripted evaluation (never shown to the policy) --------------
    def walkthrough(self) -> list[str]:
        """The current game's stored solution, in the names players see."""
        if self._episode is None:
            raise RuntimeError("AlfworldEnv.walkthrough() needs reset() first")
        commands = self._engine.walkthrough()
        if commands is None:
            raise UserLookupError(f"game {self._episode.game.task_id} stores no walkthrough (the {self.split!r} split's "
                                  "games have none); use the expert policy instead")
        return commands

    def close(self) -> None:
        """Release the engine."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        super().close()

    # ---- texts ---------------------------------------------------------------------------
    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """(prompt, ``<action>expert action</action>``) for every step of each game the fixed
        expert wins within ``max_steps`` (about 1 s per game not yet translated)."""
        for task_id in self.task_ids():
            pairs = list(_expert_pairs(self, task_id, self.max_steps))
            if self._episode is not None and self._episode.won:
                yield from pairs

    @classmethod
    def corpus_texts(cls) -> Iterator[str]:
        """The prompt templates and typical game texts. Fixed text only, never the game
        data: the tiny model's tokenizer must come out the same on every machine."""
        yield TEMPLATE_NO_HISTORY
        yield TEMPLATE
        yield from _EXAMPLE_TEXTS


_EXAMPLE_TEXTS: tuple[str, ...] = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see "
    "a cabinet 1, a countertop 1, a drawer 1, a fridge 1, a microwave 1, a sinkbasin 1, and a toaster 1.\n\n"
    "Your task is to: put a clean apple in fridge.",
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, a knife 1, and a mug 2.",
    "You pick up the apple 1 from the countertop 1.",
    "You open the fridge 1. The fridge 1 is open. In it, you see a egg 1, and a lettuce 1.",
    "You clean the apple 1 using the sinkbasin 1.",
    "You heat the potato 1 using the microwave 1.",
    "You cool the mug 1 using the fridge 1.",
    "You move the apple 1 to the fridge 1.",
    "You turn on the desklamp 1.",
    "Nothing happens.",
    "<think>The apple is on the countertop; I should take it.</think><action>take apple 1 from countertop 1</action>",
)


# ALFRED's object and receptacle types (alfworld.gen.constants.OBJECTS, lowercased), fixed
# here so that the tokenizer does not depend on the installed wheel.
ALFRED_NAMES: tuple[str, ...] = tuple("""
alarmclock apple armchair baseballbat basketball bathtub bathtubbasin bed blinds book boots bowl box bread
butterknife cabinet candle cart cd cellphone chair cloth coffeemachine coffeetable countertop creditcard cup
curtains desk desklamp diningtable dishsponge drawer dresser egg floorlamp footstool fork fridge garbagecan
glassbottle handtowel handtowelholder houseplant kettle keychain knife ladle laptop laundryhamper
laundryhamperlid lettuce lightswitch microwave mirror mug newspaper ottoman painting pan papertowel
papertowelroll pen pencil peppershaker pillow plate plunger poster pot potato remotecontrol safe saltshaker
scrubbrush shelf showerdoor showerglass sidetable sink sinkbasin soapbar soapbottle sofa spatula spoon
spraybottle statue stoveburner stoveknob teddybear television tennisracket tissuebox toaster toilet
toiletpaper toiletpaperhanger toiletpaperroll tomato towel towelholder tvstand vase watch wateringcan window
winebottle
""".split())
_ACTION_VERBS = ("go to", "take", "move", "open", "close", "examine", "use", "heat", "cool", "clean")


def vocabulary_texts() -> Iterator[str]:
    """Every ALFRED name and admissible-action verb in the forms games print, twice each:
    BPE then merges each into one token (the ``tiny-alfworld`` tokenizer's extra corpus)."""
    for name in ALFRED_NAMES:
        yield f"you see a {name} 1, and a {name} 2. 'take {name} 1 from {name} 2'\n 'go to {name} 1'" * 2
    for verb in _ACTION_VERBS:
        yield f"[Observation 1: 'x', Action 1: '{verb} a 1'] ['{verb} a 1'\n '{verb} a 2']" * 2


def _expert_pairs(env: AlfworldEnv, task_id: str, steps: int) -> Iterator[tuple[str, str]]:
    """Play ``task_id`` with the expert for up to ``steps`` steps: (prompt, response) pairs."""
    observation, info = env.reset(seed=0, options={"task_id": task_id})
    for _ in range(steps):
        action = info["expert_action"]
        if action is None:
            return
        response = env.action_template.format(action=action)
        yield observation, response
        observation, _, terminated, truncated, info = env.step(response)
        if terminated or truncated:
            return
