"""Every training command of the README's "On a GPU" section fits its stated devices, by
the same plan a run checks before it loads anything (`hp-agent train --plan --plan-for`),
made from the Qwen3 config.json files in tests/data/qwen3 (no weights, no hub)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hp_agent.cli import app

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "qwen3"
USABLE_GIB_OF_80_GB = 79  # what torch reports of an 80 GB GPU (mem_get_info total, 79.1 GiB on an H100)


def gpu_commands() -> list[tuple[int, str]]:
    """(GPUs, the command after ``train``) of each training command, from its comment line."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## On a GPU"):]
    section = section[: section.index("\n## ", 4)]
    commands, gpus = [], None
    for line in re.findall(r"```bash\n(.*?)```", section, flags=re.S)[1].splitlines():
        stated = re.match(r"# (\d+) GPUs? of 80 GB", line)
        if stated:
            gpus = int(stated.group(1))
        elif " train " in line:
            commands.append((gpus, line.split(" train ", 1)[1]))
            gpus = None
    return commands


def test_the_section_states_every_setup_the_issue_names():
    assert [gpus for gpus, _ in gpu_commands()] == [1, 1, 8, 16]


@pytest.mark.parametrize(("gpus", "command"), gpu_commands())
def test_each_readme_gpu_command_fits_its_devices(gpus, command):
    arguments = [re.sub(r"^Qwen/(Qwen3-[\d.]+B)$", lambda m: str(MODELS / m.group(1)), word)
                 for word in shlex.split(command)]
    if "--nproc" in arguments:
        assert int(arguments[arguments.index("--nproc") + 1]) == gpus
    else:
        arguments += ["--nproc", str(gpus)]  # torchrun's ranks: as many as the GPUs of both machines
    result = CliRunner().invoke(app, ["train", *arguments, "--plan", "--plan-for", f"{gpus}x{USABLE_GIB_OF_80_GB}"])
    assert result.exit_code == 0, result.output
