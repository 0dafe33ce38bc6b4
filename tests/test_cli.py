"""The command line: a user's mistake prints one line that names it, never a traceback;
options left unset take the library's defaults."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from hp_agent.cli import app
from hp_agent.sft import sft

runner = CliRunner()


def test_a_negative_count_is_refused_by_the_option_itself():
    result = runner.invoke(app, ["eval", "--env", "keys", "--model", "tiny", "--limit", "-1"])
    assert result.exit_code == 2 and "--limit" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["eval", "--env", "keys", "--model", "tiny", "--device", "cuda", "--limit", "1"], ["'cuda'", "no usable GPU", "cpu"]),
        (["eval", "--env", "keys", "--model", "tiny", "--dtype", "float8", "--limit", "1"], ["'float8'", "bfloat16"]),
        (["eval", "--env", "keys", "--model", "tiny", "--backend", "jax", "--limit", "1"], ["'jax'", "hf", "vllm"]),
    ],
)
def test_a_device_dtype_or_backend_that_is_not_there_is_one_line(arguments, named):
    if "'cuda'" in named:
        pytest.importorskip("torch")
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    result = runner.invoke(app, arguments)
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert message.startswith("error:") and "Traceback" not in message, message
    for text in named:
        assert text in message, (text, message)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["train", "--env", "math", "env.kwargs={split: dev}"], ["'dev'", "train", "test"]),
        (["train", "--env", "math", "env.kwargs={colour: red}"], ["'colour'", "split", "num_tasks"]),
        (["train", "--env", "nowhere"], ["'nowhere'", "math", "keys"]),
        (["eval", "--env", "math", "--model", "tiny", "--split", "dev", "--limit", "1"], ["'dev'", "test"]),
        (["eval", "--env", "math", "--model", "tiny", "--chat", "--limit", "1"], ["--chat", "'math'"]),
        (["eval", "--env", "keys", "--limit", "1"], ["--model", "--policy"]),
        (["eval", "--env", "keys", "--model", "tiny", "--device", "cuda:7", "--limit", "1"], ["'cuda:7'", "cpu"]),
        (["sft", "--env", "keys", "--env-kwargs", "{colour: red}", "--out", "unused"], ["'colour'", "demo_mistakes"]),
    ],
)
def test_user_errors_print_one_line_naming_the_value_and_the_valid_ones(arguments, named, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, arguments)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    message = " ".join(result.output.split())
    assert message.startswith("error:"), message
    for text in named:
        assert text in message, (text, message)
    assert not (tmp_path / "runs").exists()  # nothing half-made is left behind


def test_sft_help_states_the_library_defaults():
    """The CLI passes only the options a user set; the defaults its help states are sft()'s."""
    command = typer.main.get_command(app).commands["sft"]
    stated = {param.name: param.show_default for param in command.params if isinstance(param.show_default, str)}
    defaults = {name: p.default for name, p in inspect.signature(sft).parameters.items()}
    assert set(stated) == {"env", "model", "steps", "batch_size", "lr", "seed", "save_every", "prompt_loss", "hindsight_episodes",
                           "hindsight_max_new_tokens"}
    for option, text in stated.items():
        assert text == str(defaults[option]), (option, text, defaults[option])


def _raise(error: Exception):
    def fail(*args, **kwargs):
        raise error

    return fail


def test_a_user_error_from_deep_in_a_command_prints_one_line_and_no_traceback(monkeypatch):
    from hp_agent.errors import UserError

    monkeypatch.setattr("hp_agent.trainer.train", _raise(UserError("checkpoint step_000002 is damaged; resume it")))
    result = runner.invoke(app, ["train", "--env", "keys"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == ["error: checkpoint step_000002 is damaged; resume it"]


def test_an_internal_error_prints_its_traceback_and_says_it_is_a_bug(monkeypatch):
    """A KeyError deep in the trainer is a bug, not the user's mistake: its traceback stays."""
    monkeypatch.setattr("hp_agent.trainer.train", _raise(KeyError("baseline")))
    result = runner.invoke(app, ["train", "--env", "keys"])
    assert result.exit_code == 1, result.output
    assert "Traceback (most recent call last)" in result.output and "KeyError: 'baseline'" in result.output
    assert "bug in hp_agent" in result.output.strip().splitlines()[-1]


def test_a_reader_that_stops_reading_is_not_reported_as_a_bug():
    """`hp-agent eval --help | head -1`: the closed pipe ends the command quietly."""
    command = subprocess.Popen([sys.executable, "-m", "hp_agent", "eval", "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    command.stdout.close()  # the reader goes before anything is written
    stderr = command.stderr.read().decode()
    assert command.wait() == 1
    assert "bug in hp_agent" not in stderr and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("given", ["{tmp}/no-model-here", "./no-model-here", "runs/no-model-here"])
def test_a_model_path_that_does_not_exist_says_no_such_folder(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    model = given.format(tmp=tmp_path)
    result = runner.invoke(app, ["eval", "--env", "keys", "--model", model, "--limit", "1"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert message.startswith("error: no such folder: "), message
    assert model.removeprefix("./") in message and "hf download" not in message
