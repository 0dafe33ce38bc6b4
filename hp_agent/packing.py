"""Packed forward passes: token sequences that share prefixes, each prefix computed once.

Hindsight scoring runs, per turn, the causal sequence ``prompt + action`` and, per segment,
the hindsight sequence ``prompt' + action[:end]``, where ``prompt'`` is the same chat with
the privileged block appended to the last user message. The two agree token for token up
to where the block goes in (their longest common prefix), so that part needs computing
only once; turns of a chat-history rollout share prefixes too. The learner packs the same
way, with gradients (``learner.packed``): a GRPO group's G sequences share their prompt,
which then runs once, its gradient the sum over the G, as G separate passes give it.

A row of a packed batch is a prefix tree (trie) of sequences: each distinct prefix is one
node, stored once. Token i attends to itself and its ancestors only (a 4-D attention
mask) and sits at its depth (explicit ``position_ids``), so it sees exactly the
context, at the same positions, that it has in its own sequence: its hidden state is that
of a plain forward pass of the sequence, up to float summation order.

    sequences  a b c X Y        row  a b c X Y Z W      positions 0 1 2 3 4 3 4
               a b c Z W   ->   (Z attends a b c Z; never X Y)

A sequence's opening may come from a :class:`~hp_agent.policies.prefix_cache.PrefixCache`
instead (a turn's prompt, kept from its rollout): its keys and values are passed as past
keys and values, and only the rest of the sequence is packed and run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hp_agent.batching import token_budget_batches
from hp_agent.errors import UserValueError
from hp_agent.policies.attention import DECODE_SDPA
from hp_agent.policies.prefix_cache import CachedSequence, PrefixCache, batch_past

# Attention implementations that apply a custom 4-D mask to the attention scores
# (transformers' masking_utils returns a 4-D mask as is; flash-attention would ignore it).
MASKED_ATTENTION = ("eager", "sdpa", DECODE_SDPA)


@dataclass(frozen=True)
class PackingRule:
    """How a caller packs. ``keep_prompts``: a sequence also joins a row that holds all of it
    before its span, its prompt (:func:`pack_sequences`' ``prompts``). ``off_switch``: the
    config override that runs the caller unpacked, named in the error for a model whose
    attention cannot take a packed row's mask."""

    keep_prompts: bool
    off_switch: str


# Hindsight scoring: a turn's views share the prompt before the privileged block only.
SCORING = PackingRule(False, "hindsight.packed=false")
# The learner: a GRPO group's answers stay with their prompt even where each is longer
# than it (63-token math prompts with 64-token answers packed nothing without this), so
# the prompt runs once, not G times. Different prompts that share only the chat template's
# opening stay in rows of their own: packed into one row of 8 (31 of some 130 tokens
# shared), they ran 25% fewer tokens but took 1.19x the time on this CPU (dense mask).
TRAINING = PackingRule(True, "learner.packed=false")


@dataclass
class PackedRow:
    """One row: a prefix tree of token sequences, nodes numbered in insertion order.

    token_ids: token of each node.
    positions: depth of each node, i.e. its position in every sequence that passes through it.
    branches:  ``(ancestors, start, count)``: nodes ``start .. start + count - 1`` are a chain
               added below the path ``ancestors`` (the nodes of the prefix it shares).
    """

    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    branches: list[tuple[list[int], int, int]] = field(default_factory=list)
    _children: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)  # (parent or -1, token) -> node

    def __len__(self) -> int:
        return len(self.token_ids)

    def shared_path(self, sequence: Sequence[int]) -> list[int]:
        """Nodes of the longest prefix of ``sequence`` already in the row."""
        path: list[int] = []
        parent = -1
        for token in sequence:
            node = self._children.get((parent, token))
            if node is None:
                break
            path.append(node)
            parent = node
        return path

    def insert(self, sequence: Sequence[int]) -> list[int]:
        """Add ``sequence``; returns the node of each of its tokens."""
        path = self.shared_path(sequence)
        start, shared = len(self.token_ids), len(path)
        parent = path[-1] if path else -1
        for offset, token in enumerate(sequence[shared:]):
            self._children[(parent, token)] = parent = start + offset
        self.token_ids.extend(sequence[shared:])
        self.positions.extend(range(shared, len(sequence)))
        if len(sequence) > shared:
            self.branches.append((path, start, len(sequence) - shared))
        return path + list(range(start, start + len(sequence) - shared))


