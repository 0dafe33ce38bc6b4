"""The sampler's decode-step shortcuts give what transformers' own path gives.

Decode attention (``hp_agent.policies.attention``) lays a group's query heads out against
their one key/value head instead of copying keys per head; the preallocated cache layer
writes into buffers instead of concatenating. Both are checked against transformers'
``sdpa`` attention with its ``DynamicCache``, step by step, on left-padded rows.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import Cache

from hp_agent.policies.attention import DECODE_SDPA, decode_sdpa_attention
from hp_agent.policies.prefix_cache import PreallocatedLayer, batch_past


@pytest.fixture(scope="module")
def models(tiny_policy):
    def load(attention):
        return AutoModelForCausalLM.from_pretrained(tiny_policy.path, attn_implementation=attention).eval()

    return load("sdpa"), load(DECODE_SDPA)


def _decode(model, cache, steps: int, generator_seed: int = 0) -> list[torch.Tensor]:
    """Prefill three left-padded rows, then feed fixed tokens one at a time; the logits of every step."""
    generator = torch.Generator().manual_seed(generator_seed)
    input_ids = torch.randint(3, 1500, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :4] = 0
    attention_mask[2, :1] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = []
    with torch.no_grad():
        for _ in range(steps):
            out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1])
            input_ids = torch.randint(3, 1500, (3, 1), generator=generator)
            position_ids = position_ids[:, -1:] + 1
            attention_mask = torch.cat([attention_mask, torch.ones_like(input_ids)], dim=1)
    return logits


def test_the_tiny_model_groups_query_heads(models) -> None:
    config = models[0].config
    assert config.num_attention_heads // config.num_key_value_heads == 2  # else the grouped path is never taken


def test_decode_attention_gives_the_logits_of_sdpa_at_every_step(models) -> None:
    reference, grouped = models
    expected = _decode(reference, DynamicCache(), steps=6)
    got = _decode(grouped, DynamicCache(), steps=6)
    for step, (a, b) in enumerate(zip(expected, got)):
        assert torch.allclose(a, b, atol=1e-5), f"step {step}: max difference {(a - b).abs().max():.2e}"


def test_decode_attention_pairs_each_query_head_with_its_own_key_head() -> None:
    """Query head h reads key/value head h // groups; any other pairing (e.g. h % groups) differs."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :2] = False

    class Module(torch.nn.Module):
        num_key_value_groups = 2
        is_causal = True

    output, _ = decode_sdpa_attention(Module(), query, key, value, mask)
    for head in range(4):
        expected = torch.nn.functional.scaled_dot_product_attention(
            query[:, head : head + 1], key[:, head // 2 : head // 2 + 1], value[:, head // 2 : head // 2 + 1], attn_mask=mask)
        assert torch.allclose(output[:, :, head], expected[:, 0], atol=1e-6)
    swapped = torch.nn.functional.scaled_dot_product_attention(query[:, 1:2], key[:, 1:2], value[:, 1:2], attn_mask=mask)
    assert not torch.allclose(output[:, :, 1], swapped[:, 0], atol=1e-3)


@pytest.mark.parametrize("capacity", [0, 10, 64])  # 0: grow at the prefill; 10: while decoding
def test_preallocated_cache_gives_the_logits_of_a_dynamic_cache(models, capacity) -> None:
    reference, _ = models
    expected = _decode(reference, DynamicCache(), steps=8)
    cache, _ = batch_past([(None, 0)], new_tokens=capacity)
    got = _decode(reference, cache, steps=8)
    for step, (a, b) in enumerate(zip(expected, got)):
        assert torch.allclose(a, b, atol=1e-5), f"step {step}: max difference {(a - b).abs().max():.2e}"
    assert all(isinstance(layer, PreallocatedLayer) and layer.get_seq_length() == 9 + 7 for layer in cache.layers)


def test_preallocated_layer_appends_without_copying_until_full() -> None:
    layer = PreallocatedLayer(capacity=4)
    first = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2)
    keys, _ = layer.update(first, -first)
    buffer = layer.buffers[0]
    keys, values = layer.update(torch.ones(2, 1, 1, 2), -torch.ones(2, 1, 1, 2))
    assert keys.data_ptr() == buffer.data_ptr()  # written in place: no new tensor
    assert torch.equal(keys, torch.cat([first, torch.ones(2, 1, 1, 2)], dim=-2)) and torch.equal(values, -keys)
    keys, _ = layer.update(torch.full((2, 1, 1, 2), 7.0), torch.zeros(2, 1, 1, 2))  # fifth slot: the buffer doubles
    assert keys.shape[-2] == 5 and layer.buffers[0].shape[-2] == 10
    assert torch.equal(keys[..., :4, :], torch.cat([first, torch.ones(2, 1, 1, 2)], dim=-2)) and bool((keys[..., 4, :] == 7).all())
    assert isinstance(batch_past([(None, 0)])[0], Cache)


def test_the_policy_samples_with_decode_attention(tiny_policy) -> None:
    assert tiny_policy.model.config._attn_implementation == DECODE_SDPA


def test_preallocated_layer_starts_over_after_a_reset() -> None:
    layer = PreallocatedLayer(capacity=4)
    layer.update(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    layer.reset()
    keys, _ = layer.update(torch.full((1, 1, 1, 2), 5.0), torch.zeros(1, 1, 1, 2))
    assert keys.shape[-2] == 1 and bool((keys == 5).all())


def test_grouped_attention_of_several_queries_matches_sdpa_without_gradients() -> None:
    """A pass of several new tokens over a cached prefix (a turn's new text, forced tokens,
    scoring): the grouped layout gives transformers' sdpa attention, each query under its
    own mask row; a query paired with the wrong mask row would differ."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    query, key, value = torch.randn(2, 6, 4, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    mask = torch.ones(2, 1, 4, 9, dtype=torch.bool).tril(diagonal=5)  # causal over the 4 new of 9 keys
    mask[1, ..., :3] = False  # row 1's padding

    class Module(torch.nn.Module):
        num_key_value_groups = 3
        is_causal = True
        training = False

    with torch.no_grad():
        ours, _ = decode_sdpa_attention(Module(), query, key, value, mask)
        theirs, _ = sdpa_attention_forward(Module(), query, key, value, mask)
        shifted, _ = sdpa_attention_forward(Module(), query, key, value, mask.flip(2))
    assert ours.shape == theirs.shape == (2, 4, 6, 8)
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert not torch.allclose(ours, shifted, atol=1e-3)
