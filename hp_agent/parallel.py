"""The learner's model as it trains: one process, DDP or FSDP2 over ranks, bf16 mixed
precision on fp32 master weights, activation checkpointing.

DDP and FSDP2 act through the forward of the module they wrap (DDP readies its gradient
all-reduce there, FSDP2 gathers each layer's shards), so the learner's whole computation,
from token ids to the log-probs of the action tokens, is the forward of one module,
:class:`ActionLogprobs`.

Three rules make a step over W ranks the step one process takes on the same batch:

* both wrappers *average* gradients over ranks, and the learner's loss is a *sum* over
  ranks (each rank's part is normalised by the mini-batch's global token count), so each
  rank's loss is multiplied by W before ``backward`` (:attr:`TrainModel.loss_scale`);
* every rank runs as many forward/backward passes per optimizer step (FSDP2's forward
  and backward are collectives, DDP's last backward is), so a rank with fewer
  micro-batches, or none, runs padding passes whose loss is exactly zero
  (:meth:`TrainModel.padding_pass`);
* gradients are synchronised in the last pass only (:meth:`TrainModel.gradient_sync`);
  the earlier ones accumulate locally, as with one process.

The policy's ``model`` is what rollout, hindsight scoring, the vLLM weight sync and the
checkpoint's Hugging Face folder read. DDP trains it in place. FSDP2, or mixed precision
on trainable weights whose dtype is not float32, trains a *copy* (sharded over ranks with FSDP2,
fp32 master weights) and :meth:`TrainModel.publish` gathers its full weights back into
the policy's model after each learner step; the copy's state and the optimizer's are
then checkpointed with ``torch.distributed.checkpoint`` (every rank writes its shards).
Either way :meth:`TrainModel.publish` then tells the policy that its weights changed
(``weights_changed``: the policy's prefix cache holds the old weights' keys and values).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from hp_agent.batching import pad_right, predicting_states
from hp_agent.constraint import Allowed
from hp_agent.distributed import SINGLE, Ranks
from hp_agent.errors import UserFileNotFoundError
from hp_agent.kernels import TeacherSupport, chunked_logprobs, chunked_logprobs_and_jsd
from hp_agent.packing import TRAINING, check_masked_attention, packed_span_hidden_states

Parallel = Literal["ddp", "fsdp2"]
OPTIMIZER_FILE = "optimizer.pt"  # a checkpoint's optimizer state when the policy's model is the one trained
LEARNER_FOLDER = "learner"  # a checkpoint's training copy and optimizer state (torch.distributed.checkpoint)


class ActionLogprobs(nn.Module):
    """log pi(token) of each sequence's span, under ``model`` at ``temperature``: the
    decoder's final states at the positions that predict the span, then the LM head,
    ``logit_chunk_tokens`` tokens of logits at a time (across rows). ``allowed``: per span token, in order, the
    ids decoding was restricted to (None: any), renormalized over as the sampler did.

    ``packed``: the sequences run as prefix-tree rows (:mod:`hp_agent.packing`), a prefix
    they share (a GRPO group's prompt) computed once; else right-padded, one row each.
    Either way in one decoder pass, the token ids made here: the whole computation is this
    forward, as DDP and FSDP2 need. ``pad_id``: the token padding slots hold (masked out).
    """

    def __init__(self, model: nn.Module, temperature: float, packed: bool, pad_id: int, logit_chunk_tokens: int = 512):
        super().__init__()
        self.model, self.temperature, self.packed, self.pad_id = model, temperature, packed, pad_id
        self.logit_chunk_tokens = logit_chunk_tokens

    def forward(self, sequences: list[list[int]], spans: list[tuple[int, int]], allowed: Allowed | None = None,
                teacher: TeacherSupport | None = None) -> list[torch.Tensor] | tuple[list[torch.Tensor], torch.Tensor]:
        """The spans' log-probs; with a ``teacher`` (rows aligned with the spans' tokens), also
        each token's :func:`~hp_agent.kernels.support_jsd` against it, from the same logits."""
        if self.packed:
            states = torch.cat(packed_span_hidden_states(self.model, sequences, spans, None, self.pad_id, TRAINING))
        else:
            device = next(self.model.parameters()).device
            input_ids, attention_mask = pad_right(sequences, self.pad_id)
            hidden = self.model.get_decoder()(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                              use_cache=False).last_hidden_state
            states = torch.cat([predicting_states(hidden[row], start, end) for row, (start, end) in enumerate(spans)])
        head = self.model.get_output_embeddings()

        def project(states: torch.Tensor) -> torch.Tensor:
            return head(states) / self.temperature

        # All rows' spans through the head together: one large matmul per chunk, not one small one per row.
        targets = torch.tensor([token for sequence, (start, end) in zip(sequences, spans) for token in sequence[start:end]],
                               dtype=torch.long, device=states.device)
        sizes = [end - start for start, end in spans]
        if teacher is None:
            return list(chunked_logprobs(states, targets, project, self.logit_chunk_tokens, allowed).split(sizes))
        logprobs, divergences = chunked_logprobs_and_jsd(states, targets, project, teacher.to(states.device),
                                                         self.logit_chunk_tokens, allowed)
        return list(logprobs.split(sizes)), divergences


