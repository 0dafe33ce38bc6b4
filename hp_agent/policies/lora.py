"""LoRA through ``peft``: train a low-rank adapter, checkpoint it alone, merge it for eval and vLLM.

With ``model.lora_rank`` > 0 the policy's model is wrapped in a ``peft`` ``PeftModel``
(:func:`maybe_apply_lora`): each ``model.lora_target_modules`` linear layer gets
``W x + (alpha / r) B A x`` with ``B`` starting at zero, and only ``A`` and ``B`` require
gradients. Everything else sees the same model: ``PeftModel`` forwards ``get_decoder``,
``get_output_embeddings`` and ``config`` to the base model, whose layers now hold the
adapter, so generation, hidden states and the LM head need no change.

``save_pretrained`` on a ``PeftModel`` writes the adapter only (``adapter_config.json``
and ``adapter_model.safetensors``), so a LoRA run's ``checkpoints/step_N/model/`` is an
*adapter folder*: the adapter, the tokenizer, and in ``adapter_config.json`` the base
model it belongs to (``base_model_name_or_path``: a tiny variant's name, a hub id, or an
absolute folder). Loading such a folder as a policy (``eval``, ``--model RUN``) loads the
base and merges the adapter into it in memory; :func:`merge_adapter` (``hp-agent
merge-lora``) writes the merged model as a plain Hugging Face folder that transformers
and vLLM load. Resuming a LoRA run loads the base with the adapter unmerged and
trainable again.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hp_agent.errors import UserFileExistsError, UserValueError
from hp_agent.files import atomic_folder
from hp_agent.run_folder import model_source

if TYPE_CHECKING:
    from hp_agent.config import ModelConfig
    from hp_agent.policies import Policy

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_folder(path: str | Path) -> bool:
    """True for a folder holding a peft adapter (``adapter_config.json``) and no full model."""
    path = Path(path)
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def is_peft_model(model: torch.nn.Module) -> bool:
    """True for a ``peft.PeftModel`` (without importing peft where nothing has yet)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def lora_config(section: ModelConfig, base_reference: str | None = None) -> Any:
    """The ``peft.LoraConfig`` that a config's ``model`` section describes."""
    from peft import LoraConfig

    alpha = section.lora_alpha if section.lora_alpha is not None else 2 * section.lora_rank
    return LoraConfig(
        r=section.lora_rank,
        lora_alpha=alpha,
        lora_dropout=section.lora_dropout,
        target_modules=list(section.lora_target_modules),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_reference,
    )


def apply_lora(model: torch.nn.Module, section: ModelConfig, base_reference: str | None = None) -> torch.nn.Module:
    """Wrap ``model`` (in place: its target layers get adapters) in a ``PeftModel`` whose
    only trainable parameters are the adapter's. ``base_reference``: what the adapter
    folder will name as its base (default: the folder the model was loaded from)."""
    from peft import get_peft_model

    if section.lora_rank <= 0:
        raise ValueError(f"model.lora_rank must be > 0 to apply LoRA, got {section.lora_rank}")
    peft_model = get_peft_model(model, lora_config(section))
    if base_reference is not None:  # get_peft_model writes the loaded folder's path here
        peft_model.peft_config["default"].base_model_name_or_path = base_reference
    return peft_model


def base_reference(name: str, loaded_from: Path) -> str:
    """How an adapter names its base: a tiny variant or a hub id as given (found again on
    any machine), a local folder as the absolute path of the model folder loaded."""
    from hp_agent.policies.resolve import SHIPPED_MODELS
    from hp_agent.policies.tiny import TINY_VARIANTS

    if name in TINY_VARIANTS or name in SHIPPED_MODELS:
        return name
    if Path(name).expanduser().exists():
        return str(Path(loaded_from).resolve())
    return name  # a hub id, resolved from the local Hugging Face cache


def adapter_base_folder(adapter_dir: str | Path) -> Path:
    """The local folder of the base model an adapter folder was trained on."""
    from hp_agent.policies.resolve import resolve_model

    config = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise UserValueError(f"adapter folder {str(adapter_dir)!r} does not name its base model (base_model_name_or_path)")
    folder = resolve_model(model_source(base))
    if is_adapter_folder(folder):
        raise UserValueError(f"adapter folder {str(adapter_dir)!r} names another adapter, {base!r}, as its base")
    return folder


