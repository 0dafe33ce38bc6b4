"""Hindsight scoring: causal and hindsight views of every eligible token (DESIGN.md 1-4).

The frozen generating policy scores each trajectory twice:

* causal view, per turn: ``prompt_ids + action_ids`` exactly as sampled. Its chosen-token
  log-probs are the behaviour log-probs the learner uses (for GRPO this pass alone is the
  "behaviour-policy replay").
* hindsight view, per segment: the turn's prompt re-rendered with a privileged block
  appended to the last user message (so the segment stays in the assistant role),
  followed by the turn's action tokens up to the end of the segment. The block holds the
  realized future after the segment and the verifier's feedback, never a reference.

The weight of token j is the normalized JSD between the two next-token distributions.
Two scorers give the same numbers: the per-segment reference (one padded sequence per
turn and per segment, ``hindsight.packed=false``) and the packed one (the default:
sequences packed as prefix trees, so each segment's hindsight part attends to the causal
prompt prefix it shares instead of recomputing it; see :mod:`hp_agent.packing`). Right
after a rollout on the transformers backend, the packed scorer also takes the prompts'
keys and values from the policy's prefix cache instead of running them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from hp_agent.batching import span_hidden_states
from hp_agent.config import TrainConfig
from hp_agent.constraint import joined_allowed
from hp_agent.kernels import TeacherSupport, chunked_logprobs, jsd_weights_from_hidden
from hp_agent.packing import SCORING, packed_span_hidden_states
from hp_agent.policies import Policy
from hp_agent.trajectory import Segment, Trajectory, Turn, segments

BLOCK_HEADER = "[Hindsight: privileged information, shown only for scoring]"


@dataclass
class TrajectoryScores:
    """Per-turn tensors aligned with each turn's ``action_ids``.

    causal_logprobs: log pi_old(y_j | causal history), [len(action_ids)] per turn; None
                     per turn when not replayed (:func:`unreplayed_scores`).
    weights:         normalized JSD w_j in [0, 1] per token (None when not scored).
    hindsight_logprobs: log pi_old(y_j | hindsight context) per token (None when not scored).
    teacher:         the hindsight distribution per turn, top-k or full (None unless
                     distillation reads it: ``ScoringOptions.teacher``).
    """

    causal_logprobs: list[torch.Tensor | None]
    weights: list[torch.Tensor] | None = None
    hindsight_logprobs: list[torch.Tensor] | None = None
    teacher: list[TeacherSupport] | None = None


def unreplayed_scores(trajectories: list[Trajectory]) -> list[TrajectoryScores]:
    """Scores of trajectories that are not replayed: a rule without hindsight whose learner
    takes one optimizer step on the batch runs that step on the weights that sampled, so
    its own forward pass gives the behaviour log-probs (``TrainingSample.old_logprobs``
    None) and a separate no-grad replay would compute the same numbers again."""
    return [TrajectoryScores(causal_logprobs=[None] * len(t.turns)) for t in trajectories]


def _truncate_tokens(tokenizer, text: str, max_tokens: int) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    return tokenizer.decode(ids[: max(max_tokens - 4, 0)]) + " ..."  # " ..." costs at most 4 tokens


def realized_future(trajectory: Trajectory, segment: Segment, future_turns: int, decode) -> str:
    """What happened after ``segment``: later text of the response, or later turns.

    Single-step: the rest of the response. Multi-turn: the observation that answered the
    segment's action, then up to ``future_turns`` later action/observation pairs.
    """
    turn = trajectory.turns[segment.turn]
    if not trajectory.multi_turn:
        rest = decode(turn.action_ids[segment.end :]).strip()
        return f"Rest of the response:\n{rest}" if rest else "This was the end of the response."
    lines = [f"Observation {segment.turn + 1}: {turn.observation}"] if turn.observation else []
    for k in range(segment.turn + 1, min(segment.turn + 1 + future_turns, len(trajectory.turns))):
        later = trajectory.turns[k]
        lines.append(f"Action {k + 1}: {later.action or later.action_text}")
        if later.observation:
            lines.append(f"Observation {k + 1}: {later.observation}")
    if not lines:
        return "This was the last step of the episode."
    return "What happened after this step:\n" + "\n".join(lines)


def privileged_block(
    trajectory: Trajectory, segment: Segment, tokenizer, future_turns: int, max_block_tokens: int, decode
) -> str:
    """The hindsight block for one segment: realized future and verifier feedback.

    The feedback is kept whole (up to a quarter of the budget); the future is cut to
    what remains of ``max_block_tokens``.
    """
    outcome = "success" if trajectory.success else "failure"
    feedback = _truncate_tokens(tokenizer, trajectory.feedback, max_block_tokens // 4)
    verdict = f"Outcome: {outcome} (reward {trajectory.reward:g}).\nVerifier feedback: {feedback}"
    fixed = len(tokenizer.encode(f"{BLOCK_HEADER}\n\n{verdict}", add_special_tokens=False))
    future_budget = max_block_tokens - fixed - 2  # two newlines join the parts
    if future_budget < 8:  # no room for a useful future: keep header and verdict only
        return f"{BLOCK_HEADER}\n{verdict}"
    future = _truncate_tokens(tokenizer, realized_future(trajectory, segment, future_turns, decode), future_budget)
    return f"{BLOCK_HEADER}\n{future}\n{verdict}"


def hindsight_messages(messages: list[dict[str, str]], block: str) -> list[dict[str, str]]:
    """Copy of ``messages`` with ``block`` appended to the last user message."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise ValueError("a hindsight context needs a user message to hold the privileged block")
    out = [dict(m) for m in messages]
    out[last_user]["content"] = f"{out[last_user]['content']}\n\n{block}"
    return out