class TrainModel:
    """The trained model, wrapped for the ranks, with what the learner needs of it.

    ``model``: the policy's model. ``parallel``: how ranks share gradients (ignored with
    one rank). ``mixed_precision``: bf16 compute, fp32 weights, gradients and optimizer
    state (autocast, or FSDP2's ``MixedPrecisionPolicy``). ``activation_checkpointing``:
    each decoder layer's activations are recomputed in backward instead of kept.
    ``packed``, ``pad_id``, ``logit_chunk_tokens``: see :class:`ActionLogprobs`; a model whose attention cannot
    take a packed row's mask is refused here, before any rollout.
    ``weights_changed``: called by :meth:`publish` once the policy's model holds new
    weights (the policy's ``weights_changed``; None: nothing to tell).
    """

    def __init__(self, model: nn.Module, temperature: float, ranks: Ranks = SINGLE, parallel: Parallel = "ddp",
                 mixed_precision: bool = False, activation_checkpointing: bool = False, packed: bool = True,
                 pad_id: int = 0, weights_changed: Callable[[], None] | None = None, logit_chunk_tokens: int = 512):
        if parallel not in ("ddp", "fsdp2"):
            raise ValueError(f"learner.parallel={parallel!r}; valid: ddp, fsdp2")
        if packed:
            check_masked_attention(model, TRAINING.off_switch)
        self.rollout_model, self.ranks, self.weights_changed = model, ranks, weights_changed
        self.sharded = ranks.enabled and parallel == "fsdp2"
        self.device = next(model.parameters()).device
        self.autocast = mixed_precision and not self.sharded  # FSDP2 casts through its own policy
        # Master weights in float32: a copy when the trained weights are not (LoRA's adapter is already).
        needs_fp32_copy = mixed_precision and any(p.dtype != torch.float32 for p in model.parameters() if p.requires_grad)
        self.separate = self.sharded or needs_fp32_copy
        trained = copy.deepcopy(model).float() if needs_fp32_copy else copy.deepcopy(model) if self.separate else model
        if activation_checkpointing:
            base = trained.get_base_model() if hasattr(trained, "get_base_model") else trained  # LoRA: the transformers model
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.module: nn.Module = ActionLogprobs(trained, temperature, packed, pad_id, logit_chunk_tokens)
        if self.sharded:
            self.module = _fully_shard(self.module, trained, mixed_precision)
        elif ranks.enabled:
            device_ids = [self.device.index or 0] if self.device.type == "cuda" else None
            self.module = nn.parallel.DistributedDataParallel(self.module, device_ids=device_ids, broadcast_buffers=False)
        self.trained = trained
        self.parameters = [p for p in trained.parameters() if p.requires_grad]  # LoRA: the adapter's only
        self.loss_scale = float(ranks.world_size)
        self.pad_id = pad_id

    def forward(self, sequences: list[list[int]], spans: list[tuple[int, int]],
                allowed: Allowed | None = None) -> list[torch.Tensor]:
        """:class:`ActionLogprobs` of ``sequences``' ``spans`` in training mode (under bf16 autocast with mixed precision)."""
        return self._run(sequences, spans, allowed)

    def forward_with_teacher(self, sequences: list[list[int]], spans: list[tuple[int, int]], allowed: Allowed | None,
                             teacher: TeacherSupport) -> tuple[list[torch.Tensor], torch.Tensor]:
        """:meth:`forward` and each span token's JSD to the ``teacher``'s distribution (the distillation term)."""
        return self._run(sequences, spans, allowed, teacher)

    def _run(self, *inputs: object) -> Any:
        self.trained.train()
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.autocast else nullcontext()
        with autocast:
            return self.module(*inputs)

    @contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        """Passes inside with ``enabled`` False accumulate gradients on this rank alone."""
        if not self.ranks.enabled or enabled:
            yield
        elif self.sharded:
            self.module.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                self.module.set_requires_gradient_sync(True)
        else:
            with self.module.no_sync():
                yield

    def padding_pass(self) -> None:
        """A forward and backward whose loss is zero: a rank's turn in the other ranks'
        collectives when it has no micro-batch of its own left."""
        (self.forward([[self.pad_id] * 2], [(1, 2)])[0].sum() * 0.0).backward()

    def grad_norm(self, max_norm: float | None) -> float:
        """The gradients' total norm (over all ranks' shards); with ``max_norm``, clipped to it (the norm before)."""
        if max_norm is None:
            grads = [p.grad for p in self.parameters if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.parameters, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the trained weights into the policy's model (with FSDP2, every rank gathers
        the full tensors: a collective; nothing to copy when the policy's model is the one
        trained), then call ``weights_changed``. Explicitly, every time: version counters
        miss in-place writes that bypass autograd (``.data``, fused optimizers)."""
        if self.separate:
            targets = dict(self.rollout_model.named_parameters())
            for name, parameter in self.trained.named_parameters():
                if parameter.requires_grad:
                    full = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
                    targets[name].copy_(full)
        if self.weights_changed is not None:
            self.weights_changed()

    def save(self, folder: Path, optimizer: torch.optim.Optimizer) -> None:
        """Write the optimizer state (and a separate training copy's weights) into a
        checkpoint ``folder``. Every rank calls it; with FSDP2 every rank writes its shards."""
        if not self.separate:
            if self.ranks.is_main:
                with (folder / OPTIMIZER_FILE).open("wb") as file:  # a full disk is then a plain OSError
                    torch.save(optimizer.state_dict(), file)
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.module, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder / LEARNER_FOLDER)

    def load(self, folder: Path, optimizer: torch.optim.Optimizer) -> None:
        """Restore what :meth:`save` wrote into ``folder``."""
        expected = folder / (LEARNER_FOLDER if self.separate else OPTIMIZER_FILE)
        if not expected.exists():
            raise UserFileNotFoundError(f"checkpoint {str(folder)!r} has no {expected.name}: it was written with other "
                                    "learner.parallel / learner.mixed_precision settings; resume it with those")
        if not self.separate:
            optimizer.load_state_dict(torch.load(expected, map_location="cpu", weights_only=False))
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optimizer_state = get_state_dict(self.module, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=expected)
        set_state_dict(self.module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        self.publish()


def _fully_shard(module: ActionLogprobs, model: nn.Module, mixed_precision: bool) -> nn.Module:
    """FSDP2: each decoder layer one unit, the rest (embeddings, final norm, LM head: tied
    weights stay in one unit) the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision else MixedPrecisionPolicy()
    for layer in model.get_decoder().layers:
        fully_shard(layer, mp_policy=policy)
    return fully_shard(module, mp_policy=policy)

