"""Prefix (KV-cache) reuse in the transformers backend: same samples, fewer tokens run."""

from dataclasses import replace

import pytest
import torch

from hp_agent.config import TrainConfig
from hp_agent.envs import make
from hp_agent.hindsight import ScoringOptions, score_trajectories
from hp_agent.learner import Learner, TrainingSample
from hp_agent.parallel import TrainModel
from hp_agent.policies import SamplingParams
from hp_agent.policies.hf import HFPolicy, top_p_filter
from hp_agent.policies.prefix_cache import CachedSequence, PrefixCache, weights_version
from hp_agent.rollout import Episode, collect

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


def teacher_forced_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int],
                            temperature: float = 1.0) -> torch.Tensor:
    """log pi(tokens | prompt) from one plain forward pass, no cache."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


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
        expected = teacher_forced_logprobs(policy.model, prompt, generation.token_ids, 0.7)
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


def update_unseen_by_version_counters(model: torch.nn.Module) -> None:
    """Change every weight as a fused optimizer step does: in place, through ``.data``,
    without moving a version counter (the cache's own check cannot see it)."""
    before = weights_version(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    assert weights_version(model) == before


@pytest.mark.parametrize("tell", ["publish", "sync_weights"])
def test_stale_keys_go_when_the_weights_change_unseen(tiny_policy, tell) -> None:
    """Issue 24: after an update the version counters miss, the learner's publish (or a
    weight sync) still empties the cache: the next turn's log-probs are a plain forward's."""
    policy = HFPolicy(tiny_policy.path)  # its own weights, changed here
    train = TrainModel(policy.model, temperature=1.0, weights_changed=policy.weights_changed)
    first = policy.generate([policy.render(FIRST_TURNS[0])], GREEDY)
    update_unseen_by_version_counters(policy.model)
    policy.prefix_cache.check_weights(policy.model)
    assert policy.prefix_cache.entries  # the backstop saw nothing
    train.publish() if tell == "publish" else policy.sync_weights()
    assert not policy.prefix_cache.entries
    prompt = policy.render(next_turns(policy, FIRST_TURNS[:1], first)[0])
    (generation,) = policy.generate([prompt], GREEDY)
    expected = teacher_forced_logprobs(policy.model, prompt, generation.token_ids)
    assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-5)


def test_the_packed_scorer_after_publish_matches_a_plain_forward(tiny_policy) -> None:
    """The hindsight scorer reuses the prompts the rollout cached: after an unseen update
    and a publish its behaviour log-probs are a plain forward's under the new weights, and
    its JSD weights the reference (cache-free, per-segment) scorer's."""
    policy = HFPolicy(tiny_policy.path)
    train = TrainModel(policy.model, temperature=1.0, weights_changed=policy.weights_changed)
    env = make("math", split="train")
    trajectories = collect(policy, [env], "math", [Episode(env.task_ids()[0])], SamplingParams(max_new_tokens=24))
    (turn,) = trajectories[0].turns
    assert policy.prefix_cache.lookup(turn.prompt_ids)[1] > 0  # the scorer would reuse the rollout's keys
    update_unseen_by_version_counters(policy.model)
    train.publish()
    (packed,) = score_trajectories(policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    (reference,) = score_trajectories(policy, trajectories, replace(ScoringOptions.from_config(), packed=False), with_hindsight=True)
    expected = teacher_forced_logprobs(policy.model, turn.prompt_ids, turn.action_ids)
    assert torch.allclose(packed.causal_logprobs[0], expected, atol=1e-5)
    assert torch.allclose(packed.weights[0], reference.weights[0], atol=1e-5)


def test_a_learner_step_empties_the_prefix_cache(tiny_policy) -> None:
    """A fused AdamW step moves no version counter; the learner's step still empties the cache."""
    policy = HFPolicy(tiny_policy.path)
    learner = Learner.from_config(policy, TrainConfig())
    learner.optimizer = torch.optim.AdamW(learner.model.parameters, lr=1e-2, fused=True)
    prompt = policy.render(FIRST_TURNS[0])
    (generation,) = policy.generate([prompt], GREEDY)
    sample = TrainingSample(prompt + generation.token_ids, len(prompt), None, torch.ones(len(generation.token_ids)))
    version, embedding = weights_version(policy.model), policy.model.get_input_embeddings().weight.clone()
    learner.step([[sample]])
    assert not torch.equal(policy.model.get_input_embeddings().weight, embedding)
    assert weights_version(policy.model) == version  # unseen by the counters
    assert not policy.prefix_cache.entries
    (again,) = policy.generate([prompt], GREEDY)
    expected = teacher_forced_logprobs(policy.model, prompt, again.token_ids)
    assert torch.allclose(torch.tensor(again.logprobs), expected, atol=1e-5)


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
