"""ALFWorld's append prompt mode (restricted decoding's default): the task once, then each
turn's new game text only, so that every turn's prompt extends the previous one and the
sampler reuses its keys and values; and the token bound on a chat-history prompt."""

from __future__ import annotations

import pytest
import torch

from hp_agent.config import ConfigError, RolloutConfig, load_config
from hp_agent.envs import make
from hp_agent.envs.alfworld.env import APPEND_FIRST_TEMPLATE, parse_bare_action, prompting
from hp_agent.errors import UserValueError
from hp_agent.packing import pack_sequences
from hp_agent.policies import SamplingParams
from hp_agent.rollout import HISTORY_TOKENS, Episode, bounded_history, collect, sampled_tokens_bound

SAMPLING = SamplingParams(max_new_tokens=24, temperature=1.0)


def _play(policy, prompt_mode: str, games: int = 2, turns: int = 4, seed: int = 0):
    kwargs, chat_history = prompting({"prompt_mode": prompt_mode, "split": "id", "num_games": games, "expert": False},
                                     constrain=True, chat_history=None)
    envs = [make("alfworld", **kwargs) for _ in range(games)]
    episodes = [Episode(task_id, group=k) for k, task_id in enumerate(envs[0].task_ids())]
    torch.manual_seed(seed)
    try:
        return collect(policy, envs, "alfworld", episodes, SAMPLING, max_turns=turns, seed=seed,
                       chat_history=chat_history, constrain=True)
    finally:
        for env in envs:
            env.close()


def test_append_mode_prompts_the_task_once_then_new_text_only():
    env = make("alfworld", split="id", num_games=1, prompt_mode="append", expert=True)
    first, info = env.reset(seed=0, options={"task_id": env.task_ids()[0]})
    assert first == APPEND_FIRST_TEMPLATE.format(current_observation=info["game_text"])
    assert "Your task is to: " in first and "admissible actions of" not in first and "'" + info["admissible_actions"][0] not in first
    assert env.action_template == "{action}"
    observation, reward, _, _, info = env.step(info["expert_action"])  # the bare action is played
    assert observation == info["game_text"] and not info["invalid_action"] and info["shaping"] == 0.0
    _, _, _, _, info = env.step("<action>look</action>")  # not an admissible action as written: invalid, costs the penalty
    assert info["invalid_action"] and info["shaping"] == -env.invalid_penalty
    env.close()
    listed = make("alfworld", split="id", num_games=1, prompt_mode="append", list_actions=True, expert=False)
    observation, info = listed.reset(seed=0, options={"task_id": listed.task_ids()[0]})
    assert observation.endswith("Admissible actions: [" + "\n ".join(f"'{a}'" for a in info["admissible_actions"]) + "].")
    listed.close()
    with pytest.raises(UserValueError, match="list_actions=false"):
        make("alfworld", split="id", num_games=1, prompt_mode="verl-agent", list_actions=False)


def test_bare_actions_parse_to_their_first_line():
    assert parse_bare_action("Go to desk 1\nthen more", ["go to desk 1"]) == ("go to desk 1", True)
    assert parse_bare_action("go to desk 2", ["go to desk 1"]) == ("go to desk 2", False)
    assert parse_bare_action("", ["look"]) == ("", False)


def test_restricted_decoding_on_alfworld_defaults_to_append_with_the_conversation():
    restricted = load_config(overrides=["rollout.constrain_to_admissible=true"])
    assert restricted.env.kwargs["prompt_mode"] == "append" and restricted.rollout.chat_history
    free = load_config()
    assert free.env.kwargs["prompt_mode"] == "verl-agent" and not free.rollout.chat_history
    named = load_config(overrides=["rollout.constrain_to_admissible=true", "env.kwargs.prompt_mode=verl-agent"])
    assert named.env.kwargs["prompt_mode"] == "verl-agent" and not named.rollout.chat_history
    again = load_config(base=restricted.model_dump())  # a resolved config resolves to itself
    assert again.env.kwargs == restricted.env.kwargs and again.rollout.chat_history
    with pytest.raises(ConfigError, match="prompt_mode=append .*chat_history=true"):
        load_config(overrides=["rollout.constrain_to_admissible=true", "rollout.chat_history=false"])
    assert prompting({}, constrain=False, chat_history=None) == ({"prompt_mode": "verl-agent"}, False)


