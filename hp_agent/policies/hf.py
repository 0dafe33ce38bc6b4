"""Transformers backend: any AutoModelForCausalLM with a chat template (Qwen3 first)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import Cache

from hp_agent.config import ModelConfig
from hp_agent.constraint import ActionTrie, TrieWalk
from hp_agent.errors import UserValueError
from hp_agent.policies import Generation, SamplingParams
from hp_agent.policies.attention import DECODE_SDPA
from hp_agent.policies.lora import is_adapter_folder, load_adapter_model
from hp_agent.policies.prefix_cache import PreallocatedLayer, PrefixCache, batch_past, row_sequence

DEFAULT_PREFIX_CACHE_TOKENS: int = ModelConfig.model_fields["prefix_cache_tokens"].default  # the config's, one home

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFPolicy:
    """A transformers causal LM and its tokenizer.

    ``enable_thinking`` is passed to the chat template: Qwen3 templates open an empty
    ``<think></think>`` block when it is False, so the model answers directly.
    ``prefix_cache_tokens``: keys and values of up to this many recently sampled tokens
    are kept for later prompts that begin with them (0: none).
    """

    def __init__(
        self,
        path: str | Path,
        dtype: str = "float32",
        device: str = "cpu",
        enable_thinking: bool = False,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
    ):
        self.path = Path(path)
        self.device = torch.device(device)
        self.enable_thinking = enable_thinking
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if self.tokenizer.chat_template is None:
            raise UserValueError(f"tokenizer in {self.path} has no chat template; hp_agent prompts chat models")
        # A LoRA adapter folder (a LoRA run's checkpoint): its base with the adapter merged in.
        self.adapter_path = self.path if is_adapter_folder(self.path) else None
        if self.adapter_path is not None:
            self.model = load_adapter_model(self.path, _DTYPES[dtype], merge=True).to(self.device)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(
                self.path, dtype=_DTYPES[dtype], attn_implementation=DECODE_SDPA
            ).to(self.device)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_id
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.counts = SamplingCounts()

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=self.enable_thinking
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode_tokens(self, token_ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([token_id]) for token_id in token_ids]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, constraints: list[ActionTrie | None] | None = None
    ) -> list[Generation]:
        """Sample a batch of prompts; log-probs are those of the sampler (after temperature
        and top-p; greedy: the model's own).

        ``constraints``: per prompt, the trie of the responses it may end as (None: free),
        sampled token by token from the model's distribution renormalized over the tokens
        that continue one (:mod:`hp_agent.constraint`); each generation records those sets.

        Each prompt reuses the keys and values of the longest prefix it shares with a
        recently sampled sequence (:mod:`hp_agent.policies.prefix_cache`); only the rest
        is run. Row layout in the attention window: [padding | reused | padding | new
        prompt tokens | sampled tokens], with explicit positions, so every token sees its
        own sequence only, at its own positions.
        """
        if not prompts:
            return []
        self.model.eval()
        self.prefix_cache.check_weights(self.model)
        found = [self.prefix_cache.lookup(prompt) for prompt in prompts]
        # Rows run longest new text first, so that the prompt pass can split into groups of
        # like lengths (:func:`prefill_groups`); ``order[i]`` is row i's place in ``prompts``.
        order = sorted(range(len(prompts)), key=lambda k: len(prompts[k]) - found[k][1], reverse=True)
        prompts, hits = [prompts[k] for k in order], [found[k] for k in order]
        constraints = None if constraints is None else [constraints[k] for k in order]
        suffixes = [prompt[reused:] for prompt, (_, reused) in zip(prompts, hits)]
        width = max(len(suffix) for suffix in suffixes)
        cache, reused_width = batch_past(hits, new_tokens=width + sampling.max_new_tokens, empty=self._empty_past)
        rows = len(prompts)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        position_ids = torch.zeros((rows, width), dtype=torch.long)
        attention_mask = torch.zeros((rows, reused_width + width), dtype=torch.long)
        for row, (suffix, (_, reused)) in enumerate(zip(suffixes, hits)):
            input_ids[row, width - len(suffix) :] = torch.tensor(suffix)
            position_ids[row, width - len(suffix) :] = torch.arange(reused, reused + len(suffix))
            attention_mask[row, reused_width - reused : reused_width] = 1
            attention_mask[row, reused_width + width - len(suffix) :] = 1
        walk = TrieWalk(constraints) if constraints is not None and any(c is not None for c in constraints) else None
        groups = prefill_groups([len(suffix) for suffix in suffixes], PASS_TOKENS.get(self.device.type))
        answers = self._sample(input_ids, position_ids, attention_mask, cache, sampling, walk, groups, order)
        generations = [self._trim(answer, walk.allowed[row] if walk else None, sampling.max_new_tokens)
                       for row, answer in enumerate(answers)]
        self.counts.add(prompts, [reused for _, reused in hits], answers)
        kept = zip(prompts, suffixes, hits, generations, answers) if self.prefix_cache.max_tokens else ()  # reuse off: copy nothing
        for row, (prompt, suffix, (_, reused), generation, answer) in enumerate(kept):
            fed = answer.slots[: len(generation.token_ids)]  # the cache holds the answer tokens that were fed back
            slots = torch.cat([
                torch.arange(reused_width - reused, reused_width),
                torch.arange(reused_width + width - len(suffix), reused_width + width),
                torch.tensor(fed, dtype=torch.long),
            ])
            self.prefix_cache.store(row_sequence(cache, row, slots, prompt + generation.token_ids[: len(fed)]))
        in_order: list[Generation] = [None] * rows  # type: ignore[list-item]
        for row, generation in zip(order, generations):
            in_order[row] = generation
        return in_order

    def _empty_past(self, rows: int, capacity: int) -> list[list[torch.Tensor]]:
        """Zeroed key and value buffers [rows, kv heads, capacity, head dim] for every layer."""
        config = self.model.config.get_text_config()
        heads = config.num_key_value_heads or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(self.model.parameters()).dtype
        return [[torch.zeros(rows, heads, capacity, head_dim, dtype=dtype, device=self.device) for _ in range(2)]
                for _ in range(config.num_hidden_layers)]

    def _sample(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Cache,
        sampling: SamplingParams,
        walk: TrieWalk | None,
        groups: list[tuple[int, int]],
        order: list[int],
    ) -> list[Answer]:
        """Sample every row until it ends its turn or has ``max_new_tokens``; each row's
        tokens, their log-probs and the cache slots of those fed back.

        The prompt pass runs in ``groups`` of rows (row ranges, :func:`prefill_groups`).
        Each step draws one uniform number per row of the caller's order (``order[row]``
        is row's place there) and samples by the inverse of the row's distribution
        function, so that a row's sample does not depend on how the rows were arranged.

        ``walk``: the rows' constraints, restricting each step's logits and advanced by it.
        Where a row's trie leaves one choice, the tokens up to the next choice are appended
        at once (their restricted log-prob is 0) and fed in one pass: a turn of restricted
        decoding takes a forward pass per choice, not per token. Rows feed different numbers
        of tokens in a pass, left-padded (the padding masked), each at its own positions.
        """
        device = self.device
        input_ids, position_ids, attention_mask = input_ids.to(device), position_ids.to(device), attention_mask.to(device)
        rows = len(input_ids)
        answers = [Answer() for _ in range(rows)]
        live = set(range(rows))
        next_position = position_ids[:, -1] + 1
        logits = self._prefill(input_ids, position_ids, attention_mask, cache, groups)
        place = torch.tensor(order, device=device)
        while True:
            scores = logits.float()
            if walk is not None:
                scores = scores.masked_fill(~walk.mask(scores.shape[-1], scores.device), float("-inf"))
            if not sampling.greedy:
                scores = top_p_filter(scores / sampling.temperature, sampling.top_p)
            step_logprobs = torch.log_softmax(scores, dim=-1)
            if sampling.greedy:
                chosen = scores.argmax(dim=-1)
            else:
                uniform = torch.rand(rows, device=device)[place].clamp(min=1e-12)
                cumulative = step_logprobs.exp().cumsum(dim=-1)
                chosen = torch.searchsorted(cumulative, (uniform * cumulative[:, -1]).unsqueeze(-1)).squeeze(-1)
                chosen = chosen.clamp(max=scores.shape[-1] - 1)
            chosen_logprobs = step_logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist()
            chosen = chosen.tolist()
            if walk is not None:  # a row that ended (or reached the limit) samples nothing more
                walk.advance(chosen, [row not in live or token == self.eos_token_id for row, token in enumerate(chosen)])
            feeds: dict[int, list[int]] = {}
            for row in live:
                answer = answers[row]
                new = [chosen[row]] + (walk.forced(row) if walk is not None and chosen[row] != self.eos_token_id else [])
                answer.add(new, chosen_logprobs[row])
                if self.eos_token_id not in new and len(answer.token_ids) < sampling.max_new_tokens:
                    feeds[row] = new
            if not feeds:
                return answers
            live = set(feeds)
            self.counts.passes += 1
            input_ids, position_ids, attention_mask = self._feed(feeds, answers, attention_mask, next_position)
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]

    def _prefill(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Cache,
                 groups: list[tuple[int, int]]) -> torch.Tensor:
        """The prompt pass, a pass per group of rows [start, end) over views of ``cache``'s
        buffers, each as wide as its longest row (rows come longest first), written into
        the window's last slots; returns every row's next-token logits [B, V]."""
        if len(groups) == 1:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        window, width = attention_mask.shape[1], input_ids.shape[1]
        lengths = attention_mask[:, window - width :].sum(dim=1).tolist()
        logits = []
        for start, end in groups:
            part = lengths[start]
            view = Cache(layers=[PreallocatedLayer(layer.capacity).fill([b[start:end] for b in layer.buffers], window - part)
                                 for layer in cache.layers])
            out = self.model(input_ids=input_ids[start:end, width - part :], position_ids=position_ids[start:end, width - part :],
                             attention_mask=attention_mask[start:end], past_key_values=view, use_cache=True, logits_to_keep=1)
            logits.append(out.logits[:, -1])
        for layer in cache.layers:
            layer.fill(layer.buffers, window)
        return torch.cat(logits)

    def _feed(self, feeds: dict[int, list[int]], answers: list[Answer], attention_mask: torch.Tensor,
              next_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next pass's inputs: each feeding row's tokens right-aligned in ``width`` new
        slots (the rest padding, masked; rows that ended feed padding only), their
        positions, and the attention mask grown by those slots."""
        rows, width = len(answers), max(len(tokens) for tokens in feeds.values())
        device, first_slot = attention_mask.device, attention_mask.shape[1]
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long, device=device)
        position_ids = next_position.unsqueeze(1).repeat(1, width)
        grown = attention_mask.new_zeros((rows, width))
        for row, tokens in feeds.items():
            start = width - len(tokens)
            input_ids[row, start:] = torch.tensor(tokens, device=device)
            position_ids[row, start:] = next_position[row] + torch.arange(len(tokens), device=device)
            grown[row, start:] = 1
            answers[row].slots.extend(range(first_slot + start, first_slot + width))
            next_position[row] += len(tokens)
        return input_ids, position_ids, torch.cat([attention_mask, grown], dim=1)

    def _trim(self, answer: Answer, allowed: list[list[int] | None] | None, max_new_tokens: int) -> Generation:
        token_ids = answer.token_ids[:max_new_tokens]  # a forced run may pass the limit
        finished = self.eos_token_id in token_ids
        end = token_ids.index(self.eos_token_id) + 1 if finished else len(token_ids)
        return Generation(token_ids[:end], answer.logprobs[:end], finished, None if allowed is None else allowed[:end])

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        decoder = self.model.get_decoder()
        out = decoder(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), use_cache=False)
        return out.last_hidden_state

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    def weights_changed(self) -> None:
        """Empty the prefix cache: its keys and values are the old weights'."""
        self.prefix_cache.clear()

    def sync_weights(self) -> float:
        """Nothing to copy: ``generate`` samples from the learner's own ``model``; only
        the prefix cache, the old weights' keys and values, is emptied."""
        self.weights_changed()
        return 0.0

    def release_memory(self) -> float:
        """Nothing to free: sampling uses the learner's own ``model``."""
        return 0.0


