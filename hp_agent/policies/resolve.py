"""Turn a ``--model`` value into a local folder that ``from_pretrained`` can load.

A hub id (``Qwen/Qwen3-8B``; ``Qwen/Qwen3-8B@REV`` for a branch, tag or commit) is looked
up in the Hugging Face cache first (``HF_HOME``/``HF_HUB_CACHE``): a snapshot that holds
``config.json`` and every weight file is used as it is, with no network request. Anything
else is downloaded into that cache by ``huggingface_hub`` (its progress bar; ``HF_ENDPOINT``,
``HF_TOKEN`` and ``HF_HUB_OFFLINE`` apply as everywhere), only the files a transformers causal
LM loads: the top-level JSON files (config, generation config, tokenizer, weight index), the
chat template, tokenizer vocabularies and the ``*.safetensors`` weights (``pytorch_model*.bin``
only where a repo has no safetensors); never subfolders (``original/``, ``onnx/``), GGUF,
ONNX or other frameworks' weights. Files already complete are kept, so an interrupted
download continues where it stopped. Every failure is one :class:`ModelNotFoundError` line
that names the id, the cause and the fix; on a machine without a hub, copy a Hugging Face
cache that holds the model, pass a local folder or use ``--model tiny``.

:func:`model_config_file` gives a model's ``config.json`` without its weights (for memory
planning before a download).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import validate_repo_id

from hp_agent.errors import UserFileNotFoundError, UserValueError
from hp_agent.policies.pretrained import PACKAGED_MODELS, packaged_model_path
from hp_agent.policies.tiny import TINY_VARIANTS, tiny_model_path

TINY = "tiny"
PRETRAINED = "smollm2-135m"
# Model folders this package ships (hp_agent/policies/warm_starts/NAME): warm starts whose
# recipe and measurements docs/results.md gives, so that a demo spends no hour on SFT.
SHIPPED_MODELS = ("tiny-alfworld-warm",)


def shipped_model_path(name: str) -> Path:
    """The folder of :data:`SHIPPED_MODELS` ``name`` inside the installed package."""
    return Path(__file__).with_name("warm_starts") / name


class ModelNotFoundError(UserFileNotFoundError):
    """The model is not a local folder and cannot be found in or downloaded into the Hugging Face cache."""


def _offline_advice() -> str:
    return (
        "on a machine without a hub, copy a Hugging Face cache that holds the model "
        f"({constants.HF_HUB_CACHE}; set HF_HOME or HF_HUB_CACHE to use another), pass a local folder "
        f"(e.g. --model /path/to/Qwen3-8B), or use --model {TINY} (the embedded test model) or "
        f"--model {PRETRAINED} (a small pretrained chat model installed from PyPI)"
    )


def _looks_like_path(name: str) -> bool:
    # A hub id is "org/name"; anything rooted, dotted or nested deeper is a path, and so is
    # "runs/x" where a folder runs/ is here.
    first, slash, _ = name.partition("/")
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or bool(slash and Path(first).is_dir())


def _one_line(error: BaseException) -> str:
    # huggingface_hub's messages span paragraphs; the first line names the cause.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def split_hub_name(name: str) -> tuple[str, str]:
    """``"org/name@REV"`` -> ``("org/name", "REV")``; no ``@``: the default branch (``main``).

    Raises :class:`ModelNotFoundError` for a name that is no valid hub id."""
    repo_id, at, revision = name.partition("@")
    if at and not revision:
        raise ModelNotFoundError(f"model {name!r} ends with '@' but names no revision; "
                                 f"write {repo_id}@REV with REV a branch, tag or commit, or drop the '@'")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ModelNotFoundError(
            f"model {name!r} is neither a local folder nor a valid hub id ({_one_line(error)}); "
            f"--model takes {TINY}, {PRETRAINED}, a local model folder or a hub id such as Qwen/Qwen3-8B[@REV]"
        ) from error
    return repo_id, revision or constants.DEFAULT_REVISION


def _hub_timeout() -> float:
    # huggingface_hub's repo look-up has no timeout of its own: without one a hub behind a
    # firewall that drops packets would hang the command. HF_HUB_ETAG_TIMEOUT (10 s by
    # default) is the bound huggingface_hub uses for its other metadata requests.
    return float(constants.HF_HUB_ETAG_TIMEOUT)


def missing_model_files(folder: Path) -> list[str]:
    """The files a transformers model folder lacks: ``config.json`` and the weights (every
    shard ``model.safetensors.index.json`` names, else ``model.safetensors``; the
    ``pytorch_model`` equivalents where a folder holds those)."""
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    for index, single in (("model.safetensors.index.json", "model.safetensors"), ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        if (folder / index).is_file():
            try:
                shards = set(json.loads((folder / index).read_text())["weight_map"].values())
            except (ValueError, KeyError, TypeError, AttributeError):
                return [*missing, index]  # unreadable: not a complete snapshot
            return [*missing, *sorted(shard for shard in shards if not (folder / shard).is_file())]
        if (folder / single).is_file():
            return missing
    return [*missing, "model.safetensors"]


def _cached_file(repo_id: str, revision: str, filename: str) -> Path | None:
    # A branch or tag goes through the cache's refs/ (what the last download found it at),
    # a commit hash straight to snapshots/<hash>; no network either way.
    cached = try_to_load_from_cache(repo_id, filename, revision=revision)
    return Path(cached) if isinstance(cached, str) else None  # a non-str sentinel: cached as missing


def _cached_snapshot(repo_id: str, revision: str) -> tuple[Path | None, list[str]]:
    """The cached snapshot folder of ``repo_id`` at ``revision`` (None: none) and the files it lacks."""
    config = _cached_file(repo_id, revision, "config.json")
    if config is None:
        return None, ["config.json"]
    return config.parent, missing_model_files(config.parent)


_WANTED = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken")  # configs, tokenizer, chat template, vocabularies


def wanted_files(repo_files: Iterable[str]) -> list[str]:
    """The files of a hub repository that a transformers causal LM loads.

    Top level only (``original/``, ``onnx/``, ``gguf/`` hold other formats); the
    ``*.safetensors`` weights, or ``pytorch_model*.bin`` where a repo has none (never both);
    ``consolidated*`` files are Mistral's own format, which transformers does not read."""
    top = [name for name in repo_files if "/" not in name and not name.startswith("consolidated")]
    safetensors = [name for name in top if name.endswith(".safetensors")]
    weights = safetensors or [name for name in top if fnmatch(name, "pytorch_model*.bin")]
    other_index = "*.bin.index.json" if safetensors else "*.safetensors.index.json"
    extras = [name for name in top if any(fnmatch(name, p) for p in _WANTED) and not fnmatch(name, other_index)]
    return sorted({*extras, *weights})