@pytest.fixture
def appending_policy(tiny_policy):
    """The tiny model with thinking on: its template (as Qwen3's) opens an empty think block
    in the generation prompt with thinking off but renders earlier answers without it,
    which breaks exact appending at each turn's end (the prefix cache then reruns the last
    answer); with thinking on it renders a turn as it was prompted, as smollm2's does."""
    tiny_policy.enable_thinking = True
    yield tiny_policy
    tiny_policy.enable_thinking = False


def test_append_prompts_extend_each_other_and_are_shorter(appending_policy):
    """Turn k+1's prompt begins with turn k's prompt and answer; so the sampler runs only the
    new text, and the prompt holds fewer tokens than verl-agent's, which repeats the task,
    two steps of history and the admissible actions every turn."""
    appended, full = _play(appending_policy, "append"), _play(appending_policy, "verl-agent")
    for trajectory in appended:
        assert len(trajectory.turns) > 1
        for turn, following in zip(trajectory.turns, trajectory.turns[1:]):
            assert following.prompt_ids[: len(turn.prompt_ids) + len(turn.action_ids)] == turn.prompt_ids + turn.action_ids
            assert following.prompt_messages[: len(turn.prompt_messages)] == turn.prompt_messages
        # the learner's and the scorer's prefix-tree packing then runs an episode as one sequence
        sequences = [turn.prompt_ids + turn.action_ids for turn in trajectory.turns]
        rows, _ = pack_sequences(sequences, max_tokens=10**6)
        assert [len(row) for row in rows] == [len(sequences[-1])]
    new_text = [len(b.prompt_ids) - len(a.prompt_ids) - len(a.action_ids)
                for t in appended for a, b in zip(t.turns, t.turns[1:])]
    verl_agent = [len(turn.prompt_ids) for t in full for turn in t.turns[1:]]
    assert max(new_text) < min(verl_agent) / 2


def test_reuse_gives_the_same_samples_and_log_probs_while_running_fewer_tokens(appending_policy):
    """The prefix cache on and off: the same seed samples the same restricted answers with
    log-probs within 1e-5, and with reuse far fewer prompt tokens are run."""
    policy = appending_policy
    reuse = policy.prefix_cache.max_tokens
    runs, computed = [], []
    try:
        for cache_tokens in (reuse, 0):
            policy.prefix_cache.max_tokens = cache_tokens
            policy.prefix_cache.clear()
            counts = dict(policy.counts.__dict__)
            runs.append(_play(policy, "append", turns=5, seed=3))
            computed.append(policy.counts.computed_prompt_tokens - (counts["prompt_tokens"] - counts["reused_tokens"]))
    finally:
        policy.prefix_cache.max_tokens = reuse
    with_reuse, without = ([turn for t in run for turn in t.turns] for run in runs)
    assert [t.action_ids for t in with_reuse] == [t.action_ids for t in without]
    assert max(abs(a - b) for x, y in zip(with_reuse, without) for a, b in zip(x.sample_logprobs, y.sample_logprobs)) < 1e-5
    assert computed[0] < computed[1] / 3


def test_a_long_conversation_drops_its_oldest_exchanges_down_to_half_the_bound():
    def render(messages):
        return [0] * sum(len(m["content"]) for m in messages)  # one token a character

    task = [{"role": "system", "content": "s" * 10}, {"role": "user", "content": "t" * 40}]
    exchanges = [m for k in range(10) for m in ({"role": "assistant", "content": f"a{k}" * 5},
                                                {"role": "user", "content": f"o{k}" * 10})]
    messages = task + exchanges  # 50 + 10 x 30 = 350 tokens
    assert bounded_history(messages, render, 400) == (messages, render(messages))  # within the bound: as it was
    assert bounded_history(messages, render, None)[0] is messages
    kept, ids = bounded_history(messages, render, 200)
    assert kept[:2] == task and kept[-1] == messages[-1] and len(ids) <= 100
    assert kept[2:] == messages[-len(kept) + 2:]  # the newest exchanges, in order
    assert len(bounded_history(messages, render, 300)[0]) > len(kept)  # a larger bound keeps more
    assert bounded_history(messages, render, 60)[0] == task + messages[-2:]  # never less than the task, the last exchange