@dataclass(frozen=True)
class ScoringOptions:
    """How the snapshot scores trajectories: a run's ``hindsight`` section (each field
    described and defaulted there, in :class:`hp_agent.config.HindsightConfig`) and its
    rollout temperature. Build it with :meth:`from_config`."""

    future_turns: int
    max_block_tokens: int
    max_segment_tokens: int
    temperature: float
    jsd_chunk_tokens: int
    score_batch_tokens: int
    packed: bool
    compile_jsd: bool
    teacher: Literal["none", "topk", "full"] = "none"
    teacher_topk: int = 20

    @classmethod
    def from_config(cls, config: TrainConfig | None = None) -> ScoringOptions:
        """A training run's options: its ``hindsight`` section, at its rollout temperature
        (``config`` None: the defaults)."""
        config = config if config is not None else TrainConfig()
        # The section's field names are these fields' (weight_norm is the credit rule's): one name for each.
        learner = config.learner
        teacher = learner.distill if learner.distill_coef > 0 and learner.distill != "sampled" else "none"
        return cls(temperature=config.rollout.temperature, teacher=teacher, teacher_topk=learner.distill_topk,
                   **config.hindsight.model_dump(exclude={"weight_norm"}))


def _hidden_states(
    policy: Policy, sequences: list[list[int]], spans: list[tuple[int, int]], options: ScoringOptions
) -> list[torch.Tensor]:
    pad_id = policy.tokenizer.pad_token_id or 0
    if options.packed:
        return packed_span_hidden_states(policy.model, sequences, spans, options.score_batch_tokens, pad_id,
                                         SCORING, policy.prefix_cache)
    return span_hidden_states(policy, sequences, spans, options.score_batch_tokens, pad_id)


def hindsight_blocks(policy: Policy, trajectory: Trajectory, options: ScoringOptions) -> list[tuple[Segment, str]]:
    """Every segment of ``trajectory`` with its privileged block; segments cover every action token."""
    token_texts = [policy.decode_tokens(turn.action_ids) for turn in trajectory.turns]
    return [
        (segment, privileged_block(trajectory, segment, policy.tokenizer, options.future_turns, options.max_block_tokens,
                                   policy.decode))
        for segment in segments(trajectory, token_texts, options.max_segment_tokens)
    ]


def hindsight_ids(policy: Policy, trajectory: Trajectory, segment: Segment, block: str) -> list[int]:
    """The turn's prompt re-rendered with ``block``, then its action tokens up to the segment's end."""
    turn = trajectory.turns[segment.turn]
    return policy.render(hindsight_messages(turn.prompt_messages, block)) + turn.action_ids[: segment.end]


def hindsight_span(segment: Segment, ids: list[int]) -> tuple[int, int]:
    """Where ``segment``'s action tokens lie in its hindsight ``ids``: at the end (:func:`hindsight_ids`)."""
    return len(ids) - (segment.end - segment.start), len(ids)


def hindsight_sequences(
    policy: Policy, trajectories: list[Trajectory], options: ScoringOptions
) -> list[tuple[int, Segment, list[int]]]:
    """``(trajectory index, segment, hindsight ids)`` for every segment of every trajectory."""
    return [
        (i, segment, hindsight_ids(policy, trajectory, segment, block))
        for i, trajectory in enumerate(trajectories)
        for segment, block in hindsight_blocks(policy, trajectory, options)
    ]


