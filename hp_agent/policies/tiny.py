"""The embedded default policy, ``--model tiny``: a few-million-parameter Qwen3 model.

It is built locally from a config and a fixed seed (random weights) with a byte-level
BPE tokenizer trained on the built-in environments' texts, so the whole pipeline
(rollouts, HP-RLVR, GRPO) runs end to end on a CPU-only machine without a model hub.
The folder it writes loads like any hub model with ``AutoTokenizer.from_pretrained``
and ``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from importlib import import_module
from importlib.resources import files
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from hp_agent.paths import atomic_model_folder, cache_root, cached_model_folder

# Bump whenever the recipe changes (the corpus, including hp_agent.envs.corpus' texts, the
# tokenizer, config or init): cached folders are keyed by it, so a new version rebuilds
# instead of reusing a stale model.
TINY_VERSION = "tiny-qwen3-v2"

# Embedded model variants: name -> (cache folder, "module:function" yielding the texts
# its tokenizer learns from, before the generic text). The texts are named, not imported:
# this module knows no env. ``tiny-alfworld``'s tokenizer also holds every ALFRED object
# and receptacle name as one token (see docs/results.md for what that did).
TINY_VARIANTS: dict[str, tuple[str, str | None]] = {
    "tiny": (TINY_VERSION, "hp_agent.envs.corpus:builtin_texts"),
    "tiny-alfworld": ("tiny-alfworld-qwen3-v1", "hp_agent.envs.corpus:builtin_texts_with_alfred_names"),
}

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK_START, THINK_END = "<think>", "</think>"
# BPE stops short of this when the corpus runs out of pairs to merge.
MAX_VOCAB_SIZE = 4096
# The embedding is the tokenizer's size rounded up to this, as Qwen pads its vocab; a
# tight fit matters because a random model samples all ids alike, and ids past the
# tokenizer decode to nothing.
VOCAB_MULTIPLE = 64

# Qwen2/Qwen3's pre-tokenizer split: digits one at a time (good for arithmetic), words
# with their leading space, punctuation runs, and newlines kept apart from other text.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's ChatML template, reduced to plain-text messages. With enable_thinking=False the
# generation prompt closes an empty think block, as Qwen3 does to switch thinking off.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Generic chat, household and code text (package data) so that text outside the envs'
# corpora still tokenizes into sensible pieces rather than single bytes.
GENERIC_TEXT = files("hp_agent.policies").joinpath("generic_corpus.txt").read_text(encoding="utf-8")


def corpus(texts: str | None) -> Iterator[str]:
    """The tokenizer's training texts in a fixed order: those of ``texts`` (a
    ``"module:function"`` yielding them, or None), then the generic text."""
    if texts is not None:
        module_name, _, attr = texts.partition(":")
        yield from getattr(import_module(module_name), attr)()
    yield GENERIC_TEXT


def train_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer on ``texts`` and wrap it for transformers."""
    tokenizer = Tokenizer(models.BPE())
    # No normalizer: decode(encode(text)) must give back exactly the text, any unicode.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    # <think> tags are ordinary added tokens as in Qwen3 (special=False), so they stay in
    # text decoded with skip_special_tokens=True; two ids are kept free for them.
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_VOCAB_SIZE - 2,
        min_frequency=2,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in (THINK_START, THINK_END)])
    # bos is declared (Qwen3's config names <|endoftext|> as bos) but, as in Qwen3,
    # never prepended: the post-processor adds no tokens.
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_config(tokenizer: PreTrainedTokenizerFast) -> Qwen3Config:
    """The model's config, with special-token ids taken from ``tokenizer``."""
    return Qwen3Config(
        vocab_size=-(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        max_window_layers=4,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 model; the same ``seed`` gives the same weights."""
    config = tiny_config(tokenizer)
    # fork_rng: seeding must not disturb the caller's global torch RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # float32 whatever torch's default dtype: the CPU path trains in full precision.
        model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def build_tiny_model(out_dir: Path, seed: int = 0, texts: str | None = TINY_VARIANTS["tiny"][1]) -> Path:
    """Train the tokenizer on :func:`corpus` of ``texts``, build the model and save both
    into ``out_dir``.

    The folder appears atomically: everything is written into a temporary sibling that
    is then renamed, so readers never see a half-written model. If another builder
    finished ``out_dir`` first, its result is kept and this build is discarded.
    """
    out_dir = Path(out_dir)
    with atomic_model_folder(out_dir) as tmp_dir:
        _write_tiny_model(tmp_dir, seed, texts)
    return out_dir


def _write_tiny_model(folder: Path, seed: int, texts: str | None) -> None:
    tokenizer = train_tokenizer(corpus(texts))
    build_model(tokenizer, seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def tiny_model_path(variant: str = "tiny") -> Path:
    """The cached folder of a :data:`TINY_VARIANTS` model, built on first use (a few seconds)."""
    folder, texts = TINY_VARIANTS[variant]
    return cached_model_folder(cache_root() / folder, lambda tmp_dir: _write_tiny_model(tmp_dir, 0, texts))
