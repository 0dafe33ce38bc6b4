"""rollout.constrain_to_admissible: every response is one of the env's admissible actions,
and the sampler, the hindsight scorer and the learner all use the model's distribution
renormalized over the same allowed tokens (DESIGN.md, "Restricted decoding")."""

import pytest
import torch
from gymnasium import spaces

import hp_agent
from hp_agent.config import ConfigError, load_config
from hp_agent.constraint import ActionTrie
from hp_agent.envs import make
from hp_agent.envs.alfworld import data
from hp_agent.envs.base import TextEnv
from hp_agent.envs.toy import ACTIONS
from hp_agent.errors import UserValueError
from hp_agent.hindsight import ScoringOptions, score_trajectories
from hp_agent.parallel import ActionLogprobs
from hp_agent.policies import SamplingParams
from hp_agent.rollout import Episode, collect
from hp_agent.files import read_jsonl_records
from hp_agent.verifiers import Verdict

SAMPLING = SamplingParams(max_new_tokens=12, temperature=1.0)


def _keys_episodes(policy, n: int = 4, constrain: bool = True):
    envs = [make("keys", split="train") for _ in range(n)]
    episodes = [Episode(task_id, group=k) for k, task_id in enumerate(envs[0].task_ids()[:n])]
    return collect(policy, envs, "keys", episodes, SAMPLING, seed=0, constrain=constrain)


def _learner_logprobs(policy, turns, allowed: bool, packed: bool = True) -> list[torch.Tensor]:
    spans = [(len(t.prompt_ids), len(t.prompt_ids) + len(t.action_ids)) for t in turns]
    sets = [tokens for t in turns for tokens in t.allowed] if allowed else None
    with torch.no_grad():
        return ActionLogprobs(policy.model, 1.0, packed, policy.pad_token_id)([t.prompt_ids + t.action_ids for t in turns],
                                                                             spans, sets)


