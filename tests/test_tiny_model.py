"""The embedded ``--model tiny`` and model-name resolution."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

from hp_agent.paths import cache_root
from hp_agent.policies import tiny
from hp_agent.policies.resolve import ModelNotFoundError, resolve_model

REPO_ROOT = Path(__file__).resolve().parents[1]
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1+1?"}]
RENDERED = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1+1?<|im_end|>\n"


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HP_AGENT_CACHE pointing at a fresh folder for the whole session."""
    root = tmp_path_factory.mktemp("hp_agent_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HP_AGENT_CACHE", str(root))
        yield root


@pytest.fixture(scope="session")
def model_dir(cache_dir: Path) -> Path:
    """The tiny model, built once per session through the cache."""
    return tiny.tiny_model_path()


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def model(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(model_dir)


def test_cached_under_versioned_folder(cache_dir: Path, model_dir: Path) -> None:
    assert model_dir == cache_dir / tiny.TINY_VERSION
    stamp = (model_dir / "config.json").stat().st_mtime_ns
    assert tiny.tiny_model_path() == model_dir
    assert (model_dir / "config.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
    # no temp folder left; the lock that serializes concurrent first builds stays
    assert sorted(p.name for p in cache_dir.iterdir()) == [f".{tiny.TINY_VERSION}.lock", tiny.TINY_VERSION]


def test_cache_root_defaults_to_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HP_AGENT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "hp_agent"
    monkeypatch.setenv("HP_AGENT_CACHE", str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere"  # one cache for models, games and translations


def test_is_a_small_float32_qwen3(model_dir: Path, model) -> None:
    config = AutoConfig.from_pretrained(model_dir)
    assert config.model_type == "qwen3"
    assert config.architectures == ["Qwen3ForCausalLM"]
    assert isinstance(model, Qwen3ForCausalLM)
    assert config.tie_word_embeddings
    assert config.max_position_embeddings == 4096
    assert 1_000_000 <= sum(p.numel() for p in model.parameters()) <= 20_000_000
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_token_ids_agree(tokenizer, model) -> None:
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    for source in (model.config, model.generation_config):
        assert source.eos_token_id == ids["<|im_end|>"] == tokenizer.eos_token_id
        assert source.pad_token_id == ids["<|endoftext|>"] == tokenizer.pad_token_id
        assert source.bos_token_id == tokenizer.bos_token_id
    assert len(tokenizer) <= model.config.vocab_size < len(tokenizer) + tiny.VOCAB_MULTIPLE
    assert model.get_input_embeddings().weight.shape[0] == model.config.vocab_size


@pytest.mark.parametrize("token", SPECIAL_TOKENS)
def test_special_tokens_are_single_ids(tokenizer, token: str) -> None:
    (token_id,) = tokenizer.encode(token, add_special_tokens=False)
    ids = tokenizer.encode(f"a{token}b", add_special_tokens=False)
    assert token_id in ids
    assert tokenizer.convert_ids_to_tokens(token_id) == token


def test_no_tokens_added_on_encode(tokenizer) -> None:
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)


def test_think_tags_survive_skip_special_tokens(tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>a<think>b</think>c<|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a<think>b</think>c"


@pytest.mark.parametrize(
    "text",
    [
        r"\boxed{\frac{1}{2}}",
        "Let $x^2 + 3x - 4 = 0$. Then $x = \\frac{-3 \\pm \\sqrt{25}}{2}$, so x = 1 or x = -4.",
        "café naïve 中文 日本語 한국어 Ελληνικά 🙂👍🏽 ∑√π≤≥ e\u0301 \u200b\ufeff",
        "  leading spaces, tabs\tand\r\nnewlines\n\n\nand trailing  ",
        "def f(x):\n    return {'a': [1, 2]}  # comment\n",
        "",
    ],
)
def test_round_trip(tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_round_trip_any_text(tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_tokenizes_math_compactly(tokenizer) -> None:
    text = r"The answer is $\boxed{\frac{1}{2}}$."
    assert len(tokenizer.encode(text, add_special_tokens=False)) < len(text.encode()) / 2


def test_chat_template(tokenizer) -> None:
    def render(**kwargs) -> str:
        return tokenizer.apply_chat_template(MESSAGES, tokenize=False, **kwargs)

    assert render() == RENDERED
    assert render(add_generation_prompt=True) == RENDERED + "<|im_start|>assistant\n"
    assert render(add_generation_prompt=True, enable_thinking=True) == RENDERED + "<|im_start|>assistant\n"
    no_think = RENDERED + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert render(add_generation_prompt=True, enable_thinking=False) == no_think
    assert render(enable_thinking=False) == RENDERED  # without a generation prompt, nothing added


def test_generates(tokenizer, model) -> None:
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert prompt["input_ids"].shape[1] < out.shape[1] <= prompt["input_ids"].shape[1] + 4


def test_build_is_deterministic(model_dir: Path, tmp_path: Path) -> None:
    # A fresh process: hash seeds differ per process, so this also catches order effects.
    again = tmp_path / "again"
    code = (
        "import sys; from pathlib import Path; from hp_agent.policies.tiny import build_tiny_model; "
        "build_tiny_model(Path(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code, str(again)], check=True, env=env, capture_output=True)
    assert (again / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    first, second = load_file(model_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_seed_changes_weights(tokenizer, model) -> None:
    other = tiny.build_model(tokenizer, seed=1)
    assert not torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_build_keeps_a_finished_folder(tmp_path: Path) -> None:
    # A concurrent builder that finished first wins: a later rename must not clobber it.
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")
    assert tiny.build_tiny_model(target) == target
    assert (target / "config.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_build_refuses_a_folder_of_other_files(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no model"):
        tiny.build_tiny_model(tmp_path / "model")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["model", "notes.txt"]


def test_a_cache_folder_without_a_model_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # The cache is hp_agent's own: what is no model there is set aside, not an error that stops every later run.
    monkeypatch.setenv("HP_AGENT_CACHE", str(tmp_path))
    (tmp_path / tiny.TINY_VERSION).mkdir()
    (tmp_path / tiny.TINY_VERSION / "model.safetensors").write_text("half")
    assert (tiny.tiny_model_path() / "config.json").is_file()
    assert "holds no model (it holds: ['model.safetensors']); rebuilding it" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{tiny.TINY_VERSION}.lock", tiny.TINY_VERSION]
    AutoModelForCausalLM.from_pretrained(tmp_path / tiny.TINY_VERSION)


def test_build_fills_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    assert (tiny.build_tiny_model(tmp_path / "model") / "config.json").is_file()


def test_resolve_tiny(model_dir: Path) -> None:
    assert resolve_model("tiny") == model_dir


def test_resolve_local_folder(model_dir: Path) -> None:
    assert resolve_model(str(model_dir)) == model_dir


def test_resolve_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config.json"):
        resolve_model(str(tmp_path))


def test_resolve_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such folder"):
        resolve_model(str(tmp_path / "nope"))


def test_resolve_uncached_hub_id_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Offline (HF_HUB_OFFLINE): nothing to download from; tests/test_hub_download.py covers downloads.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("Qwen/Qwen3-8B")
    assert time.monotonic() - start < 2
    message = str(error.value)
    assert "HF_HUB_OFFLINE is set" in message and "not in the Hugging Face cache" in message and "\n" not in message
    assert "--model /path/to/Qwen3-8B" in message and "--model tiny" in message


def test_resolve_invalid_hub_id() -> None:
    with pytest.raises(ModelNotFoundError, match="--model"):
        resolve_model("not a valid id!")


def test_resolve_cached_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The Hugging Face cache layout: refs/main names the snapshot that holds the files.
    repo = tmp_path / "models--Qwen--Qwen3-8B"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"")  # a complete snapshot: config and weights
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert resolve_model("Qwen/Qwen3-8B") == snapshot


def test_alfworld_variant_holds_every_alfred_name_as_one_token(tokenizer) -> None:
    from hp_agent.envs.alfworld.env import ALFRED_NAMES
    from hp_agent.policies.resolve import resolve_model

    variant = AutoTokenizer.from_pretrained(resolve_model("tiny-alfworld"))
    assert all(len(variant.tokenize(f" {name}")) == 1 for name in ALFRED_NAMES)
    split_by_tiny = [name for name in ALFRED_NAMES if len(tokenizer.tokenize(f" {name}")) > 1]
    assert len(split_by_tiny) > 20  # the plain tiny tokenizer, unchanged, splits many of them
    text = "You arrive at countertop 1. <action>take peppershaker 2 from countertop 1</action>"
    assert variant.decode(variant.encode(text)) == text
