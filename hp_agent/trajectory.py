"""Trajectories, token in and token out.

A trajectory stores the exact token ids the policy saw and produced, never text that is
re-tokenized later. Each :class:`Turn` holds the prompt ids as rendered at generation
time, the sampled action ids and their sampling log-probs, and what the environment
answered. The *eligibility mask* is 1 exactly on sampled action tokens.

*Segments* are the units that get their own hindsight context: in a multi-turn
environment a segment is one turn's action; in a single-step environment the response is
split at paragraph boundaries ("\\n\\n") with a maximum segment length.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hp_agent.errors import UserValueError
from hp_agent.files import atomic_file


@dataclass
class Turn:
    """One policy step of an episode.

    prompt_messages: chat messages the prompt was rendered from (the hindsight scorer
                     re-renders them with the privileged block in the last user message).
    prompt_ids:      the prompt token ids exactly as the policy saw them.
    action_ids:      the sampled token ids (the eligible tokens), end-of-turn token included
                     unless ``truncated``.
    sample_logprobs: log-probs of ``action_ids`` reported by the sampler.
    action_text:     ``action_ids`` decoded, special tokens removed.
    action:          the action the environment parsed from ``action_text``.
    observation:     the environment's answer to this action ("" when the episode ended).
    reward:          the step reward the environment returned (outcome plus shaping).
    shaping:         per-turn shaping reward included in ``reward``, negative for a cost
                     (-0.1 for an invalid ALFWorld action); added to the turn's credit.
    invalid:         the action could not be parsed; with ``rollout.truncated_turn=invalid``
                     also a truncated turn, which the env is then sent as an empty action.
    truncated:       sampling stopped before the end-of-turn token (``rollout.max_new_tokens``
                     reached, or vLLM's ``max_model_len``): the action may be cut mid-word.
    expert_action:   the env's expert advice for the state this turn was prompted in
                     (``info["expert_action"]``, ALFWorld's handcoded expert), where the env
                     gives one: a label for imitation (DAgger), never shown to the policy.
    allowed:         under restricted decoding (``rollout.constrain_to_admissible``), per
                     action token the ids it was sampled among (None where free); scoring and
                     the learner renormalize over the same sets. None: decoding was free.
    """

    prompt_messages: list[dict[str, str]]
    prompt_ids: list[int]
    action_ids: list[int]
    sample_logprobs: list[float]
    action_text: str
    action: str = ""
    observation: str = ""
    reward: float = 0.0
    shaping: float = 0.0
    invalid: bool = False
    truncated: bool = False
    expert_action: str | None = None
    allowed: list[list[int] | None] | None = None


@dataclass
class Trajectory:
    """One episode of one task.

    reward:   the verifier's outcome reward R (from the final ``Verdict``).
    feedback: the verifier's feedback O shown in hindsight (never a reference answer).
    group:    index of the prompt group (GRPO samples G trajectories per group).
    multi_turn: played in a multi-turn env: each turn is one segment and hindsight shows
              the later turns, even when the episode ended after one turn.
    errored:  the episode failed for an infrastructure reason and is excluded from learning.
    policy_version: the learner updates (training steps) applied to the weights that played
              and scored it: the training step's own with ``trainer.off_policy_steps=0``,
              the step's minus that many (after the first steps) with one-step-off training.
    """

    env: str
    task_id: str
    task_type: str
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    feedback: str = ""
    success: bool = False
    truncated: bool = False
    group: int = 0
    multi_turn: bool = False
    errored: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        data["turns"] = [Turn(**turn) for turn in data.get("turns", [])]
        return cls(**data)


def usable_indices(trajectories: list[Trajectory]) -> list[int]:
    """The trajectories credit and the learner use: not errored, with an action token."""
    return [k for k, t in enumerate(trajectories) if not t.errored and any(turn.action_ids for turn in t.turns)]


@dataclass(frozen=True)
class Segment:
    """Action tokens ``[start, end)`` of turn ``turn`` in a trajectory."""

    turn: int
    start: int
    end: int


def paragraph_segments(
    action_ids: Sequence[int], token_texts: Sequence[str], max_tokens: int
) -> list[tuple[int, int]]:
    """Split one response into ``[start, end)`` spans at paragraph breaks.

    A span ends after a token whose text contains a blank line ("\\n\\n"), or after
    ``max_tokens`` tokens. ``token_texts[i]`` is the decoded text of ``action_ids[i]``.

    >>> paragraph_segments([1, 2, 3, 4], ["a", "\\n\\n", "b", "c"], max_tokens=8)
    [(0, 2), (2, 4)]
    """
    if len(action_ids) != len(token_texts):
        raise ValueError(f"{len(action_ids)} action ids but {len(token_texts)} token texts")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    spans: list[tuple[int, int]] = []
    start = 0
    for i, text in enumerate(token_texts):
        if "\n\n" in text or i + 1 - start >= max_tokens:
            spans.append((start, i + 1))
            start = i + 1
    if start < len(action_ids):
        spans.append((start, len(action_ids)))
    return spans


def segments(
    trajectory: Trajectory, token_texts: Sequence[Sequence[str]], max_segment_tokens: int
) -> list[Segment]:
    """Hindsight segments of a trajectory.

    Multi-turn trajectories: one segment per turn's action. Single-step trajectories:
    the response split at paragraph boundaries (see :func:`paragraph_segments`).
    ``token_texts[t]`` holds the decoded text of each action token of turn ``t``.
    """
    if not trajectory.multi_turn:
        turn = trajectory.turns[0]
        spans = paragraph_segments(turn.action_ids, token_texts[0], max_segment_tokens)
        return [Segment(0, start, end) for start, end in spans]
    return [Segment(t, 0, len(turn.action_ids)) for t, turn in enumerate(trajectory.turns) if turn.action_ids]


def format_token_mask(token_texts: Sequence[str], answer_format: str | None, special_texts: Iterable[str] = ()) -> list[bool]:
    """True on tokens of the answer's markup: those overlapping a match of the
    ``answer_format`` regular expression in the joined text, and special tokens (the
    end-of-turn token).

    >>> format_token_mask(["<action>", "go", " north", "</", "action>", "<|im_end|>"], "</?action>", ["<|im_end|>"])
    [True, False, False, True, True, True]
    """
    special = set(special_texts)
    mask = [text in special for text in token_texts]
    if answer_format:
        ends = list(itertools.accumulate(len(text) for text in token_texts))
        for match in re.finditer(answer_format, "".join(token_texts)):
            first = bisect.bisect_right(ends, match.start())
            last = bisect.bisect_left(ends, match.end())
            for i in range(first, min(last + 1, len(mask))):
                mask[i] = True
    return mask


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory]) -> None:
    """Write trajectories as JSONL, atomically (a temp file renamed over ``path``)."""
    with atomic_file(Path(path)) as f:
        for trajectory in trajectories:
            f.write(json.dumps(trajectory.to_dict(), ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Read trajectories written by :func:`write_jsonl`."""
    with Path(path).open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError) as error:
                raise UserValueError(f"{path}:{line_number}: not a trajectory record ({error})") from error
