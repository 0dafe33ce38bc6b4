"""Prefix (KV-cache) reuse in the transformers backend: same samples, fewer tokens run."""

import pytest
import torch

from hp_agent.policies import SamplingParams
from hp_agent.policies.hf import HFPolicy, top_p_filter
from hp_agent.policies.prefix_cache import CachedSequence, PrefixCache

GREEDY = SamplingParams(max_new_tokens=12, greedy=True)
FIRST_TURNS = [
    [{"role": "user", "content": "Your task is to: put a mug in the fridge. You see a cabinet 1, a fridge 1."}],
    [{"role": "user", "content": "Your task is to: heat an egg. You see a microwave 1."}],
    [{"role": "user", "content": "hi"}],
]


@pytest.fixture(scope="module")
def policies(tiny_policy) -> tuple[HFPolicy, HFPolicy]:
    """The shared tiny policy with reuse and a copy of it without (same weights)."""
    plain = HFPolicy(tiny_policy.path, prefix_cache_tokens=0)
    plain.model.load_state_dict(tiny_policy.model.state_dict())
    return tiny_policy, plain


def next_turns(policy: HFPolicy, turns: list[list[dict]], generations) -> list[list[dict]]:
    return [
        messages + [{"role": "assistant", "content": policy.decode(g.token_ids)},
                    {"role": "user", "content": "You open the fridge 1. The fridge 1 is open. In it, you see nothing."}]
        for messages, g in zip(turns, generations)
    ]


def test_reuse_samples_what_a_full_run_samples(policies) -> None:
    reusing, plain = policies
    reusing.prefix_cache.clear()
    turns = FIRST_TURNS
    for _ in range(3):  # chat-history turns: each prompt extends the previous prompt
        prompts = [reusing.render(m) for m in turns]
        reused = [reusing.prefix_cache.lookup(p)[1] for p in prompts]
        with_cache, without = reusing.generate(prompts, GREEDY), plain.generate(prompts, GREEDY)
        for a, b in zip(with_cache, without):
            assert a.token_ids == b.token_ids
            assert a.finished == b.finished
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4
        turns = next_turns(reusing, turns, with_cache)
    assert all(0 < r < len(p) for r, p in zip(reused, prompts))  # the last turn ran only its new tokens
    assert not plain.prefix_cache.entries


def test_sampled_logprobs_match_a_teacher_forced_forward(policies) -> None:
    """Reused keys sit at the right positions: the sampler's log-probs (temperature 0.7)
    are those of one plain forward pass over prompt + answer."""
    policy, _ = policies
    policy.prefix_cache.clear()
    first = [policy.render(m) for m in FIRST_TURNS]
    sampling = SamplingParams(max_new_tokens=10, temperature=0.7)
    torch.manual_seed(1)
    prompts = [policy.render(m) for m in next_turns(policy, FIRST_TURNS, policy.generate(first, sampling))]
    assert all(policy.prefix_cache.lookup(p)[1] >= 16 for p in prompts[:2])  # the long first turns are reused
    for prompt, generation in zip(prompts, policy.generate(prompts, sampling)):
        ids = torch.tensor([prompt + generation.token_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(generation.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


def test_cache_empties_when_the_weights_change(policies) -> None:
    policy, _ = policies
    policy.generate([policy.render(FIRST_TURNS[0])], GREEDY)
    assert policy.prefix_cache.entries
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        with torch.no_grad():
            policy.model.get_input_embeddings().weight.mul_(1.5)  # what an optimizer step does: in place
        prompt = policy.render(FIRST_TURNS[0])
        policy.prefix_cache.check_weights(policy.model)
        assert policy.prefix_cache.lookup(prompt) == (None, 0)
    finally:
        policy.model.load_state_dict(before)


def sequence(tokens: list[int]) -> CachedSequence:
    return CachedSequence(torch.tensor(tokens), keys=[torch.zeros(2, len(tokens), 4)], values=[torch.zeros(2, len(tokens), 4)])


def test_prefix_cache_bookkeeping() -> None:
    cache = PrefixCache(max_tokens=10, block_tokens=1)
    cache.store(sequence([1, 2, 3]))
    assert cache.lookup([1, 2, 3, 4])[1] == 3
    assert cache.lookup([1, 2, 3])[1] == 2  # the last prompt token always runs
    assert cache.lookup([9, 1, 2]) == (None, 0)
    cache.store(sequence([1, 2, 3, 4, 5]))  # extends [1, 2, 3]: that one goes
    assert [e.token_ids.tolist() for e in cache.entries] == [[1, 2, 3, 4, 5]]
    cache.store(sequence([1, 2]))  # held already
    cache.store(sequence([7, 8, 9]))
    cache.store(sequence([6, 6, 6]))  # over budget: the least recently used goes first
    assert [e.token_ids.tolist() for e in cache.entries] == [[7, 8, 9], [6, 6, 6]]
    cache.store(sequence(list(range(11))))  # longer than the whole budget: not kept
    assert cache.num_tokens == 6
    with pytest.raises(ValueError, match="prefix cache size"):
        PrefixCache(-1)


def test_top_p_keeps_the_smallest_nucleus() -> None:
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(top_p_filter(scores, 0.75)).tolist() == [[False, False, True, True]]
    assert torch.isinf(top_p_filter(scores, 0.81)).tolist() == [[False, False, False, True]]
    assert torch.isinf(top_p_filter(scores, 0.1)).tolist() == [[False, True, True, True]]
    assert torch.equal(top_p_filter(scores, 1.0), scores)


def test_lookup_finds_reuse_through_whole_blocks_then_token_by_token() -> None:
    cache = PrefixCache(max_tokens=1000)  # 16-token blocks
    cache.store(sequence(list(range(100, 140))))
    assert cache.lookup(list(range(100, 120)) + [7, 7, 7])[1] == 20  # one block, then 4 more tokens
    assert cache.lookup(list(range(100, 110)) + [7] * 20) == (None, 0)  # under a block in common
