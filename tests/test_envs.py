"""Env registry, plugins through entry points, and Gymnasium's checker on every env."""

import sys

import pytest
from gymnasium.utils.env_checker import check_env

import hp_agent.envs as envs
from hp_agent import TextEnv, Verdict
from hp_agent.envs import list_envs, make, register


class Echo(TextEnv):
    system_prompt = "Repeat the word."

    def task_ids(self):
        return ["apple", "pear"]

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.word = (options or {}).get("task_id") or self.task_id_for_seed(seed or 0)
        return f"Say: {self.word}", {"task_id": self.word, "task_type": "echo"}

    def step(self, action):
        ok = action.strip() == self.word
        return "", float(ok), True, False, {"verdict": Verdict(float(ok), "correct" if ok else "wrong", ok)}


def test_unknown_env_names_it_and_lists_valid_ones():
    with pytest.raises(LookupError, match="unknown env 'mathh'; registered envs: .*math"):
        make("mathh")


def test_register_and_make_custom_env():
    register("echo-test", Echo, overwrite=True)
    assert "echo-test" in list_envs()
    env = make("echo-test")
    observation, info = env.reset(options={"task_id": "pear"})
    assert observation == "Say: pear" and info["task_type"] == "echo"
    assert env.step("pear")[1] == 1.0
    with pytest.raises(ValueError, match="already registered"):
        register("echo-test", Echo)
    with pytest.raises(ValueError, match="not valid"):
        register("bad name!", Echo)
    register("not-an-env", lambda: object(), overwrite=True)
    with pytest.raises(TypeError, match="expected a TextEnv"):
        make("not-an-env")


def test_plugin_envs_are_discovered_through_entry_points(tmp_path, monkeypatch):
    (tmp_path / "echo_plugin.py").write_text(
        "from hp_agent.envs.math import MathEnv\n\ndef factory(**kwargs):\n    return MathEnv(split='test', **kwargs)\n"
    )
    dist = tmp_path / "echo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[hp_agent.envs]\nplugin-math = echo_plugin:factory\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(envs, "_entry_points_loaded", False)
    monkeypatch.setattr(envs, "_REGISTRY", dict(envs._REGISTRY))
    assert "plugin-math" in list_envs()
    env = make("plugin-math", num_tasks=3)
    assert len(env.task_ids()) == 3
    sys.modules.pop("echo_plugin", None)


# openenv plays a server: tests/test_wire.py checks it against a served env
@pytest.mark.parametrize("name", [*(name for name in list_envs() if name != "openenv"), "echo-check"])
def test_gymnasium_env_checker_passes(name):
    register("echo-check", Echo, overwrite=True)
    try:
        env = make(name)
    except (FileNotFoundError, ImportError) as error:  # an env whose data or engine is not here
        pytest.skip(f"{name}: {error}")
    check_env(env, skip_render_check=True)
