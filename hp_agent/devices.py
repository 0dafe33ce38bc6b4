"""Where a model runs and in which dtype: ``auto`` resolved for this machine, and a device
that is not there refused in one line.

``model.device=auto`` is CUDA where torch sees a GPU, else the CPU; ``model.dtype=auto``
is bfloat16 on CUDA (the learner then trains float32 master weights:
``learner.mixed_precision``) and float32 on the CPU, whose bfloat16 matmuls are slower
than its float32 ones. Every command that loads a model resolves both here, so a run
trained with the defaults on a GPU and its evaluation agree without a flag.
"""

from __future__ import annotations

AUTO = "auto"
DTYPES = ("float32", "bfloat16", "float16")


def cuda_available() -> bool:
    import torch  # here, not at the top: the config imports this module and stays light

    return torch.cuda.is_available()


def resolve_device(device: str, cuda: bool | None = None) -> str:
    """``auto`` -> ``cuda`` where a GPU is visible (``cuda``: as if one were, or were not:
    a plan for another machine), else ``cpu``; anything else unchanged."""
    if device != AUTO:
        return device
    return "cuda" if (cuda_available() if cuda is None else cuda) else "cpu"


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto`` -> ``bfloat16`` on a CUDA device, ``float32`` elsewhere; a named dtype unchanged."""
    if dtype == AUTO:
        return "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in DTYPES:
        from hp_agent.errors import UserValueError

        raise UserValueError(f"unknown dtype {dtype!r}; valid: {AUTO}, {', '.join(DTYPES)}")
    return dtype


def check_device(device: str) -> None:
    """Raise a one-line :class:`~hp_agent.errors.UserValueError` where ``device`` is not on
    this machine (CUDA on a CPU build of torch, a GPU index past the last), naming what is."""
    import torch

    from hp_agent.errors import UserValueError

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise UserValueError(f"device {device!r} is not a torch device ({error}); valid here: {available_devices()}") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU build of torch" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
            raise UserValueError(
                f"device {device!r}: this machine has no usable GPU ({build}, torch {torch.__version__}); "
                f"devices here: {available_devices()}. Use --device cpu (or auto), or install a CUDA build of torch "
                "(`make TORCH_SPEC=torch install`, README 'On a GPU')"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise UserValueError(f"device {device!r}: there is no GPU {parsed.index}; devices here: {available_devices()}")
    elif parsed.type not in ("cpu", "meta"):
        raise UserValueError(f"device {device!r} is not supported; devices here: {available_devices()}")


def available_devices() -> str:
    """``cpu`` and each visible GPU, e.g. ``cpu, cuda:0 (NVIDIA H100, 79.1 GiB)``."""
    import torch

    names = ["cpu"]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            names.append(f"cuda:{index} ({properties.name}, {properties.total_memory / 2**30:.1f} GiB)")
    return ", ".join(names)