def test_constrained_tokens_have_one_distribution_in_sampler_scorer_and_learner(tiny_policy):
    trajectories = _keys_episodes(tiny_policy)
    # A dead end (the last box opened, no key) admits nothing: those turns are sampled free.
    turns = [turn for t in trajectories for turn in t.turns if turn.allowed is not None]
    assert len(turns) >= 8
    eos = tiny_policy.eos_token_id
    encode = lambda text: tiny_policy.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    every_action = ActionTrie.of_responses(list(ACTIONS), encode, eos)
    for turn in turns:
        # a token the constraint forbids never appears: each response is an action, then end-of-turn
        assert turn.action_text.strip() in ACTIONS and not turn.invalid and not turn.truncated
        assert turn.action_ids[-1] == eos and len(turn.allowed) == len(turn.action_ids)
        assert all(token in tokens for token, tokens in zip(turn.action_ids, turn.allowed))
        # the recorded sets are those of the state's admissible actions, a subset of all actions' continuations
        assert all(set(mine) <= set(every) for mine, every in zip(turn.allowed, every_action.allowed_per_token(turn.action_ids)))
    assert any(len(tokens) > 1 for turn in turns for tokens in turn.allowed)  # some choice was made

    sampled = [torch.tensor(turn.sample_logprobs) for turn in turns]
    scores = score_trajectories(tiny_policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    scored = [lp for t, s in zip(trajectories, scores) for turn, lp in zip(t.turns, s.causal_logprobs) if turn.allowed is not None]
    for packed in (True, False):  # the learner's forward, packed (the default) and right-padded
        learned = _learner_logprobs(tiny_policy, turns, allowed=True, packed=packed)
        for behaviour, scorer, learner in zip(sampled, scored, learned, strict=True):
            assert torch.allclose(scorer, behaviour, atol=1e-5) and torch.allclose(learner, behaviour, atol=1e-5)
    # Control: the full-vocabulary log-probs differ, so a stage that ignored the sets would fail above.
    free = torch.cat(_learner_logprobs(tiny_policy, turns, allowed=False))
    assert (torch.cat(sampled) - free).max() > 0.1 and bool((torch.cat(sampled) >= free - 1e-6).all())


class OneWay(TextEnv):
    """Two turns with one admissible action each: restricted decoding leaves no choice."""

    max_turns = 2

    def __init__(self):
        self.observation_space = self.action_space = spaces.Text(max_length=1000)

    def task_ids(self):
        return ["only"]

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.turns = 0
        return "A corridor. You can only walk on.", {"task_id": "only", "task_type": "walk", "admissible_actions": ["next"]}

    def step(self, action):
        self.turns += 1
        info = {"action": action.strip(), "invalid_action": action.strip() != "next", "admissible_actions": ["next"]}
        if self.turns < 2:
            return "The corridor goes on.", 0.0, False, False, info
        return "", 1.0, True, False, {**info, "verdict": Verdict(1.0, "reached the end", True)}


def test_with_one_admissible_action_every_weight_is_zero(tiny_policy):
    trajectories = collect(tiny_policy, [OneWay(), OneWay()], "oneway", [Episode("only"), Episode("only")], SAMPLING,
                           constrain=True)
    scores = score_trajectories(tiny_policy, trajectories, ScoringOptions.from_config(), with_hindsight=True)
    assert all(len(t.turns) == 2 and t.success for t in trajectories)
    for trajectory, score in zip(trajectories, scores):
        for turn, weights, logprobs in zip(trajectory.turns, score.weights, score.causal_logprobs):
            assert all(len(tokens) == 1 for tokens in turn.allowed)
            assert torch.equal(weights, torch.zeros_like(weights)) and torch.equal(logprobs, torch.zeros_like(logprobs))


def test_an_env_without_admissible_actions_is_refused_by_name(tiny_policy):
    with pytest.raises(UserValueError, match=r"math lists none"):
        collect(tiny_policy, [make("math", split="test")], "math", [Episode(make("math", split="test").task_ids()[0])],
                SAMPLING, constrain=True)


def test_the_choice_is_off_by_default_and_refuses_a_think_block():
    assert load_config().rollout.constrain_to_admissible is False
    with pytest.raises(ConfigError, match="require_think=true would make every action invalid"):
        load_config(None, ["rollout.constrain_to_admissible=true", "env.kwargs={require_think: true}"])


@pytest.mark.skipif(data.find_data_root() is None, reason="the official ALFWorld games are not here")
def test_alfworld_with_the_tiny_model_plays_no_invalid_action(tiny_policy):
    from hp_agent.envs.alfworld.env import AlfworldEnv

    envs = [AlfworldEnv(split="id", num_games=4, max_steps=3, expert=False) for _ in range(4)]
    episodes = [Episode(task_id) for task_id in envs[0].task_ids()]
    sampling = SamplingParams(max_new_tokens=64, temperature=1.0)
    trajectories = collect(tiny_policy, envs, "alfworld", episodes, sampling, seed=0, constrain=True)
    for env in envs:
        env.close()
    turns = [turn for t in trajectories for turn in t.turns]
    assert len(turns) == 12 and not any(t.errored for t in trajectories)
    assert [turn.action_text for turn in turns if turn.invalid or turn.truncated] == []
    assert all(turn.action_text.startswith("<action>") and turn.action_text.endswith("</action>") for turn in turns)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["hp-rlvr", "grpo"])
def test_both_methods_train_a_step_restricted(tmp_path, algo):
    config = {
        "env": {"name": "keys"},
        "algo": {"name": algo, **({"group_size": 2} if algo == "grpo" else {})},
        "rollout": {"max_new_tokens": 8, "constrain_to_admissible": True},
        "trainer": {"steps": 1, "prompts_per_step": 2, "run_dir": str(tmp_path), "name": algo, "views_per_step": 0},
    }
    summary = hp_agent.train(config, progress=False)
    assert torch.isfinite(torch.tensor(summary.final_metrics["train/grad_norm"]))
    turns = [turn for t in read_jsonl_records(summary.run_dir / "trajectories.jsonl") for turn in t["turns"]]
    restricted = [turn for turn in turns if turn["allowed"] is not None]
    assert restricted and all(len(turn["allowed"]) == len(turn["action_ids"]) for turn in restricted)
    # only a dead end (nothing admissible, sampled free) can be invalid
    assert not any(turn["invalid"] for turn in restricted)


def test_evaluation_restricted_to_admissible_actions_plays_none_invalid(_private_cache):
    from hp_agent.evaluation import evaluate

    sampling = SamplingParams(max_new_tokens=8)
    free = evaluate(env="fetch", model="tiny", limit=9, sampling=sampling, parallel_envs=9)
    restricted = evaluate(env="fetch", model="tiny", limit=9, sampling=sampling, parallel_envs=9, constrain=True)
    assert free.invalid_fraction > 0.5 and restricted.invalid_fraction == 0.0  # the untrained model never writes "go to X"
