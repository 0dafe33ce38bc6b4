"""What the credit viewer (``hp-agent show``) needs of a trajectory, computed while training.

For a few trajectories a step (``trainer.views_per_step``), the trainer records per action
token: its text, its credit (HP-RLVR's token credit, GRPO's advantage), its JSD weight,
and the ``trainer.view_top_k`` most likely next tokens of the causal view and of the
hindsight view with their probabilities; per segment, the privileged block the hindsight
view read. The views are computed under the snapshot that scored the trajectories, right
after scoring (:func:`scored_view`; with ``trainer.off_policy_steps`` >= 1 in the rollout
process, whose weights those are), and the credit is filled in once the learner's
process has assigned it (:func:`with_credit`). Records go to the run's
``credit_views.jsonl``, which stops growing at ``trainer.view_max_mb``.
"""

from __future__ import annotations

from typing import Any

import torch

from hp_agent.batching import span_hidden_states
from hp_agent.hindsight import ScoringOptions, hindsight_blocks, hindsight_ids, hindsight_span
from hp_agent.policies import Policy
from hp_agent.trajectory import Trajectory

VIEWS_FILE = "credit_views.jsonl"


def pick_for_view(trajectories: list[Trajectory], count: int) -> list[int]:
    """Indices of up to ``count`` trajectories: successes and failures in turn (both kinds
    show where credit lands), each kind in rollout order."""
    successes = [i for i, t in enumerate(trajectories) if t.success]
    failures = [i for i, t in enumerate(trajectories) if not t.success]
    picked: list[int] = []
    while len(picked) < count and (successes or failures):
        for kind in (successes, failures):
            if kind and len(picked) < count:
                picked.append(kind.pop(0))
    return picked


def _top_tokens(policy: Policy, logits: torch.Tensor, token_ids: list[int], top_k: int) -> list[dict[str, Any]]:
    """Per row: the chosen token's probability and the ``top_k`` likeliest tokens."""
    probs = torch.softmax(logits.float(), dim=-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    chosen = probs.gather(-1, torch.tensor(token_ids, device=probs.device).unsqueeze(-1)).squeeze(-1)
    return [
        {"p": round(float(p), 5), "top": [[text, round(float(q), 5)] for text, q in zip(policy.decode_tokens(ids), values)]}
        for p, ids, values in zip(chosen.tolist(), top.indices.tolist(), top.values.tolist())
    ]


@torch.no_grad()
def scored_view(
    policy: Policy,
    trajectory: Trajectory,
    weights: list[torch.Tensor] | None,
    options: ScoringOptions,
    top_k: int = 5,
) -> dict[str, Any]:
    """One trajectory as the viewer shows it, under ``policy``'s weights (the snapshot that
    scored it), its credit still None (:func:`with_credit`). ``weights[t]`` is turn t's
    per-token JSD weights (None: a rule without hindsight, e.g. GRPO)."""
    pad_id = policy.tokenizer.pad_token_id or 0

    def project(states: torch.Tensor) -> torch.Tensor:
        return policy.project(states) / options.temperature

    turns = trajectory.turns
    causal_hidden = span_hidden_states(policy, [t.prompt_ids + t.action_ids for t in turns],
                                       [(len(t.prompt_ids), len(t.prompt_ids) + len(t.action_ids)) for t in turns],
                                       options.score_batch_tokens, pad_id)
    causal = [_top_tokens(policy, project(h), t.action_ids, top_k) for h, t in zip(causal_hidden, turns)]
    hindsight: list[list[dict[str, Any] | None]] = [[None] * len(t.action_ids) for t in turns]
    segments = []
    if weights is not None:
        blocks = hindsight_blocks(policy, trajectory, options)
        sequences = [hindsight_ids(policy, trajectory, segment, block) for segment, block in blocks]
        spans = [hindsight_span(segment, ids) for (segment, _), ids in zip(blocks, sequences)]
        for (segment, block), hidden in zip(blocks, span_hidden_states(policy, sequences, spans, options.score_batch_tokens, pad_id)):
            action = turns[segment.turn].action_ids[segment.start : segment.end]
            hindsight[segment.turn][segment.start : segment.end] = _top_tokens(policy, project(hidden), action, top_k)
            segments.append({"turn": segment.turn, "start": segment.start, "end": segment.end, "block": block})
    view_turns = []
    for t, turn in enumerate(turns):
        texts = policy.decode_tokens(turn.action_ids)
        tokens = [
            {"text": texts[j], "credit": None,
             "weight": None if weights is None else round(float(weights[t][j]), 6),
             "causal": causal[t][j], "hindsight": hindsight[t][j]}
            for j in range(len(turn.action_ids))
        ]
        view_turns.append({"prompt": turn.prompt_messages[-1]["content"] if turn.prompt_messages else "",
                           "action": turn.action, "invalid": turn.invalid, "observation": turn.observation,
                           "reward": turn.reward, "tokens": tokens})
    return {"env": trajectory.env, "task_id": trajectory.task_id, "task_type": trajectory.task_type,
            "group": trajectory.group, "reward": trajectory.reward, "success": trajectory.success,
            "feedback": trajectory.feedback, "turns": view_turns, "segments": segments}


def with_credit(view: dict[str, Any], credit: list[torch.Tensor]) -> dict[str, Any]:
    """``view`` (:func:`scored_view`) with turn t's token credit ``credit[t]`` filled in."""
    for turn, turn_credit in zip(view["turns"], credit, strict=True):
        for token, value in zip(turn["tokens"], turn_credit.tolist(), strict=True):
            token["credit"] = round(float(value), 6)
    return view