def pack_sequences(sequences: Sequence[Sequence[int]], max_tokens: int,
                   prompts: Sequence[int] | None = None) -> tuple[list[PackedRow], list[tuple[int, list[int]]]]:
    """Pack ``sequences`` into prefix-tree rows of at most ``max_tokens`` nodes.

    Sequences are taken in lexicographic order, so that those with a common prefix are
    neighbours. A sequence joins the current row when the row already holds at least as
    many of its tokens as it adds, or (with ``prompts``) its first ``prompts[i]`` tokens,
    and the row stays within ``max_tokens``; otherwise it starts a new row (a sequence
    longer than ``max_tokens`` gets a row of its own). Why not fill rows regardless:
    attention over a row costs O(length^2) with a dense mask, so packing sequences that
    share little costs more than it saves (filling rows of 2,048 to 8,192 tokens made CPU
    scoring of 30-turn ALFWorld-like trajectories 1.1 to 2.5 times slower than the
    per-segment reference). Returns the rows and, per sequence, ``(row index, node of
    each token)``.

    >>> rows, where = pack_sequences([[1, 2, 3, 4], [1, 2, 3, 5, 6], [9]], max_tokens=8)
    >>> [row.token_ids for row in rows], where
    ([[1, 2, 3, 4, 5, 6], [9]], [(0, [0, 1, 2, 3]), (0, [0, 1, 2, 4, 5]), (1, [0])])
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rows: list[PackedRow] = []
    placements: list[tuple[int, list[int]] | None] = [None] * len(sequences)
    for index in sorted(range(len(sequences)), key=lambda i: sequences[i]):
        sequence = sequences[index]
        shared = len(rows[-1].shared_path(sequence)) if rows else 0
        added = len(sequence) - shared
        joins = shared >= added or (prompts is not None and shared >= prompts[index] > 0)
        if not rows or not joins or len(rows[-1]) + added > max_tokens:
            rows.append(PackedRow())
        placements[index] = (len(rows) - 1, rows[-1].insert(sequence))
    return rows, placements  # type: ignore[return-value]


def tree_mask(row: PackedRow, width: int) -> torch.Tensor:
    """Attention mask [width, width], True where node i may attend node j.

    Node i attends itself and its ancestors. Padding nodes (``len(row)`` and beyond)
    attend themselves only: a query row with every key masked would give NaN, and NaN
    values leak through later layers' masked keys (0 * NaN = NaN).
    """
    allowed = torch.zeros(width, width, dtype=torch.bool)
    for ancestors, start, count in row.branches:
        stop = start + count
        if ancestors:
            allowed[start:stop, torch.tensor(ancestors)] = True
        allowed[start:stop, start:stop] = torch.ones(count, count, dtype=torch.bool).tril()
    padding = torch.arange(len(row), width)
    allowed[padding, padding] = True
    return allowed


def check_masked_attention(model: torch.nn.Module, off_switch: str) -> None:
    """Refuse a model whose attention would ignore a packed row's tree mask (and so let
    tokens see other sequences' tokens). ``off_switch``: the caller's config override that
    runs it unpacked (``hindsight.packed=false``, ``learner.packed=false``), named in the error."""
    config = model.config
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in MASKED_ATTENTION:
        raise UserValueError(
            f"packed forward passes need attention that takes a custom 4-D mask ({', '.join(MASKED_ATTENTION)}), "
            f"but the model uses {implementation!r}; load it with attn_implementation='sdpa', "
            f"or run unpacked ({off_switch})"
        )
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise UserValueError(
            f"packed forward passes build full-attention masks, but the model has layer types {sorted(layer_types)}; "
            f"run unpacked ({off_switch})"
        )


Past = tuple[CachedSequence | None, int]  # a cached sequence and how many of its tokens a row reuses


def _pack_after_cached_openings(
    sequences: Sequence[Sequence[int]],
    spans: Sequence[tuple[int, int]],
    max_tokens: int,
    keep_prompts: bool,
    prefix_cache: PrefixCache | None,
) -> tuple[list[tuple[PackedRow, Past]], list[tuple[int, list[int]]]]:
    """Rows of what remains of each sequence once the opening the cache holds is cut off
    (``keep_prompts``: see :class:`PackingRule`).

    Sequences that reuse the same cached opening (e.g. a turn's hindsight sequences, all
    after its prompt) are packed together (:func:`pack_sequences`, node depths counted
    from the end of the opening); sequences with nothing cached are packed whole. A
    sequence never reuses the token before its span: that token's hidden state is needed.
    Returns rows with their past, and per sequence ``(row index, node of each remaining token)``.
    """
    hits = [
        prefix_cache.lookup(sequence[:start]) if prefix_cache is not None else (None, 0)
        for sequence, (start, _) in zip(sequences, spans)
    ]
    groups: dict[tuple[int, int], list[int]] = {}
    for index, (entry, reused) in enumerate(hits):
        groups.setdefault((id(entry), reused), []).append(index)
    rows: list[tuple[PackedRow, Past]] = []
    placements: list[tuple[int, list[int]] | None] = [None] * len(sequences)
    for indices in groups.values():
        past = hits[indices[0]]
        prompts = [spans[i][0] - past[1] for i in indices] if keep_prompts else None
        group_rows, group_placements = pack_sequences([sequences[i][past[1] :] for i in indices], max_tokens, prompts)
        for index, (row, nodes) in zip(indices, group_placements):
            placements[index] = (len(rows) + row, nodes)
        rows += [(row, past) for row in group_rows]
    return rows, placements  # type: ignore[return-value]


def _row_members(placements: Sequence[tuple[int, list[int]]], num_rows: int) -> list[list[int]]:
    """The sequences each row holds."""
    members: list[list[int]] = [[] for _ in range(num_rows)]
    for index, (row, _) in enumerate(placements):
        members[row].append(index)
    return members


def packed_batches(sequences: Sequence[Sequence[int]], spans: Sequence[tuple[int, int]], max_tokens: int,
                   rule: PackingRule) -> list[list[int]]:
    """Indices of ``sequences`` per packed forward pass of at most ``max_tokens`` tokens
    (padding included), packed as :func:`packed_span_hidden_states` packs them, a row's
    sequences always in one pass: the packed counterpart of
    :func:`hp_agent.batching.token_budget_batches`, for a caller that forms passes before
    it runs them (the learner's micro-batches).

    >>> packed_batches([[1, 2, 3, 4, 5], [1, 2, 3, 6, 7], [9, 9, 9]], [(3, 5), (3, 5), (1, 3)], max_tokens=7,
    ...                rule=TRAINING)
    [[0, 1], [2]]
    """
    prompts = [start for start, _ in spans] if rule.keep_prompts else None
    rows, placements = pack_sequences(sequences, max_tokens, prompts)
    members = _row_members(placements, len(rows))
    return [[i for r in batch for i in members[r]] for batch in token_budget_batches([len(row) for row in rows], max_tokens)]


def _packed_mask(rows: Sequence[tuple[PackedRow, Past]], width: int, past_width: int, implementation: str,
                 dtype: torch.dtype) -> torch.Tensor:
    """The 4-D mask [rows, 1, width, past_width + width] of one packed pass: each row's
    tree mask, its reused opening visible to all its nodes. Boolean for sdpa, which takes
    it whatever the query's dtype (a float mask must match a bf16 query's dtype on some
    kernels, and under autocast or FSDP2's bf16 weights that is not the weights'); eager
    attention adds its mask to the scores, so it gets the additive form in ``dtype``."""
    allowed = torch.zeros((len(rows), 1, width, past_width + width), dtype=torch.bool)
    for b, (row, (_, reused)) in enumerate(rows):
        allowed[b, 0, :, past_width:] = tree_mask(row, width)
        allowed[b, 0, : len(row), past_width - reused : past_width] = True  # the reused opening: everyone's ancestors
    if implementation != "eager":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))


def packed_span_hidden_states(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    spans: Sequence[tuple[int, int]],
    max_tokens: int | None,
    pad_id: int,
    rule: PackingRule,
    prefix_cache: PrefixCache | None = None,
) -> list[torch.Tensor]:
    """Like :func:`hp_agent.batching.span_hidden_states`, with shared prefixes computed once.

    ``model``: a transformers causal LM (its decoder runs). Sequences are packed into
    prefix-tree rows (:func:`pack_sequences`), and rows into forward passes, of at most
    ``max_tokens`` tokens (padding included); ``max_tokens`` None: all in one pass (the
    learner's micro-batch, sized by :func:`packed_batches`). Returns, for ``spans[i] = (a,
    b)``, the hidden states [b - a, H] that predict ``sequences[i][a:b]``. With
    ``prefix_cache`` (no grad: cached keys and values carry none), a sequence whose
    opening the cache holds, e.g. a turn's prompt kept from its rollout, runs only the
    rest. Runs under the caller's grad mode: the scorer calls it without gradients, the
    learner with, and then a shared prompt's gradient is the sum over the sequences that
    share it, as in separate passes. ``rule``: the caller's :class:`PackingRule`.
    """
    for (start, end), sequence in zip(spans, sequences, strict=True):
        if not 1 <= start <= end <= len(sequence):
            raise ValueError(f"span [{start}, {end}) does not fit a sequence of {len(sequence)} tokens after its first")
    check_masked_attention(model, rule.off_switch)
    decoder = model.get_decoder()
    parameter = next(model.parameters())
    if prefix_cache is not None:
        prefix_cache.check_weights(model)
    # One pass: no row needs more than all the tokens.
    row_tokens = max_tokens if max_tokens is not None else max(1, sum(len(s) for s in sequences))
    rows, placements = _pack_after_cached_openings(sequences, spans, row_tokens, rule.keep_prompts, prefix_cache)
    members = _row_members(placements, len(rows))
    lengths = [len(row) for row, _ in rows]
    passes = token_budget_batches(lengths, max_tokens) if max_tokens is not None else [list(range(len(rows)))]
    out: list[torch.Tensor | None] = [None] * len(sequences)
    for batch in passes:
        width = max(lengths[r] for r in batch)
        past, past_width = batch_past([rows[r][1] for r in batch], new_tokens=width)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        position_ids = torch.zeros((len(batch), width), dtype=torch.long)
        for b, r in enumerate(batch):
            row, (_, reused) = rows[r]
            input_ids[b, : len(row)] = torch.tensor(row.token_ids)
            position_ids[b, : len(row)] = torch.tensor(row.positions) + reused
        mask = _packed_mask([rows[r] for r in batch], width, past_width, model.config._attn_implementation, parameter.dtype)
        hidden = decoder(
            input_ids=input_ids.to(parameter.device),
            attention_mask=mask.to(parameter.device),
            position_ids=position_ids.to(parameter.device),
            past_key_values=past if past_width else None,
            use_cache=False,
        ).last_hidden_state
        for b, r in enumerate(batch):
            reused = rows[r][1][1]
            for index in members[r]:
                start, end = spans[index]
                nodes = placements[index][1][start - 1 - reused : end - 1 - reused]  # position i predicts token i + 1
                out[index] = hidden[b, torch.tensor(nodes, dtype=torch.long, device=hidden.device)]
    return out  # type: ignore[return-value]
