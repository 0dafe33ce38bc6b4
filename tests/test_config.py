"""Config: defaults, YAML, dotted overrides, and errors that name the bad key."""

import pytest

from hp_agent.config import ConfigError, TrainConfig, load_config, save_config


def test_defaults_and_group_size_by_algo():
    config = TrainConfig()
    assert config.algo.name == "hp-rlvr" and config.algo.rollouts_per_prompt == 1
    assert load_config(overrides=["algo.name=grpo"]).algo.rollouts_per_prompt == 8
    assert load_config(overrides=["algo.name=grpo", "algo.group_size=4"]).algo.rollouts_per_prompt == 4


def test_overrides_parse_yaml_values():
    config = load_config(overrides=["algo.clip_eps_low=0.1", "env.kwargs={split: test}", "trainer.steps=3"])
    assert config.algo.clip_eps_low == 0.1
    assert config.env.kwargs == {"split": "test", "prompt_mode": "verl-agent"}  # alfworld resolves its prompt mode
    assert config.trainer.steps == 3


def test_an_override_that_is_not_yaml_names_its_key():
    # e.g. a shell that split "env.kwargs={split: id}" at the space, or an unclosed list
    for override, key in [("trainer.steps=[1", "trainer.steps"), ("env.kwargs={bogus:", "env.kwargs")]:
        with pytest.raises(ConfigError, match=f"override {key}: the value .* is not valid YAML"):
            load_config(overrides=[override])


def test_unknown_key_names_it_and_lists_valid_ones():
    with pytest.raises(ConfigError) as error:
        load_config(overrides=["algo.clip_eps=0.2"])
    message = str(error.value)
    assert "'algo.clip_eps'" in message and "algo.clip_eps_low" in message and "algo.clip_eps_high" in message
    with pytest.raises(ConfigError, match="unknown config key 'bogus'.*env.name"):
        load_config(overrides=["bogus=1"])


def test_bad_value_names_key_and_value():
    with pytest.raises(ConfigError, match=r"algo.name.*'ppo'"):
        load_config(overrides=["algo.name=ppo"])
    with pytest.raises(ConfigError, match="group_size must be >= 2 for grpo"):
        load_config(overrides=["algo.name=grpo", "algo.group_size=1"])
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(overrides=["trainer.steps"])


def test_yaml_file_round_trip(tmp_path):
    config = load_config(overrides=["algo.name=grpo", "learner.lr=0.001"])
    save_config(config, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml", ["trainer.steps=7"])
    assert again.algo.name == "grpo" and again.learner.lr == 0.001 and again.trainer.steps == 7
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_credit_rule_names_and_top_p_are_checked():
    with pytest.raises(ConfigError, match="unknown credit rule 'ppo'; registered: gigpo, grpo, hcapo, hp-rlvr, opsd, reinforce, spo"):
        load_config(overrides=["algo.name=ppo"])
    assert load_config(overrides=["algo.name=reinforce"]).algo.rollouts_per_prompt == 1
    with pytest.raises(ConfigError, match=r"rollout.top_p=0.9 cannot train.*set rollout.top_p=1.0"):
        load_config(overrides=["rollout.top_p=0.9"])


def test_a_low_precision_model_trains_in_mixed_precision_unless_asked_otherwise():
    assert load_config(None, []).learner.mixed_precision is False
    assert load_config(None, ["model.dtype=bfloat16"]).learner.mixed_precision is True
    assert load_config(None, ["model.dtype=float16"]).learner.mixed_precision is True
    assert load_config(None, ["model.dtype=bfloat16", "learner.mixed_precision=false"]).learner.mixed_precision is False
    with pytest.raises(ConfigError, match="float16.*loss scaling"):
        load_config(None, ["model.dtype=float16", "learner.mixed_precision=false"])


def test_the_replaced_mini_batch_key_says_what_replaced_it():
    with pytest.raises(ConfigError, match="learner.mini_batch_size .*replaced by learner.mini_batch_prompts"):
        load_config(None, ["learner.mini_batch_size=8"])
