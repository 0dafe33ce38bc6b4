"""Packed forward passes: prefix-tree rows, their masks, and hidden states equal to plain passes."""

import random

import pytest
import torch

from hp_agent.batching import span_hidden_states
from hp_agent.packing import SCORING, TRAINING, pack_sequences, packed_batches, packed_span_hidden_states, tree_mask


def _related_sequences(rng: random.Random, count: int, vocab: int = 1500) -> list[list[int]]:
    """Sequences that branch off one another at random points, as causal and hindsight views do."""
    sequences = [[rng.randrange(3, vocab) for _ in range(rng.randint(5, 40))]]
    while len(sequences) < count:
        base = rng.choice(sequences)
        cut = rng.randint(0, len(base))
        sequences.append(base[:cut] + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 30))])
    return sequences


def test_rows_store_each_prefix_once_and_reproduce_every_sequence():
    sequences = _related_sequences(random.Random(0), 30)
    rows, placements = pack_sequences(sequences, max_tokens=120)
    assert sum(len(row) for row in rows) < sum(len(s) for s in sequences)  # prefixes are shared
    for sequence, (row, nodes) in zip(sequences, placements):
        assert [rows[row].token_ids[n] for n in nodes] == sequence
        assert [rows[row].positions[n] for n in nodes] == list(range(len(sequence)))
    assert all(len(row) <= 120 for row in rows)


def test_sequences_that_share_little_start_a_new_row():
    shared = list(range(10, 20))
    rows, placements = pack_sequences([shared + [1, 2], shared + [3] * 5, [70] * 4 + [8] * 20], max_tokens=100)
    assert [row for row, _ in placements] == [0, 0, 1]  # 10 shared >= 5 added; nothing shared with the last
    rows, placements = pack_sequences([shared + [1, 2], shared + [3] * 11], max_tokens=100)
    assert [row for row, _ in placements] == [0, 1]  # it would add more (11) than it shares (10)
    rows, placements = pack_sequences([shared + [1, 2], shared + [3] * 11, shared[:4] + [3] * 11], max_tokens=100,
                                      prompts=[10, 10, 6])
    # The learner's rule: the second joins the row that holds its 10-token prompt; the first
    # (sorted after the third) shares 4 tokens of the third's row, not its prompt.
    assert [row for row, _ in placements] == [1, 1, 0]
    rows, placements = pack_sequences([[5] * 50, [5] * 40 + [6] * 10], max_tokens=55)
    assert [row for row, _ in placements] == [0, 1]  # the row is full
    rows, placements = pack_sequences([[4] * 80], max_tokens=55)
    assert len(rows[0]) == 80  # a sequence longer than the budget gets a row of its own
    with pytest.raises(ValueError, match="max_tokens"):
        pack_sequences([[1]], max_tokens=0)


def test_mask_lets_a_token_see_exactly_its_ancestors():
    sequences = _related_sequences(random.Random(1), 12)
    rows, placements = pack_sequences(sequences, max_tokens=10_000)
    for index, row in enumerate(rows):
        width = len(row) + 3
        mask = tree_mask(row, width)
        expected = torch.zeros(width, width, dtype=torch.bool)
        for _, nodes in (p for p in placements if p[0] == index):
            for k, node in enumerate(nodes):
                expected[node, nodes[: k + 1]] = True
        padding = torch.arange(len(row), width)
        expected[padding, padding] = True  # padding sees itself only
        assert torch.equal(mask, expected)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_packed_hidden_states_equal_plain_forward_passes(tiny_policy, implementation):
    rng = random.Random(2)
    sequences = _related_sequences(rng, 16)
    spans = [(rng.randint(1, len(s)), len(s)) for s in sequences]
    spans = [(start, rng.randint(start, end)) for start, end in spans]
    assert len(pack_sequences(sequences, 96)[0]) < len(sequences)  # some rows hold several sequences
    model = tiny_policy.model
    original = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        with torch.no_grad():
            reference = span_hidden_states(tiny_policy, sequences, spans, 4096, pad_id=0)
            packed = packed_span_hidden_states(model, sequences, spans, 96, 0, SCORING)
    finally:
        model.set_attn_implementation(original)
    for a, b, (start, end) in zip(reference, packed, spans, strict=True):
        assert b.shape == (end - start, model.config.hidden_size)
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


def test_unsupported_attention_is_refused_with_the_fix(tiny_policy):
    model = tiny_policy.model
    original = model.config._attn_implementation
    model.config._attn_implementation = "flash_attention_2"  # would ignore a 4-D mask
    try:
        with pytest.raises(ValueError, match="hindsight.packed=false"):
            packed_span_hidden_states(model, [[1, 2, 3]], [(1, 3)], 64, 0, SCORING)
    finally:
        model.config._attn_implementation = original
    with pytest.raises(ValueError, match="does not fit"):
        packed_span_hidden_states(model, [[1, 2, 3]], [(0, 3)], 64, 0, SCORING)


def test_packed_passes_keep_a_row_together_within_the_budget():
    sequences = _related_sequences(random.Random(3), 24)
    spans = [(min(len(s), 12), len(s)) for s in sequences]
    rows, placements = pack_sequences(sequences, max_tokens=128, prompts=[start for start, _ in spans])
    passes = packed_batches(sequences, spans, max_tokens=128, rule=TRAINING)
    assert sorted(i for batch in passes for i in batch) == list(range(len(sequences)))
    for batch in passes:
        held = {placements[i][0] for i in batch}
        assert {i for i, (row, _) in enumerate(placements) if row in held} == set(batch)  # whole rows only
        assert len(held) == 1 or max(len(rows[r]) for r in held) * len(held) <= 128  # padded rows within the budget
