"""Policies: the language model behind an agent, behind one small protocol.

A policy renders chat messages to token ids, samples continuations of token-id prompts
(returning the sampled ids and their log-probs), and exposes final hidden states and
its LM head so that scorers and the learner can make logits a chunk at a time.
Backends: ``hf`` (transformers, any AutoModelForCausalLM with a chat template) and
``vllm`` (samples on a vLLM engine, learns on a transformers copy; needs the separate
environment that ``scripts/setup_vllm_env.sh`` builds).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import torch

from hp_agent.constraint import ActionTrie
from hp_agent.policies.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from hp_agent.config import ModelConfig


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn. ``greedy`` ignores temperature and top_p."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False

    def __post_init__(self) -> None:
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"SamplingParams: temperature must be > 0, got {self.temperature}; "
                             "for greedy decoding pass greedy=True")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    """One sampled continuation: ids (end-of-turn token included when reached).

    ``allowed``: under restricted decoding, per token the ids it was sampled among
    (None where free); None when the prompt had no constraint.
    """

    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    allowed: list[list[int] | None] | None = None


class Policy(Protocol):
    """What rollout, hindsight scoring and the learner need from a model."""

    model: torch.nn.Module
    tokenizer: object
    eos_token_id: int  # the end-of-turn token, which ends every sampled turn
    # Keys and values of recently sampled sequences, which scoring may reuse too
    # (an empty ``PrefixCache(0)`` where the backend keeps its own, as vLLM does).
    prefix_cache: PrefixCache

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        """Chat messages -> prompt ids ending with the assistant generation prompt."""
        ...

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, constraints: list[ActionTrie | None] | None = None
    ) -> list[Generation]:
        """Sample one continuation per prompt; ``constraints``: per prompt, the trie of the
        responses it is restricted to (None: free)."""
        ...

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Final-layer hidden states [B, T, H] of right-padded ``input_ids`` [B, T]."""
        ...

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head: hidden [..., H] -> logits [..., V]."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` with special tokens removed."""
        ...

    def decode_tokens(self, token_ids: list[int]) -> list[str]:
        """Text of each token id alone (for segmenting at paragraph breaks)."""
        ...

    def weights_changed(self) -> None:
        """Forget what was computed with ``model``'s old weights (the prefix cache's keys
        and values); call whenever they change."""
        ...

    def sync_weights(self) -> float:
        """Make ``generate`` sample from ``model``'s current weights (call after each
        learner step); returns the seconds taken (0.0 when they share the weights)."""
        ...

    def release_memory(self) -> float:
        """Free what sampling holds until the next ``sync_weights`` (a rollout engine's
        weights and cache, between the rollout and the learner); returns the seconds taken."""
        ...


# Backend name -> "module:class", imported on use: vllm is absent from the main environment.
BACKENDS: dict[str, str] = {
    "hf": "hp_agent.policies.hf:HFPolicy",
    "vllm": "hp_agent.policies.vllm:VLLMPolicy",
}


def load_policy(
    name: str,
    dtype: str = "auto",
    device: str = "auto",
    enable_thinking: bool = False,
    backend: str = "hf",
    prefix_cache_tokens: int | None = None,
    backend_options: dict | None = None,
) -> Policy:
    """Load a policy from ``tiny``, a local folder, a run folder or a hub id.

    ``device`` and ``dtype``: ``auto`` is CUDA and bfloat16 where torch sees a GPU, else
    the CPU and float32 (:mod:`hp_agent.devices`); a device not on this machine is a
    one-line :class:`~hp_agent.errors.UserValueError`, raised before anything loads.

    ``backend``: a key of :data:`BACKENDS`. ``"vllm"`` raises ImportError, with the
    command that builds its environment, where the ``vllm`` package is missing.
    ``prefix_cache_tokens``: the hf backend's prefix-cache budget (None: its default).
    ``backend_options``: further arguments of the backend's class (vllm: ``model.vllm``).
    """
    from importlib import import_module

    from hp_agent.devices import check_device, resolve_device, resolve_dtype
    from hp_agent.policies.resolve import resolve_model
    from hp_agent.run_folder import model_source

    if backend not in BACKENDS:
        raise ValueError(f"unknown policy backend {backend!r}; valid backends: {', '.join(sorted(BACKENDS))}")
    module_name, _, class_name = BACKENDS[backend].partition(":")
    policy_class = getattr(import_module(module_name), class_name)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    check_device(device)
    options = {} if prefix_cache_tokens is None else {"prefix_cache_tokens": prefix_cache_tokens}
    options.update(backend_options or {})
    return policy_class(
        resolve_model(model_source(name)), dtype=dtype, device=device, enable_thinking=enable_thinking, **options
    )


@dataclass(frozen=True)
class LoadOptions:
    """How a command loads its model, beside the model's name: where, in which dtype, on
    which backend (the keys of a run's ``model`` section that ``load_policy`` takes)."""

    device: str = "auto"
    dtype: str = "auto"
    backend: str = "hf"
    enable_thinking: bool = False
    prefix_cache_tokens: int | None = None
    backend_options: dict | None = field(default=None, hash=False)

    @classmethod
    def from_model_config(cls, model: ModelConfig, device: str | None = None) -> LoadOptions:
        """A run's ``model`` section; ``device``: this rank's own (``cuda:<local_rank>``)."""
        return cls(device or model.device, model.dtype, model.backend, model.enable_thinking, model.prefix_cache_tokens,
                   model.vllm.model_dump() if model.backend == "vllm" else None)

    def sampling_up_to(self, tokens: int) -> LoadOptions:
        """These options for rollouts whose sequences reach at most ``tokens`` tokens
        (:func:`hp_agent.rollout.sampled_tokens_bound`): the vllm engine's default
        ``max_model_len``; the hf backend needs no bound."""
        if self.backend != "vllm":
            return self
        return replace(self, backend_options={**(self.backend_options or {}), "context_tokens": tokens})

    def load(self, name: str) -> Policy:
        return load_policy(name, self.dtype, self.device, self.enable_thinking, self.backend, self.prefix_cache_tokens,
                           self.backend_options)


__all__ = ["BACKENDS", "Generation", "LoadOptions", "Policy", "SamplingParams", "load_policy"]
