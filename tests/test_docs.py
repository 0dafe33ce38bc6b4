"""The docs stay true: the tutorial runs as printed, the configuration reference matches the models."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hp_agent.config_reference import reference_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_configuration_reference_is_the_one_the_models_generate():
    # Stale after a change to hp_agent/config.py: python -m hp_agent.config_reference docs/config.md
    assert (DOCS / "config.md").read_text() == reference_markdown()


def test_the_reference_lists_every_key_with_its_default():
    text = reference_markdown()
    assert "| `learner.parallel` | Literal['ddp', 'fsdp2'] | `'ddp'` |" in text
    assert "| `model.vllm.max_model_len` | " in text  # nested sections are flattened
    assert "| `trainer.views_per_step` | int | `2` |" in text


@pytest.mark.slow
def test_the_custom_env_tutorial_runs_as_printed(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "custom_env.md").read_text(), flags=re.S)
    assert len(blocks) == 4
    monkeypatch.chdir(tmp_path)  # the tutorial's run goes to runs/ in the working folder
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/custom_env.md", "exec"), namespace)  # as printed, in order
    run = namespace["summary"].run_dir
    assert run == Path("runs") / "guess-tutorial" and (run / "credit_views.jsonl").is_file()
    assert namespace["page"].is_file() and namespace["report"].is_file()
    assert namespace["result"].tasks == 8 and set(namespace["result"].per_task_type) == {"low", "high"}
    env = namespace["GuessNumber"]()
    env.reset(options={"task_id": "3"})
    observation, reward, terminated, truncated, info = env.step("three")
    assert (reward, info["invalid_action"], terminated) == (-0.1, True, False)  # unreadable: a cost, no end