# What one more forward pass costs, in tokens of a pass, per device type: the prompt pass
# of rows with new texts of unlike lengths is split into groups where the padding it
# saves is worth more (measured on this CPU with smollm2-135m, one thread: a pass of one
# token a row costs what 44 more tokens cost in bfloat16, 57 in float32). On CUDA a
# padded token costs next to nothing beside a pass's launches, so there (and on any
# other device) the pass stays whole.
PASS_TOKENS: dict[str, int] = {"cpu": 48}


def prefill_groups(lengths: list[int], pass_tokens: int | None) -> list[tuple[int, int]]:
    """Row ranges [start, end) covering ``lengths`` (longest first) that minimize the tokens
    run, each group padded to its first row's length, plus ``pass_tokens`` per group
    (None: one group).

    >>> prefill_groups([100, 90, 10, 8], 48)
    [(0, 2), (2, 4)]
    >>> prefill_groups([12, 10, 10], 48)
    [(0, 3)]
    """
    rows = len(lengths)
    if pass_tokens is None or rows < 2:
        return [(0, rows)]
    best = [0] + [None] * rows  # best[j]: the cheapest cost of rows [0, j)
    cut = [0] * (rows + 1)
    for end in range(1, rows + 1):
        for start in range(end):
            cost = best[start] + (end - start) * lengths[start] + pass_tokens
            if best[end] is None or cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], rows
    while end:
        groups.append((cut[end], end))
        end = cut[end]
    return groups[::-1]