def _network_cause(error: BaseException) -> BaseException | None:
    # huggingface_hub wraps what went wrong (a LocalEntryNotFoundError "from" a ConnectError):
    # the first HTTP or transport error down the chain says what to fix.
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, (HfHubHTTPError, httpx2.TransportError)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _hub_error(name: str, error: BaseException, during: str = "") -> ModelNotFoundError:
    """One line for what went wrong talking to the hub about ``name``; ``during``: the file transfer, if any."""
    repo_id, revision = split_hub_name(name)
    hub = constants.ENDPOINT
    auth = "set HF_TOKEN or run `hf auth login` with a token that may read it"
    cause = _network_cause(error) or error
    if isinstance(cause, GatedRepoError):
        message = (f"hub model {repo_id!r} is gated and this token has no access ({_one_line(cause)}); "
                   f"accept its terms on its page at {hub}/{repo_id}, then {auth}")
    elif isinstance(cause, RevisionNotFoundError):
        message = (f"hub model {repo_id!r} has no revision {revision!r}; "
                   f"pass a branch, tag or commit it has (--model {repo_id}@main), or no '@' for its default branch")
    elif isinstance(cause, RepositoryNotFoundError):
        message = (f"no model {repo_id!r} on the hub at {hub} ({_one_line(cause)}); check the id that --model got (org/name), "
                   f"or for a private repository {auth}")
    elif isinstance(cause, RemoteEntryNotFoundError):
        message = f"hub model {name!r} lists a file that the hub then does not serve ({_one_line(cause)}); try again later"
    elif isinstance(cause, HfHubHTTPError) and cause.response is not None and cause.response.status_code in (401, 403):
        message = f"the hub at {hub} refused access to {name!r} (HTTP {cause.response.status_code}); {auth}"
    elif isinstance(cause, HfHubHTTPError) and (cause.response is None or cause.response.status_code in (408, 429)
                                                or cause.response.status_code >= 500):
        status = cause.response.status_code if cause.response is not None else "error"
        message = f"the hub at {hub} answered HTTP {status} for {name!r} ({_one_line(cause)}); try again later"
    elif isinstance(cause, HfHubHTTPError):  # a 4xx without the hub's error codes: some other server
        message = (f"the server at {hub} answered HTTP {cause.response.status_code} for {name!r} without the hub's "
                   f"error codes ({_one_line(cause)}); check that HF_ENDPOINT points to a Hugging Face hub")
    elif isinstance(cause, httpx2.ProxyError):
        message = f"the proxy refused the request for {name!r} ({_one_line(cause)}); check HTTPS_PROXY / HTTP_PROXY"
    elif during:
        message = (f"the download of {name!r} from {hub} was interrupted ({_one_line(cause)}); files completed so far "
                   f"stay in {constants.HF_HUB_CACHE}: run the same command again to finish it")
    else:
        message = (f"cannot reach the hub at {hub} for {name!r} ({_one_line(cause)}); check the network "
                   f"connection and HF_ENDPOINT; {_offline_advice()}")
    return ModelNotFoundError(message)