def test_the_history_bound_is_the_configs_default_and_bounds_the_engines_length():
    assert RolloutConfig().history_tokens == HISTORY_TOKENS
    assert sampled_tokens_bound(24, 50, chat_history=True, history_tokens=4096) == 4096 + 24
    assert sampled_tokens_bound(24, 50, chat_history=True, history_tokens=None) == 50 * (2048 + 24)
    assert sampled_tokens_bound(24, 50, chat_history=False) == 2048 + 24


def test_append_mode_demonstrations_teach_an_episode_as_one_sequence(tmp_path, appending_policy):
    """The expert's append-mode play: bare actions, prompted as a restricted run prompts;
    the warm-up learns each episode as one sequence whose spans are its turns' answers."""
    from hp_agent.scripted_play import expert_demonstrations
    from hp_agent.sft import tokenize_demonstration, trajectory_sequences
    from hp_agent.trajectory import write_jsonl

    won, _ = expert_demonstrations(split="id", limit=2, prompt_mode="append")
    assert won and all(not turn.action_text.startswith("<") for t in won for turn in t.turns)
    tokenized = [tokenize_demonstration(t, appending_policy) for t in won]
    write_jsonl(tmp_path / "demos.jsonl", tokenized)
    examples = trajectory_sequences(tmp_path / "demos.jsonl", appending_policy.model.config.vocab_size)
    assert len(examples) == len(won)
    for (ids, spans), trajectory in zip(examples, tokenized):
        assert [ids[start:end] for start, end in spans] == [turn.action_ids for turn in trajectory.turns]
        assert ids == trajectory.turns[-1].prompt_ids + trajectory.turns[-1].action_ids


def test_the_prompt_pass_split_by_length_samples_as_the_whole_pass(tiny_policy, monkeypatch):
    """Rows of unlike new-text lengths: the prompt pass in groups of like lengths gives the
    same samples and log-probs (within 1e-5) as one padded pass; a row's sample does not
    depend on where it sits in the batch."""
    from hp_agent.policies import hf

    prompts = [tiny_policy.render([{"role": "user", "content": "go " * n}]) for n in (40, 2, 35, 3, 1)]
    assert hf.prefill_groups(sorted(map(len, prompts), reverse=True), hf.PASS_TOKENS["cpu"]) != [(0, 5)]
    tiny_policy.prefix_cache.clear()
    runs = []
    for pass_tokens in (hf.PASS_TOKENS["cpu"], None):
        monkeypatch.setitem(hf.PASS_TOKENS, "cpu", pass_tokens)
        tiny_policy.prefix_cache.clear()
        torch.manual_seed(5)
        runs.append(tiny_policy.generate(prompts, SAMPLING))
    for split, whole in zip(*runs):
        assert split.token_ids == whole.token_ids
        assert max(abs(a - b) for a, b in zip(split.logprobs, whole.logprobs)) < 1e-5
    assert hf.prefill_groups([100, 90, 10, 8], 10_000) == [(0, 4)]  # a costly pass: never split
    assert hf.prefill_groups([100, 90, 10, 8], 0) == [(0, 1), (1, 2), (2, 3), (3, 4)]  # a free one: every row alone


def test_append_mode_sampler_log_probs_are_the_full_prompt_learners(appending_policy):
    """The sampler's restricted log-probs (cached prefix, forced tokens, length groups) equal
    the learner's over each turn's whole prompt, within 1e-5; the free distribution differs."""
    from hp_agent.parallel import ActionLogprobs

    turns = [turn for t in _play(appending_policy, "append", turns=3, seed=1) for turn in t.turns]
    spans = [(len(t.prompt_ids), len(t.prompt_ids) + len(t.action_ids)) for t in turns]
    sets = [tokens for t in turns for tokens in t.allowed]
    learner = ActionLogprobs(appending_policy.model, 1.0, True, appending_policy.pad_token_id)
    with torch.no_grad():
        restricted = torch.cat(learner([t.prompt_ids + t.action_ids for t in turns], spans, sets))
        free = torch.cat(learner([t.prompt_ids + t.action_ids for t in turns], spans, None))
    sampled = torch.cat([torch.tensor(t.sample_logprobs) for t in turns])
    assert (sampled - restricted).abs().max() < 1e-5
    assert (sampled - free).max() > 0.1
