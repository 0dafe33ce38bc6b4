"""Transformers backend: any AutoModelForCausalLM with a chat template (Qwen3 first)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from hp_agent.policies import Generation, SamplingParams

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFPolicy:
    """A transformers causal LM and its tokenizer.

    ``enable_thinking`` is passed to the chat template: Qwen3 templates open an empty
    ``<think></think>`` block when it is False, so the model answers directly.
    """

    def __init__(self, path: str | Path, dtype: str = "float32", device: str = "cpu", enable_thinking: bool = False):
        self.path = Path(path)
        self.device = torch.device(device)
        self.enable_thinking = enable_thinking
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if self.tokenizer.chat_template is None:
            raise ValueError(f"tokenizer in {self.path} has no chat template; hp_agent prompts chat models")
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=_DTYPES[dtype]).to(self.device)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_id

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
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """Sample a batch of left-padded prompts; log-probs are those of the sampler."""
        if not prompts:
            return []
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            temperature=None if sampling.greedy else sampling.temperature,
            top_p=None if sampling.greedy else sampling.top_p,
            top_k=0,  # 0 disables top-k; None would fall back to the model default (often 50)
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        self.model.eval()
        out = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), generation_config=config
        )
        new_ids = out.sequences[:, width:].cpu()
        # scores[t]: [B, V] logits after temperature and top-p, i.e. the sampling distribution.
        logprobs = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1).cpu()
        chosen = logprobs.gather(-1, new_ids.unsqueeze(-1)).squeeze(-1)
        return [self._trim(new_ids[row], chosen[row]) for row in range(len(prompts))]

    def _trim(self, ids: torch.Tensor, logprobs: torch.Tensor) -> Generation:
        token_ids = ids.tolist()
        if self.eos_token_id in token_ids:
            end = token_ids.index(self.eos_token_id) + 1
            return Generation(token_ids[:end], logprobs[:end].tolist(), finished=True)
        return Generation(token_ids, logprobs.tolist(), finished=False)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        decoder = self.model.get_decoder()
        out = decoder(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), use_cache=False)
        return out.last_hidden_state

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    def sync_weights(self) -> float:
        """Nothing to copy: ``generate`` samples from the learner's own ``model``."""
        return 0.0