def _offline_error(name: str, missing: list[str], cached: Path | None) -> ModelNotFoundError:
    what = (f"its cached snapshot {cached} lacks {', '.join(missing[:3])}" if cached is not None
            else "it is not in the Hugging Face cache")
    return ModelNotFoundError(f"hub model {name!r} cannot be downloaded because HF_HUB_OFFLINE is set and {what}; "
                              f"unset HF_HUB_OFFLINE to download it, or {_offline_advice()}")


def _hub_info(name: str) -> ModelInfo:
    """The hub's answer for ``name``'s repository at its revision: the commit and the file list."""
    repo_id, revision = split_hub_name(name)
    try:
        info = HfApi().model_info(repo_id, revision=revision, timeout=_hub_timeout())
    except (HfHubHTTPError, httpx2.TransportError) as error:
        raise _hub_error(name, error) from error
    if not info.sha:
        raise ModelNotFoundError(f"the hub at {constants.ENDPOINT} gave no commit for {name!r}; "
                                 "check that HF_ENDPOINT points to a Hugging Face hub")
    return info


def _remember_revision(repo_id: str, revision: str, commit: str) -> None:
    # What huggingface_hub's own look-up writes: refs/<branch or tag> holds the commit, so a
    # later call finds the snapshot offline. Written whole and renamed (a reader never sees
    # half a ref); a read-only cache only costs the offline look-up.
    if revision == commit:
        return
    ref = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "refs" / revision
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        if not ref.is_file() or ref.read_text() != commit:
            partial = ref.with_name(f".{ref.name}.partial")
            partial.write_text(commit)
            partial.replace(ref)
    except OSError:
        pass


def _download(name: str) -> Path:
    """Download what a transformers causal LM needs of hub model ``name`` into the cache."""
    repo_id, revision = split_hub_name(name)
    info = _hub_info(name)
    files = wanted_files(sibling.rfilename for sibling in info.siblings or [])
    if "config.json" not in files:
        raise ModelNotFoundError(f"hub repository {name!r} has no config.json at its top level, so it is no "
                                 "transformers model; pass the id of a model repository (e.g. Qwen/Qwen3-8B)")
    _remember_revision(repo_id, revision, info.sha)
    try:
        folder = snapshot_download(
            repo_id,
            revision=info.sha,  # the commit just looked up: every file comes from the same one
            allow_patterns=[glob.escape(file) for file in files],  # file names, not patterns
            etag_timeout=_hub_timeout(),
        )
    except (HfHubHTTPError, httpx2.TransportError, OSError) as error:
        if isinstance(error, OSError) and error.errno is not None:  # the disk, not the hub
            raise ModelNotFoundError(f"cannot write hub model {name!r} into {constants.HF_HUB_CACHE} "
                                     f"({_one_line(error)}); free space there or set HF_HUB_CACHE to another folder") from error
        raise _hub_error(name, error, during="download") from error
    missing = missing_model_files(Path(folder))
    if missing:
        raise ModelNotFoundError(f"hub repository {name!r} lacks {', '.join(missing[:3])}: no weights a transformers "
                                 "model loads (safetensors, or pytorch_model.bin)")
    return Path(folder)


