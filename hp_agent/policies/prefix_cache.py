"""Prefix (KV-cache) reuse for the transformers backend.

Turn k+1 of an episode often starts with the tokens of turn k's prompt and answer: with
``rollout.chat_history`` the whole conversation so far is the prompt, and even
observation-only prompts share the system prompt and task header. :class:`PrefixCache`
keeps the keys and values computed for recent sequences (prompt + sampled answer), so
that :meth:`HFPolicy.generate <hp_agent.policies.hf.HFPolicy.generate>` computes only the
part of a new prompt that no earlier sequence began with.

Keys and values belong to one set of weights: the cache empties itself when any
parameter of the model has changed in place since it was filled (an optimizer step, a
``load_state_dict``), which torch records in each tensor's version counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(eq=False)  # entries are compared by identity
class CachedSequence:
    """Keys and values of every token of ``token_ids``, per layer [kv_heads, len, head_dim]."""

    token_ids: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def __len__(self) -> int:
        return len(self.token_ids)

    def common_prefix(self, tokens: torch.Tensor) -> int:
        """Length of the longest common prefix of this sequence and ``tokens``."""
        length = min(len(self.token_ids), len(tokens))
        differs = (self.token_ids[:length] != tokens[:length]).nonzero()
        return int(differs[0]) if len(differs) else length


def weights_version(model: torch.nn.Module) -> int:
    """Sum of the parameters' in-place version counters: changes whenever a weight does."""
    return sum(parameter._version for parameter in model.parameters())


class PrefixCache:
    """Recently used sequences' keys and values, at most ``max_tokens`` tokens in all.

    The least recently used sequence goes first when the budget is exceeded; a sequence
    that a newer one extends is dropped at once (the newer one holds all it held).
    ``max_tokens=0`` turns reuse off.
    """

    def __init__(self, max_tokens: int):
        if max_tokens < 0:
            raise ValueError(f"prefix cache size must be >= 0 tokens, got {max_tokens}")
        self.max_tokens = max_tokens
        self.entries: list[CachedSequence] = []  # least recently used first
        self._version: int | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(entry) for entry in self.entries)

    def clear(self) -> None:
        self.entries.clear()

    def check_weights(self, model: torch.nn.Module) -> None:
        """Empty the cache if ``model``'s weights changed since it was last filled."""
        version = weights_version(model)
        if version != self._version:
            self.clear()
            self._version = version

    def lookup(self, prompt: Sequence[int]) -> tuple[CachedSequence | None, int]:
        """The cached sequence sharing the longest prefix with ``prompt``, and how many of
        its tokens to reuse: at most ``len(prompt) - 1``, since the last prompt token must
        be run to give the first next-token distribution."""
        if not self.entries or len(prompt) < 2:
            return None, 0
        tokens = torch.tensor(prompt)
        best, shared = None, 0
        for entry in self.entries:
            common = entry.common_prefix(tokens)
            if common > shared:
                best, shared = entry, common
        if best is None:
            return None, 0
        self.entries.remove(best)
        self.entries.append(best)  # most recently used
        return best, min(shared, len(prompt) - 1)

    def store(self, entry: CachedSequence) -> None:
        if not 0 < len(entry) <= self.max_tokens:
            return
        kept = []
        for old in self.entries:
            common = old.common_prefix(entry.token_ids)
            if common == len(entry):  # an existing sequence already holds all of this one
                return
            if common < len(old):  # not a prefix of the new sequence
                kept.append(old)
        self.entries = kept + [entry]
        while self.num_tokens > self.max_tokens:
            self.entries.pop(0)


def batch_past(hits: Sequence[tuple[CachedSequence | None, int]]) -> tuple[DynamicCache, int]:
    """A batched cache holding row i's reused keys and values right-aligned in ``width``
    slots (the slots before them are padding for the attention mask to hide); returns it
    and ``width``, the longest reuse."""
    width = max(reused for _, reused in hits)
    if width == 0:
        return DynamicCache(), 0
    template = next(entry for entry, reused in hits if reused)
    layers = []
    for layer in range(len(template.keys)):
        keys = template.keys[layer].new_zeros((len(hits), *template.keys[layer].shape[:1], width, template.keys[layer].shape[-1]))
        values = torch.zeros_like(keys)
        for row, (entry, reused) in enumerate(hits):
            if reused:
                keys[row, :, width - reused :] = entry.keys[layer][:, :reused]
                values[row, :, width - reused :] = entry.values[layer][:, :reused]
        layers.append((keys, values))
    return DynamicCache(ddp_cache_data=layers), width


def row_sequence(cache: DynamicCache, row: int, slots: torch.Tensor, token_ids: Sequence[int]) -> CachedSequence:
    """Row ``row``'s keys and values at cache ``slots`` (one per token of ``token_ids``)."""
    slots = slots.to(cache.layers[0].keys.device)
    return CachedSequence(
        token_ids=torch.tensor(token_ids),
        keys=[layer.keys[row].index_select(1, slots) for layer in cache.layers],
        values=[layer.values[row].index_select(1, slots) for layer in cache.layers],
    )