def load_adapter_model(
    adapter_dir: str | Path, dtype: torch.dtype | str = "auto", merge: bool = True, trainable: bool = False
) -> torch.nn.Module:
    """Base model + the adapter in ``adapter_dir``, on the CPU: merged into a plain
    transformers model (``merge``), or a ``PeftModel`` whose adapter is ``trainable``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from hp_agent.policies.attention import DECODE_SDPA

    base = AutoModelForCausalLM.from_pretrained(adapter_base_folder(adapter_dir), dtype=dtype, attn_implementation=DECODE_SDPA)
    model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable and not merge)
    return model.merge_and_unload() if merge else model


def maybe_apply_lora(policy: Policy, section: ModelConfig) -> Policy:
    """Make ``policy`` train as ``section`` says; call it right after loading the policy,
    before building the learner (whose optimizer takes the trainable parameters).

    - ``lora_rank == 0``: the policy as it is (a model loaded from an adapter folder is
      already merged: full fine-tuning goes on from the merged weights);
    - ``lora_rank > 0``, loaded from an adapter folder with the same LoRA settings (a
      resumed LoRA run, or one started from a LoRA checkpoint): the base with that
      adapter, trainable, in place of the merged model;
    - ``lora_rank > 0`` otherwise: a fresh adapter (``B = 0``: the model's outputs are
      unchanged) on the loaded model.
    """
    if section.lora_rank == 0 or is_peft_model(policy.model):  # nothing to do, or done already
        return policy
    adapter = getattr(policy, "adapter_path", None)
    if adapter is not None:
        _check_same_settings(adapter, section)
        parameter = next(policy.model.parameters())
        dtype, device = parameter.dtype, parameter.device
        del parameter
        policy.model = None  # free the merged copy before the base is loaded again
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        policy.model = load_adapter_model(adapter, dtype, merge=False, trainable=True).to(device)
    else:
        policy.model = apply_lora(policy.model, section, base_reference(section.name, policy.path))
    policy.weights_changed()  # the cached keys and values are the model's before
    return policy


def _check_same_settings(adapter_dir: Path, section: ModelConfig) -> None:
    saved = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text())
    wanted = lora_config(section)
    pairs = {
        "lora_rank": (saved.get("r"), wanted.r),
        "lora_alpha": (saved.get("lora_alpha"), wanted.lora_alpha),
        "lora_target_modules": (sorted(saved.get("target_modules") or []), sorted(wanted.target_modules)),
        "lora_dropout": (saved.get("lora_dropout"), wanted.lora_dropout),
    }
    differ = {key: pair for key, pair in pairs.items() if pair[0] != pair[1]}
    if differ:
        details = ", ".join(f"{key} {have!r} (adapter) vs {want!r} (config)" for key, (have, want) in differ.items())
        raise UserValueError(
            f"the model {str(adapter_dir)!r} is a LoRA adapter with other settings: {details}. Train it with its own "
            "settings, or merge it first (`hp-agent merge-lora ADAPTER --out DIR`) and start from DIR"
        )


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's state dict of ``model``: a ``PeftModel``'s base weights with
    every active adapter's ``(alpha / r) B A`` added, under the base model's own names;
    ``model.state_dict()`` for any other model. ``model`` is not modified."""
    if not is_peft_model(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    key = f"{name}.weight"
                    delta = module.get_delta_weight(adapter)
                    deltas[key] = deltas[key] + delta if key in deltas else delta
    merged = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        merged[key] = value + deltas[key].to(value.dtype) if key in deltas else value
    return merged


def save_model(model: torch.nn.Module, tokenizer: Any, folder: Path) -> None:
    """Write ``model`` and ``tokenizer`` into ``folder``: a Hugging Face model folder, or a
    LoRA model's adapter alone."""
    # Its embeddings are never resized, so peft need not look the base up on the hub to compare vocabulary sizes.
    options = {"save_embedding_layers": False} if is_peft_model(model) else {}
    model.save_pretrained(folder, safe_serialization=True, **options)
    tokenizer.save_pretrained(folder)


def _write_folder(out_dir: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write`` on a temporary folder renamed to ``out_dir`` (which must not exist or be
    empty): a reader never sees a half-written folder."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserFileExistsError(f"{str(out_dir)!r} exists and is not an empty folder; pick another --out")
    with atomic_folder(out_dir) as tmp:
        write(tmp)
    return out_dir


def merged_model_folder(model: torch.nn.Module, tokenizer: Any, out_dir: str | Path) -> Path:
    """Write ``model`` with its adapter merged, and ``tokenizer``, as a plain Hugging Face
    folder; ``model`` (on any device) stays as it is. Returns ``out_dir``."""
    base = model.get_base_model() if is_peft_model(model) else model
    copies: dict[int, torch.Tensor] = {}  # tied tensors (embeddings and LM head) stay one tensor
    state = {}
    for key, value in merged_state_dict(model).items():
        if id(value) not in copies:
            copies[id(value)] = value.detach().to("cpu").contiguous()
        state[key] = copies[id(value)]

    def write(tmp: Path) -> None:
        base.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return _write_folder(Path(out_dir), write)


def merge_adapter(source: str | Path, out_dir: str | Path) -> Path:
    """Merge the adapter of ``source`` (an adapter folder, or a LoRA run folder: its latest
    checkpoint) into its base model and write a plain Hugging Face folder at ``out_dir``
    (in the base's saved dtype, with the adapter folder's tokenizer). Returns ``out_dir``."""
    from transformers import AutoTokenizer

    folder = Path(model_source(str(source)))
    if not is_adapter_folder(folder):
        raise UserValueError(
            f"{str(source)!r} is not a LoRA adapter folder or LoRA run (no {ADAPTER_CONFIG} in {str(folder)!r}); "
            "only a model trained with model.lora_rank > 0 has an adapter to merge"
        )
    has_tokenizer = (folder / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(folder if has_tokenizer else adapter_base_folder(folder))
    model = load_adapter_model(folder, dtype="auto", merge=True)

    return _write_folder(Path(out_dir), lambda tmp: save_model(model, tokenizer, tmp))