def _from_hub(name: str) -> Path:
    repo_id, revision = split_hub_name(name)
    cached, missing = _cached_snapshot(repo_id, revision)
    if cached is not None and not missing:
        return cached
    if constants.HF_HUB_OFFLINE:
        raise _offline_error(name, missing, cached)
    return _download(name)


def _hub_config_file(name: str) -> Path:
    repo_id, revision = split_hub_name(name)
    cached = _cached_file(repo_id, revision, "config.json")
    if cached is not None:
        return cached
    if constants.HF_HUB_OFFLINE:
        raise _offline_error(name, ["config.json"], None)
    info = _hub_info(name)
    if "config.json" not in {sibling.rfilename for sibling in info.siblings or []}:
        raise ModelNotFoundError(f"hub repository {name!r} has no config.json at its top level, so it is no "
                                 "transformers model; pass the id of a model repository (e.g. Qwen/Qwen3-8B)")
    _remember_revision(repo_id, revision, info.sha)
    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=info.sha, etag_timeout=_hub_timeout()))
    except (HfHubHTTPError, httpx2.TransportError, OSError) as error:
        raise _hub_error(name, error, during="download") from error


def _local_model(name: str) -> Path | None:
    """The folder of ``name`` where it is no hub id (None where it is one)."""
    if name in TINY_VARIANTS:
        return tiny_model_path(name)
    if name in PACKAGED_MODELS:
        return packaged_model_path(name)
    if name in SHIPPED_MODELS:
        return shipped_model_path(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise UserValueError(
                f"model folder {str(path)!r} has no config.json; "
                "pass the folder that holds the model's config and weights"
            )
        return path
    if _looks_like_path(name):
        raise ModelNotFoundError(f"no such folder: {path.absolute()} (--model takes {TINY}, {PRETRAINED}, a local model "
                                 "folder or a hub id such as Qwen/Qwen3-8B[@REV])")
    return None


def resolve_model(name: str) -> Path:
    """The folder holding model ``name``.

    ``name`` is ``"tiny"`` or another embedded variant (``TINY_VARIANTS``, built on first use), a model a
    package ships (``PACKAGED_MODELS``, ``"smollm2-135m"``: converted on first use; ``SHIPPED_MODELS``,
    ``"tiny-alfworld-warm"``: a folder inside hp_agent), a local folder with
    a ``config.json`` (or a LoRA adapter folder, with ``adapter_config.json``: :mod:`hp_agent.policies.lora`),
    or a hub id such as ``"Qwen/Qwen3-8B"`` (``"Qwen/Qwen3-8B@REV"``: a branch, tag or commit):
    its snapshot in the Hugging Face cache, downloaded there first where the cache lacks its
    config or any of its weights (see the module docstring for which files and how).
    Raises :class:`ModelNotFoundError` (one line: the id, the cause, the fix) when the model is
    not there and cannot be downloaded, and ``ValueError`` for a folder without ``config.json``.
    """
    folder = _local_model(name)
    return folder if folder is not None else _from_hub(name)


def model_config_file(name: str) -> Path:
    """The ``config.json`` of model ``name`` (any :func:`resolve_model` takes), without its weights.

    A hub id: the cached file, else ``config.json`` alone downloaded into the cache. A LoRA
    adapter folder: its base model's config. Anything else: ``resolve_model(name) / "config.json"``.
    """
    from hp_agent.run_folder import model_source

    name = model_source(name)  # a run folder: its latest checkpoint's model
    folder = _local_model(name)
    if folder is None:
        return _hub_config_file(name)
    if (folder / "config.json").is_file():
        return folder / "config.json"
    return _adapter_base_config(folder)  # _local_model let through only folders with one or the other


def _adapter_base_config(adapter: Path) -> Path:
    # Mirrors lora.adapter_base_folder, minus resolving (downloading) the base's weights.
    from hp_agent.run_folder import model_source

    base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise UserValueError(f"adapter folder {str(adapter)!r} does not name its base model (base_model_name_or_path)")
    source = model_source(base)
    base_folder = _local_model(source)
    if base_folder is None:
        return _hub_config_file(source)
    if not (base_folder / "config.json").is_file():
        raise UserValueError(f"adapter folder {str(adapter)!r} names another adapter, {base!r}, as its base")
    return base_folder / "config.json"
