"""Restricted decoding's pure parts: the prefix tree of admissible responses and the
renormalized distribution over the allowed tokens."""

import pytest
import torch

from hp_agent.constraint import ActionTrie, allowed_mask, joined_allowed, restrict_logits
from hp_agent.kernels import chosen_logprobs, jsd_from_logits

RESPONSES = [[5, 6, 2], [5, 7, 2], [8, 2]]  # e.g. "go left", "go right", "stop", each ending with end-of-turn 2


def test_the_trie_allows_exactly_the_continuations_of_admissible_responses():
    trie = ActionTrie(RESPONSES)
    assert trie.allowed_after([]) == [5, 8]
    assert trie.allowed_after([5]) == [6, 7]
    assert trie.allowed_after([5, 6]) == [2]  # end-of-turn forced after a complete action
    assert trie.allowed_after([8, 2]) == []
    assert trie.allowed_per_token([5, 7, 2]) == [[5, 8], [6, 7], [2]]
    with pytest.raises(ValueError, match="token 9 at position 1"):
        trie.allowed_per_token([5, 9, 2])
    with pytest.raises(ValueError, match="at least one"):
        ActionTrie([])


def test_restricted_log_probs_are_the_model_renormalized_over_the_allowed_set():
    torch.manual_seed(0)
    logits = torch.randn(3, 10)
    allowed = ActionTrie(RESPONSES).allowed_per_token([5, 7, 2])
    restricted = restrict_logits(logits, allowed_mask(allowed, 10))
    chosen = chosen_logprobs(restricted, torch.tensor([5, 7, 2]))
    # by hand: p(y) / sum of p over the allowed tokens
    probs = logits.softmax(-1)
    expected = torch.stack([probs[0, 5] / probs[0, [5, 8]].sum(), probs[1, 7] / probs[1, [6, 7]].sum(), torch.tensor(1.0)])
    assert torch.allclose(chosen.exp(), expected, atol=1e-6)
    assert chosen[2] == 0.0  # one allowed token: probability 1, log-prob exactly 0
    assert torch.isinf(restricted[0, 6]) and restricted[0, 5] == logits[0, 5]
    assert allowed_mask([None], 4).all()  # an unconstrained row keeps the full vocabulary


def test_jsd_over_the_allowed_set_is_zero_where_one_token_is_allowed():
    """With one admissible continuation both views put probability 1 on it: weight 0,
    whatever the two unrestricted distributions were."""
    torch.manual_seed(1)
    causal, hindsight = torch.randn(2, 10), torch.randn(2, 10)
    mask = allowed_mask([[2], [6, 7]], 10)
    weights = jsd_from_logits(restrict_logits(causal, mask), restrict_logits(hindsight, mask))
    assert weights[0] == 0.0 and weights[1] > 0.0
    assert jsd_from_logits(causal, hindsight)[0] > 0.0  # unrestricted, the same row differs


def test_a_row_with_nothing_allowed_is_refused():
    with pytest.raises(ValueError, match="at least one allowed token"):
        restrict_logits(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool))


def test_joined_allowed_lays_runs_end_to_end_and_is_none_when_all_are_free():
    assert joined_allowed([(None, 2), ([[5, 8], [2]], 2), (None, 1)]) == [None, None, [5, 8], [2], None]
    assert joined_allowed([(None, 3), (None, 1)]) is None