@torch.no_grad()
def score_trajectories(
    policy: Policy, trajectories: list[Trajectory], options: ScoringOptions, with_hindsight: bool
) -> list[TrajectoryScores]:
    """Causal log-probs of every action token and, with hindsight, its JSD weight and its
    log-prob under the hindsight context.

    One hidden-state pass over all causal sequences (one per turn) and hindsight
    sequences (one per segment) together, so that the packed scorer computes their shared
    prefixes once; then the LM head and JSD over all scored tokens, a chunk at a time.
    """
    policy.model.eval()
    scores = [
        TrajectoryScores(
            causal_logprobs=[torch.zeros(len(turn.action_ids)) for turn in traj.turns],
            weights=[torch.zeros(len(turn.action_ids)) for turn in traj.turns] if with_hindsight else None,
            hindsight_logprobs=[torch.zeros(len(turn.action_ids)) for turn in traj.turns] if with_hindsight else None,
        )
        for traj in trajectories
    ]
    turn_keys = [(i, t) for i, traj in enumerate(trajectories) for t, turn in enumerate(traj.turns) if turn.action_ids]
    if not turn_keys:
        return scores
    turns = [trajectories[i].turns[t] for i, t in turn_keys]
    sequences = [turn.prompt_ids + turn.action_ids for turn in turns]
    spans = [(len(turn.prompt_ids), len(seq)) for turn, seq in zip(turns, sequences)]
    hindsight = hindsight_sequences(policy, trajectories, options) if with_hindsight else []
    sequences += [seq for _, _, seq in hindsight]
    spans += [hindsight_span(segment, seq) for _, segment, seq in hindsight]
    hidden = _hidden_states(policy, sequences, spans, options)
    causal_hidden = dict(zip(turn_keys, hidden[: len(turn_keys)]))
    device = hidden[0].device

    def project(states: torch.Tensor) -> torch.Tensor:
        return policy.project(states) / options.temperature

    if not with_hindsight:
        ids = torch.tensor([token for turn in turns for token in turn.action_ids], device=device)
        allowed = joined_allowed((turn.allowed, len(turn.action_ids)) for turn in turns)
        logprobs = chunked_logprobs(torch.cat(hidden), ids, project, options.jsd_chunk_tokens, allowed).cpu()
        for (i, t), part in zip(turn_keys, logprobs.split([len(turn.action_ids) for turn in turns])):
            scores[i].causal_logprobs[t] = part
        return scores

    causal = torch.cat([causal_hidden[(i, segment.turn)][segment.start : segment.end] for i, segment, _ in hindsight])
    ids = torch.tensor(
        [tok for i, seg, _ in hindsight for tok in trajectories[i].turns[seg.turn].action_ids[seg.start : seg.end]],
        device=device,
    )
    allowed = joined_allowed(_segment_allowed(trajectories[i].turns[seg.turn], seg) for i, seg, _ in hindsight)
    views = jsd_weights_from_hidden(
        causal, torch.cat(hidden[len(turn_keys) :]), ids, project, options.jsd_chunk_tokens, compiled=options.compile_jsd,
        allowed=allowed, teacher=options.teacher, teacher_topk=options.teacher_topk,
    )
    sizes = [segment.end - segment.start for _, segment, _ in hindsight]
    tensors = views.weights, views.causal_logprobs, views.hindsight_logprobs
    parts = zip(hindsight, *(view.cpu().split(sizes) for view in tensors), strict=True)
    for (i, segment, _), w, lp, hindsight_lp in parts:
        scores[i].weights[segment.turn][segment.start : segment.end] = w
        scores[i].causal_logprobs[segment.turn][segment.start : segment.end] = lp
        scores[i].hindsight_logprobs[segment.turn][segment.start : segment.end] = hindsight_lp
    if views.teacher is not None:
        _keep_teacher(scores, trajectories, hindsight, views.teacher.to("cpu"))
    return scores


def _keep_teacher(scores: list[TrajectoryScores], trajectories: list[Trajectory],
                  hindsight: list[tuple[int, Segment, list[int]]], teacher: TeacherSupport) -> None:
    """Each turn's rows of the scored segments' ``teacher`` (rows in segment order), per turn."""
    width = teacher.logprobs.shape[-1]
    for score, trajectory in zip(scores, trajectories):
        score.teacher = [TeacherSupport(None if teacher.ids is None else torch.zeros(len(t.action_ids), width, dtype=torch.long),
                                        torch.zeros(len(t.action_ids), width)) for t in trajectory.turns]
    row = 0
    for i, segment, _ in hindsight:
        rows = teacher.rows(row, row + segment.end - segment.start)
        kept = scores[i].teacher[segment.turn]
        kept.logprobs[segment.start : segment.end] = rows.logprobs
        if kept.ids is not None:
            kept.ids[segment.start : segment.end] = rows.ids
        row += segment.end - segment.start


def _segment_allowed(turn: Turn, segment: Segment) -> tuple[list[list[int] | None] | None, int]:
    """The restricted-decoding sets of ``segment``'s tokens (None: free), and their count."""
    sets = None if turn.allowed is None else turn.allowed[segment.start : segment.end]
    return sets, segment.end - segment.start