@dataclass
class Answer:
    """One row's sampled tokens so far, their log-probs, and the cache slots of those fed back."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)

    def add(self, tokens: list[int], first_logprob: float) -> None:
        """The sampled token and the forced ones after it (log-prob 0: the only choice)."""
        self.token_ids += tokens
        self.logprobs += [first_logprob] + [0.0] * (len(tokens) - 1)


@dataclass
class SamplingCounts:
    """What :meth:`HFPolicy.generate` ran, summed over its calls: prompt tokens asked for,
    of them those whose keys came from the prefix cache, tokens sampled (forced ones
    included), and forward passes after each call's prompt pass."""

    prompts: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    sampled_tokens: int = 0
    passes: int = 0  # forward passes after the prompt's

    def add(self, prompts: list[list[int]], reused: list[int], answers: list[Answer]) -> None:
        self.prompts += len(prompts)
        self.prompt_tokens += sum(len(prompt) for prompt in prompts)
        self.reused_tokens += sum(reused)
        self.sampled_tokens += sum(len(answer.token_ids) for answer in answers)

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter on [B, V] scores: keep the most likely tokens whose probabilities
    sum to at least ``top_p`` (always the top one); the rest get -inf."""
    if top_p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, dim=-1)
    tail_mass = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = tail_mass <= 1.0 - top_p
    drop_sorted[:, -1] = False
    return scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
