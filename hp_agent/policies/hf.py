"""Transformers backend: any AutoModelForCausalLM with a chat template (Qwen3 first)."""

from __future__ import annotations

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
from hp_agent.policies.prefix_cache import PrefixCache, batch_past, row_sequence

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
        hits = [self.prefix_cache.lookup(prompt) for prompt in prompts]
        suffixes = [prompt[reused:] for prompt, (_, reused) in zip(prompts, hits)]
        width = max(len(suffix) for suffix in suffixes)
        cache, reused_width = batch_past(hits, new_tokens=width + sampling.max_new_tokens)
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
        sampled, sampled_logprobs = self._sample(input_ids, position_ids, attention_mask, cache, sampling, walk)
        generations = [self._trim(sampled[row], sampled_logprobs[row], walk.allowed[row] if walk else None) for row in range(rows)]
        computed = sampled.shape[1] - 1  # the cache holds keys of every sampled token but the last
        kept = zip(prompts, suffixes, hits, generations) if self.prefix_cache.max_tokens else ()  # reuse off: copy nothing
        for row, (prompt, suffix, (_, reused), generation) in enumerate(kept):
            answer = generation.token_ids[:computed]
            slots = torch.cat([
                torch.arange(reused_width - reused, reused_width),
                torch.arange(reused_width + width - len(suffix), reused_width + width + len(answer)),
            ])
            self.prefix_cache.store(row_sequence(cache, row, slots, prompt + answer))
        return generations

    def _sample(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Cache,
        sampling: SamplingParams,
        walk: TrieWalk | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-by-token sampling until every row ends its turn; returns the sampled ids
        [B, N] and their log-probs [B, N] on the CPU (rows that ended early go on, ignored).
        ``walk``: the rows' constraints, restricting each step's logits and advanced by it."""
        device = self.device
        input_ids, position_ids, attention_mask = input_ids.to(device), position_ids.to(device), attention_mask.to(device)
        finished = torch.zeros(len(input_ids), dtype=torch.bool, device=device)
        tokens, logprobs = [], []
        for _ in range(sampling.max_new_tokens):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            scores = out.logits[:, -1].float()
            if walk is not None:
                scores = scores.masked_fill(~walk.mask(scores.shape[-1], scores.device), float("-inf"))
            if not sampling.greedy:
                scores = top_p_filter(scores / sampling.temperature, sampling.top_p)
            step_logprobs = torch.log_softmax(scores, dim=-1)
            if sampling.greedy:
                chosen = scores.argmax(dim=-1)
            else:
                chosen = torch.multinomial(step_logprobs.exp(), num_samples=1).squeeze(-1)
            tokens.append(chosen)
            logprobs.append(step_logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1))
            finished |= chosen == self.eos_token_id
            if walk is not None:
                walk.advance(chosen.tolist(), finished.tolist())
            if bool(finished.all()):
                break
            input_ids = chosen.unsqueeze(-1)
            position_ids = position_ids[:, -1:] + 1
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(input_ids), 1))], dim=1)
        return torch.stack(tokens, dim=1).cpu(), torch.stack(logprobs, dim=1).cpu()

    def _trim(self, ids: torch.Tensor, logprobs: torch.Tensor, allowed: list[list[int] | None] | None = None) -> Generation:
        token_ids = ids.tolist()
        finished = self.eos_token_id in token_ids
        end = token_ids.index(self.eos_token_id) + 1 if finished else len(token_ids)
        return Generation(token_ids[:end], logprobs[:end].tolist(), finished, None if allowed is None else allowed[:end])

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
