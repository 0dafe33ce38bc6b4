"""Prefix (KV-cache) reuse for the transformers backend.

Turn k+1 of an episode often starts with the tokens of turn k's prompt and answer: with
``rollout.chat_history`` the whole conversation so far is the prompt, and even
observation-only prompts share the system prompt and task header. :class:`PrefixCache`
keeps the keys and values computed for recent sequences (prompt + sampled answer), so
that :meth:`HFPolicy.generate <hp_agent.policies.hf.HFPolicy.generate>` computes only the
part of a new prompt that no earlier sequence began with.

Keys and values belong to one set of weights, so whoever changes the weights says so:
:meth:`HFPolicy.weights_changed <hp_agent.policies.hf.HFPolicy.weights_changed>` empties
the cache; :meth:`TrainModel.publish <hp_agent.parallel.TrainModel.publish>` calls it
after every learner step (and after loading a separate training copy's checkpoint), and
so does ``sync_weights``. The parameters' version counters are a second line of defence
only (:meth:`PrefixCache.check_weights`, one integer read per parameter): a ``.data``
write or a fused optimizer step (``AdamW(fused=True)``) changes a weight in place
without moving its counter, and the stale keys then shifted the scorer's log-probs
(by 0.076 in issue 24).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from transformers.cache_utils import Cache, DynamicLayer


@dataclass(eq=False)  # entries are compared by identity
class CachedSequence:
    """Keys and values of every token of ``token_ids``, per layer [kv_heads, len, head_dim]."""

    token_ids: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    block_hashes: list[int] = field(default_factory=list)  # set by PrefixCache.store

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


def block_hashes(tokens: Sequence[int], block_tokens: int) -> list[int]:
    """Chained hashes of the full blocks of ``tokens``: hash i stands for ``tokens[: block_tokens * (i + 1)]``."""
    hashes, previous = [], 0
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        previous = hash((previous, *tokens[start : start + block_tokens]))
        hashes.append(previous)
    return hashes


class PrefixCache:
    """Recently used sequences' keys and values, at most ``max_tokens`` tokens in all.

    The least recently used sequence goes first when the budget is exceeded; a sequence
    that a newer one extends is dropped at once (the newer one holds all it held).
    ``max_tokens=0`` turns reuse off. Sequences are found through chained hashes of
    their ``block_tokens``-token blocks (as vLLM's prefix cache finds its blocks), so a
    lookup costs one hash per block of the prompt, not a comparison with every entry; a
    match is then checked token by token, so hash collisions cannot give wrong keys.
    Reuse is found in whole blocks: up to ``block_tokens - 1`` reusable tokens may be run again.
    """

    def __init__(self, max_tokens: int, block_tokens: int = 16):
        if max_tokens < 0:
            raise ValueError(f"prefix cache size must be >= 0 tokens, got {max_tokens}")
        self.max_tokens, self.block_tokens = max_tokens, block_tokens
        self._recency: dict[int, CachedSequence] = {}  # id -> sequence, least recently used first
        self._by_block: dict[int, list[CachedSequence]] = {}  # block hash -> sequences holding that prefix
        self._by_end: dict[int, list[CachedSequence]] = {}  # hash of the last full block (0: none) -> sequences
        self._version: int | None = None
        self.num_tokens = 0

    @property
    def entries(self) -> list[CachedSequence]:
        return list(self._recency.values())

    def clear(self) -> None:
        self.num_tokens = 0
        self._recency.clear()
        self._by_block.clear()
        self._by_end.clear()

    def check_weights(self, model: torch.nn.Module) -> None:
        """Empty the cache if ``model``'s version counters moved since it was last filled
        (a backstop: writes through ``.data`` or fused optimizers do not move them)."""
        version = weights_version(model)
        if version != self._version:
            self.clear()
            self._version = version

    def _deepest(self, hashes: list[int]) -> CachedSequence | None:
        """The most recent sequence sharing the most leading blocks with ``hashes``."""
        found = None
        for block_hash in hashes:
            holders = self._by_block.get(block_hash)
            if not holders:
                break
            found = holders[-1]
        return found

    def _touch(self, entry: CachedSequence) -> None:
        self._recency[id(entry)] = self._recency.pop(id(entry))

    def lookup(self, prompt: Sequence[int]) -> tuple[CachedSequence | None, int]:
        """The cached sequence sharing the longest prefix with ``prompt``, and how many of
        its tokens to reuse: at most ``len(prompt) - 1``, since the last prompt token must
        be run to give the first next-token distribution."""
        if not self._recency or len(prompt) < 2:
            return None, 0
        best = self._deepest(block_hashes(prompt, self.block_tokens))
        if best is None:
            return None, 0
        self._touch(best)
        return best, min(best.common_prefix(torch.tensor(prompt)), len(prompt) - 1)

    def store(self, entry: CachedSequence) -> None:
        if not 0 < len(entry) <= self.max_tokens:
            return
        entry.block_hashes = block_hashes(entry.token_ids.tolist(), self.block_tokens)
        holder = self._deepest(entry.block_hashes)
        if holder is not None and holder.common_prefix(entry.token_ids) == len(entry):
            return  # an existing sequence already holds all of this one
        for block_hash in [0, *entry.block_hashes]:  # sequences this one extends end in one of its blocks
            for old in list(self._by_end.get(block_hash, [])):
                if len(old) <= len(entry) and old.common_prefix(entry.token_ids) == len(old):
                    self._remove(old)
        self._recency[id(entry)] = entry
        self.num_tokens += len(entry)
        for block_hash in entry.block_hashes:
            self._by_block.setdefault(block_hash, []).append(entry)
        self._by_end.setdefault(entry.block_hashes[-1] if entry.block_hashes else 0, []).append(entry)
        while self.num_tokens > self.max_tokens:
            self._remove(next(iter(self._recency.values())))

    def _remove(self, entry: CachedSequence) -> None:
        del self._recency[id(entry)]
        self.num_tokens -= len(entry)
        end = entry.block_hashes[-1] if entry.block_hashes else 0
        for index, block_hash in [*((self._by_block, h) for h in entry.block_hashes), (self._by_end, end)]:
            index[block_hash].remove(entry)
            if not index[block_hash]:
                del index[block_hash]


class PreallocatedLayer(DynamicLayer):
    """A cache layer that writes new keys and values into buffers of ``capacity`` slots
    instead of concatenating them (transformers' ``DynamicLayer`` copies the whole cache
    at every decode step). ``keys``/``values`` are views of the filled slots; a buffer
    that fills up doubles."""

    is_croppable = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity  # slots of the first buffers

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.fill([states.new_empty((*states.shape[:-2], self.capacity, states.shape[-1])) for states in (key_states, value_states)], 0)

    def fill(self, buffers: list[torch.Tensor], length: int) -> PreallocatedLayer:
        """Take ``buffers`` ([keys, values]) whose first ``length`` slots are filled."""
        self.dtype, self.device, self.is_initialized = buffers[0].dtype, buffers[0].device, True
        self.buffers = buffers
        self.keys, self.values = (buffer[..., :length, :] for buffer in buffers)
        return self

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.buffers[0].shape[-2]:
            self.buffers = [_grown(buffer, start, 2 * end) for buffer in self.buffers]
        for buffer, states in zip(self.buffers, (key_states, value_states)):
            buffer[..., start:end, :] = states
        self.fill(self.buffers, end)
        return self.keys, self.values


def _grown(buffer: torch.Tensor, filled: int, capacity: int) -> torch.Tensor:
    grown = buffer.new_empty((*buffer.shape[:-2], capacity, buffer.shape[-1]))
    grown[..., :filled, :] = buffer[..., :filled, :]
    return grown


def batch_past(hits: Sequence[tuple[CachedSequence | None, int]], new_tokens: int = 0,
               empty: Callable[[int, int], list[list[torch.Tensor]]] | None = None) -> tuple[Cache, int]:
    """A batched cache holding row i's reused keys and values right-aligned in ``width``
    slots (the slots before them are padding for the attention mask to hide; zeros, since
    a masked value still enters attention times 0), with room for ``new_tokens`` more;
    returns it and ``width``, the longest reuse. Nothing reused: ``empty(rows, capacity)``
    gives every layer's zeroed [keys, values] buffers, or without it the buffers are made
    on the first pass (which must then fill every slot)."""
    width = max(reused for _, reused in hits)
    capacity = width + new_tokens
    if width == 0:
        if empty is None:
            return Cache(layer_class_to_replicate=partial(PreallocatedLayer, capacity)), 0
        return Cache(layers=[PreallocatedLayer(capacity).fill(buffers, 0) for buffers in empty(len(hits), capacity)]), 0
    template = next(entry for entry, reused in hits if reused)
    layers = []
    for layer in range(len(template.keys)):
        stored = (template.keys[layer], template.values[layer])
        buffers = [s.new_zeros((len(hits), s.shape[0], capacity, s.shape[-1])) for s in stored]
        for row, (entry, reused) in enumerate(hits):
            if reused:
                buffers[0][row, :, width - reused : width] = entry.keys[layer][:, :reused]
                buffers[1][row, :, width - reused : width] = entry.values[layer][:, :reused]
        layers.append(PreallocatedLayer(capacity).fill(buffers, width))
    return Cache(layers=layers), width


def row_sequence(cache: Cache, row: int, slots: torch.Tensor, token_ids: Sequence[int]) -> CachedSequence:
    """Row ``row``'s keys and values at cache ``slots`` (one per token of ``token_ids``)."""
    slots = slots.to(cache.layers[0].keys.device)
    return CachedSequence(
        token_ids=torch.tensor(token_ids),
        keys=[layer.keys[row].index_select(1, slots) for layer in cache.layers],
        values=[layer.values[row].index_select(1, slots) for layer in cache.layers],
    )
