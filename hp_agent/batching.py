"""Padded batches of token sequences, and the hidden states that predict chosen spans.

Both the hindsight scorer (no gradient) and the learner (with gradient) need the same
thing: for each token sequence, the final hidden states at the positions that predict
the tokens of one span. Position i predicts token i + 1, so span [a, b) is read from
positions [a - 1, b - 1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from hp_agent.policies import Policy


def token_budget_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Group indices so that each padded batch holds at most ``max_tokens`` tokens.

    Sequences are taken longest first so that padding stays small; a sequence longer
    than the budget gets a batch of its own.

    >>> list(token_budget_batches([3, 5, 2, 4], max_tokens=10))
    [[1, 3], [0, 2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for index in order:
        width = max([lengths[i] for i in batch] + [lengths[index]])
        if batch and width * (len(batch) + 1) > max_tokens:
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch


def pad_right(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` [B, T] and ``attention_mask`` [B, T]."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.as_tensor(list(sequence), dtype=torch.long)
        attention_mask[row, : len(sequence)] = 1
    return input_ids, attention_mask


def predicting_states(hidden: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The rows of one sequence's ``hidden`` [T, H] that predict its tokens ``[start, end)``.

    >>> predicting_states(torch.arange(5.0).unsqueeze(1), 2, 4).squeeze(1)
    tensor([1., 2.])
    """
    return hidden[start - 1 : end - 1]


def span_hidden_states(
    policy: Policy,
    sequences: Sequence[Sequence[int]],
    spans: Sequence[tuple[int, int]],
    max_tokens: int,
    pad_id: int,
) -> list[torch.Tensor]:
    """Hidden states [b - a, H] predicting tokens ``sequences[i][a:b]`` for ``spans[i]``.

    Runs under the caller's grad mode: wrap in ``torch.no_grad()`` for scoring.
    """
    for (start, end), sequence in zip(spans, sequences, strict=True):
        if not 1 <= start <= end <= len(sequence):
            raise ValueError(f"span [{start}, {end}) does not fit a sequence of {len(sequence)} tokens after its first")
    out: list[torch.Tensor | None] = [None] * len(sequences)
    for batch in token_budget_batches([len(s) for s in sequences], max_tokens):
        input_ids, attention_mask = pad_right([sequences[i] for i in batch], pad_id)
        hidden = policy.hidden_states(input_ids, attention_mask)
        for row, index in enumerate(batch):
            start, end = spans[index]
            out[index] = predicting_states(hidden[row], start, end)
    return out  # type: ignore[return-value]
