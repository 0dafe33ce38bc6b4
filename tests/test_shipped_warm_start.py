"""``--model tiny-alfworld-warm``: the ALFWorld warm start this package ships (the tiny model
after SFT on the expert's play of synthesized train games; recipe in docs/results.md)."""

from __future__ import annotations

import pytest
from test_prefix_cache import teacher_forced_logprobs  # tests/ is on sys.path

from hp_agent.envs.alfworld import data
from hp_agent.policies import load_policy
from hp_agent.policies.lora import base_reference
from hp_agent.policies.resolve import SHIPPED_MODELS, resolve_model, shipped_model_path
from hp_agent.rollout import prompt_messages

NAME = "tiny-alfworld-warm"


def test_the_shipped_folder_is_a_whole_model_found_by_name():
    assert NAME in SHIPPED_MODELS
    folder = resolve_model(NAME)
    assert folder == shipped_model_path(NAME)
    for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / file).is_file(), file
    assert base_reference(NAME, folder) == NAME  # an adapter on it finds it again by name on any machine


@pytest.mark.skipif(data.find_data_root() is None, reason="official ALFWorld games not found (ALFWORLD_DATA or the shared tarball)")
def test_it_predicts_the_experts_first_moves_on_official_games_far_better_than_the_untrained_model(_private_cache):
    """Held-out games (valid_seen, never trained on): the warm start's mean log-likelihood of
    the expert's first action is far above that of the model it was trained from, which
    shares its tokenizer, so the folder holds the trained weights and reads these prompts."""
    from hp_agent.envs.alfworld.env import AlfworldEnv

    warm, untrained = load_policy(NAME), load_policy("tiny-alfworld")
    assert warm.tokenizer.get_vocab() == untrained.tokenizer.get_vocab()
    env = AlfworldEnv(split="id", source="official", num_games=4)
    task_ids = env.task_ids()
    mean_logprob = {"warm": 0.0, "untrained": 0.0}
    for task_id in task_ids:
        observation, info = env.reset(options={"task_id": task_id})
        for label, policy in (("warm", warm), ("untrained", untrained)):
            prompt = policy.render(prompt_messages(env, observation))
            action = policy.tokenizer.encode(f"<action>{info['expert_action']}</action>", add_special_tokens=False)
            mean_logprob[label] += teacher_forced_logprobs(policy.model, prompt, action).mean().item() / len(task_ids)
    env.close()
    # untrained: about log(1/vocab) a token; the warm start's expert tokens are mostly likely
    assert mean_logprob["warm"] > -1.0 > -4.0 > mean_logprob["untrained"], mean_logprob
