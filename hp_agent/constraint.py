"""Decoding restricted to admissible actions: the allowed next tokens, and the model's
distribution renormalized over them (DESIGN.md, "Restricted decoding").

Where an env lists its admissible actions, each turn's response may be made to be
exactly one of them, as token ids: the token sequences of the admissible responses (each
ending with the end-of-turn token) form a prefix tree, and at every position only the
tokens that continue some admissible response are allowed. The distribution at that
position is the model's softmax over the allowed tokens alone,

    pi_c(y_j | .) = exp(z_j) / sum_{k in A_j} exp(z_k),   A_j = allowed after y_<j,

which is ``log_softmax(restrict_logits(z, A_j))``. The sampler's behaviour log-probs,
both views of hindsight scoring (JSD between the two restricted distributions, over the
same A_j) and the learner's log-probs must all use it, so that ratios and weights stay
exact: each turn therefore records its A_j per token (:meth:`ActionTrie.allowed_per_token`).

These are pure functions; the backends and the scorer call them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

# Per token of a sequence, the token ids decoding could choose from there (None: any).
Allowed = Sequence[Sequence[int] | None]


class ActionTrie:
    """A prefix tree over the token-id sequences of the admissible responses.

    >>> trie = ActionTrie([[5, 6, 2], [5, 7, 2], [8, 2]])
    >>> trie.allowed_after([]), trie.allowed_after([5]), trie.allowed_after([5, 7, 2])
    ([5, 8], [6, 7], [])
    """

    def __init__(self, sequences: Sequence[Sequence[int]]):
        if not sequences or any(len(s) == 0 for s in sequences):
            raise ValueError("an action trie needs at least one admissible response, each of at least one token")
        self.sequences = [[int(token) for token in sequence] for sequence in sequences]
        self.root: dict[int, dict] = {}
        for sequence in sequences:
            node = self.root
            for token in sequence:
                node = node.setdefault(int(token), {})

    def _node(self, prefix: Sequence[int]) -> dict[int, dict]:
        node = self.root
        for position, token in enumerate(prefix):
            if int(token) not in node:
                raise ValueError(f"token {int(token)} at position {position} continues no admissible response")
            node = node[int(token)]
        return node

    @classmethod
    def of_responses(cls, responses: Sequence[str], encode: Callable[[str], list[int]], end_of_turn: int) -> ActionTrie:
        """The trie of ``responses`` (texts), each encoded and ended with ``end_of_turn``."""
        return cls([encode(response) + [end_of_turn] for response in responses])

    def allowed_after(self, prefix: Sequence[int]) -> list[int]:
        """The tokens that may follow ``prefix`` (sorted; empty once a response is complete)."""
        return sorted(self._node(prefix))

    def allowed_per_token(self, token_ids: Sequence[int]) -> list[list[int]]:
        """A_j for every token of a sampled response: what was allowed where it was sampled."""
        allowed, node = [], self.root
        for position, token in enumerate(token_ids):
            if int(token) not in node:
                raise ValueError(f"token {int(token)} at position {position} continues no admissible response")
            allowed.append(sorted(node))
            node = node[int(token)]
        return allowed


def allowed_mask(allowed: Allowed, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[T, V] bool: True where row t's token is allowed; a row given as None allows every token."""
    mask = torch.zeros(len(allowed), vocab_size, dtype=torch.bool, device=device)
    for row, tokens in enumerate(allowed):
        if tokens is None:
            mask[row] = True
        else:
            mask[row, torch.as_tensor(list(tokens), dtype=torch.long, device=device)] = True
    return mask


def restrict_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` [T, V] with -inf where ``mask`` [T, V] is False: their softmax is the
    model's distribution renormalized over the allowed tokens.

    >>> restrict_logits(torch.zeros(1, 3), torch.tensor([[True, False, True]])).log_softmax(-1).exp()
    tensor([[0.5000, 0.0000, 0.5000]])
    """
    if not mask.any(dim=-1).all():
        raise ValueError("every row needs at least one allowed token")
    return logits.masked_fill(~mask, float("-inf"))


def joined_allowed(runs: Iterable[tuple[Allowed | None, int]]) -> list[Sequence[int] | None] | None:
    """The allowed sets of token runs laid end to end, each run given as (its sets, or None
    for ``length`` free tokens); None when every run is free."""
    runs = list(runs)
    if all(sets is None for sets, _ in runs):
        return None
    return [tokens for sets, length in runs for tokens in (sets if sets is not None else [None] * length)]


def restrict_chunk(logits: torch.Tensor, allowed: Allowed | None, start: int) -> torch.Tensor:
    """``logits`` [n, V] of tokens ``start .. start + n`` of a sequence whose per-token
    allowed sets are ``allowed``, restricted to them (unchanged where ``allowed`` is None
    or every row of the chunk allows any token)."""
    if allowed is None:
        return logits
    rows = allowed[start : start + logits.shape[0]]
    if all(tokens is None for tokens in rows):
        return logits
    return restrict_logits(logits, allowed_mask(rows, logits.shape[-1], logits.device))


class TrieWalk:
    """Where each row of a batch being sampled stands in its trie (None: an unconstrained row).

    ``allowed[row]`` collects A_j for every token the row samples (None for a free row), the
    record that scoring and the learner restrict the same distributions with.
    """

    def __init__(self, tries: Sequence[ActionTrie | None]):
        self.nodes: list[dict[int, dict] | None] = [None if trie is None else trie.root for trie in tries]
        self.allowed: list[list[list[int] | None] | None] = [None if trie is None else [] for trie in tries]

    def mask(self, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """[B, V] bool of the tokens each row may sample next (a finished or free row: all)."""
        rows = [None if node is None or not node else sorted(node) for node in self.nodes]
        for record, tokens in zip(self.allowed, rows):
            if record is not None:
                record.append(tokens)
        return allowed_mask(rows, vocab_size, device)

    def forced(self, row: int) -> list[int]:
        """The tokens that must follow row ``row``'s position, as long as its trie leaves one
        choice (at most up to the end of the response): walked past and recorded (each
        allowed alone), so the sampler appends them without a forward pass each."""
        node, record, run = self.nodes[row], self.allowed[row], []
        while node is not None and len(node) == 1:
            token = next(iter(node))
            run.append(token)
            if record is not None:
                record.append([token])
            node = node[token]
        self.nodes[row] = node
        return run

    def advance(self, chosen: Sequence[int], finished: Sequence[bool]) -> None:
        """Move every row past its sampled token; a row that ended its turn is free from then on
        (its later tokens are trimmed away)."""
        for row, (token, done) in enumerate(zip(chosen, finished)):
            node = self.nodes[row]
            self.nodes[row] = None if node is None or done else node[token]
