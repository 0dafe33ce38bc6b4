"""The README's custom-environment example runs as printed."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_custom_env_example_trains(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(block for block in blocks if "class Echo" in block)
    monkeypatch.chdir(tmp_path)  # the example writes runs/ in the working folder
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)  # as printed
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "metrics.jsonl").is_file()
    env = namespace["Echo"]()
    assert env.reset(options={"task_id": "pear"})[0] == "Say: pear"
