"""The texts built-in envs show a model, gathered for training a tokenizer.

The embedded tiny model's tokenizer learns its pieces from these (see
:mod:`hp_agent.policies.tiny`, which takes texts and knows no env). Plugins are left out
on purpose: the tiny model must be the same on every machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import import_module
from itertools import islice

from hp_agent.envs.base import TextEnv

# Env classes whose system prompt and corpus texts go in, in this order. Changing the
# list or any of their texts changes the tiny model: bump its version with it.
CORPUS_ENVS: tuple[str, ...] = ("hp_agent.envs.math:MathEnv", "hp_agent.envs.alfworld.env:AlfworldEnv")

# Caps the texts taken from each env so that a large dataset keeps the build fast.
MAX_TEXTS_PER_ENV = 20_000


def _env_texts(spec: str) -> Iterator[str]:
    """The system prompt and corpus texts of env class ``spec`` (``"module:Class"``)."""
    module_name, _, attr = spec.partition(":")
    env_class: type[TextEnv] = getattr(import_module(module_name), attr)
    if env_class.system_prompt:
        yield env_class.system_prompt
    yield from islice(env_class.corpus_texts(), MAX_TEXTS_PER_ENV)


def builtin_texts() -> Iterator[str]:
    """Every :data:`CORPUS_ENVS` env's texts, in a fixed order."""
    for spec in CORPUS_ENVS:
        yield from _env_texts(spec)


def builtin_texts_with_alfred_names() -> Iterator[str]:
    """:func:`builtin_texts`, then every ALFRED name and action verb in the forms games
    print, so that BPE makes each one token."""
    from hp_agent.envs.alfworld.env import vocabulary_texts

    yield from builtin_texts()
    yield from vocabulary_texts()
