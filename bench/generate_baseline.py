"""The baseline a user would pick for sampling: transformers' ``model.generate``, behind the Policy API."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig

from hp_agent.policies import Generation, SamplingParams
from hp_agent.policies.hf import Answer, HFPolicy


class GeneratePolicy(HFPolicy):
    """HFPolicy sampling through ``model.generate``: left-padded prompts, run whole, on
    transformers' own ``sdpa`` attention. Log-probs are not asked for (NaN)."""

    def __init__(self, path: str | Path):
        super().__init__(path, prefix_cache_tokens=0)
        self.model.set_attn_implementation("sdpa")

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        sampler = {"do_sample": False} if sampling.greedy else {
            "do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
        config = GenerationConfig(max_new_tokens=sampling.max_new_tokens, eos_token_id=self.eos_token_id,
                                  pad_token_id=self.pad_token_id, **sampler)
        new_ids = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)[:, width:]
        return [self._trim(Answer(row.tolist(), [float("nan")] * len(row)), None, sampling.max_new_tokens) for row in new_ids]
