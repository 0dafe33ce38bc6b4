"""Hub ids are downloaded into the Hugging Face cache, once, through a hub stand-in on 127.0.0.1.

The stand-in speaks the part of the hub's HTTP interface that ``huggingface_hub`` uses to
download a snapshot: ``GET /api/models/{repo}/revision/{rev}`` (the commit and the file
list), ``GET /api/models/{repo}/tree/{commit}`` (sizes), and ``HEAD``/``GET
/{repo}/resolve/{commit}/{file}`` (``X-Repo-Commit``, ``ETag``, ``Content-Length``, no
``X-Xet-*`` headers: plain HTTP, never the xet path). It serves the embedded tiny model
and counts every request, so a cache hit can be shown to make none.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from huggingface_hub import constants

from hp_agent.policies.resolve import ModelNotFoundError, model_config_file, resolve_model
from hp_agent.policies.tiny import tiny_model_path

REPO = "hp-test/tiny"
MAIN = "1" * 40  # the commit main points to
V1 = "2" * 40  # the commit of tag v1: another config, same weights
# Files a transformers causal LM does not load: the download must skip them.
SKIPPED = {
    "README.md": b"# tiny\n",
    "pytorch_model.bin": b"not read: the safetensors are there",
    "model.gguf": b"GGUF",
    "onnx/model.onnx": b"ONNX",
    "original/params.json": b"{}",
}


@dataclass
class Hub:
    """What the stand-in serves and what it saw."""

    commits: dict[str, dict[str, bytes]]  # commit -> path -> content
    refs: dict[str, str]  # branch or tag -> commit
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    drop: set[str] = field(default_factory=set)  # files whose GET is cut mid-body
    dropped: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def commit(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)

    def gets(self, suffix: str) -> list[str]:
        return [path for method, path in self.requests if method == "GET" and path.endswith(suffix)]


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: pytest shows what matters
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _error(self, status: int, code: str) -> None:
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _json(self, value: object) -> None:
            data = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub.lock:
                hub.requests.append((self.command, path))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                repo, kind, revision = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
                files = self._files(repo, revision)
                if files is None:
                    return
                if kind == "revision":
                    self._json({"id": repo, "sha": hub.commit(revision), "siblings": [{"rfilename": f} for f in files]})
                else:
                    self._json([{"type": "file", "path": f, "size": len(c), "oid": hashlib.sha1(c).hexdigest()}
                                for f, c in files.items()])
            elif len(parts) >= 5 and parts[2] == "resolve":
                repo, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                files = self._files(repo, revision)
                if files is None:
                    return
                if filename not in files:
                    return self._error(404, "EntryNotFound")
                self._file(files[filename], hub.commit(revision), filename, body)
            else:
                self._error(404, "RepoNotFound")

        def _files(self, repo: str, revision: str) -> dict[str, bytes] | None:
            if repo == "hp-test/gated":
                self._error(403, "GatedRepo")
                return None
            if repo != REPO:
                self._error(404, "RepoNotFound")
                return None
            commit = hub.commit(revision)
            if commit is None:
                self._error(404, "RevisionNotFound")
                return None
            return hub.commits[commit]

        def _file(self, content: bytes, commit: str, filename: str, body: bool) -> None:
            if body and filename in hub.drop and filename in hub.dropped:
                self.close_connection = True  # the hub is gone: the retry gets no answer at all
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            if not body:
                return
            if filename in hub.drop:  # the connection drops halfway through the file
                hub.dropped.add(filename)
                self.wfile.write(content[: len(content) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(content)

    return Handler


def _point_hub_at(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    # huggingface_hub reads HF_ENDPOINT into these at import time.
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache, online, anonymous."""
    folder = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return folder


@pytest.fixture
def hub(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    source = tiny_model_path("tiny")
    files = {f.name: f.read_bytes() for f in sorted(source.iterdir()) if f.is_file()}
    config = json.loads(files["config.json"])
    v1 = {**files, "config.json": json.dumps({**config, "hp_test_revision": "v1"}).encode()}
    state = Hub(commits={MAIN: {**files, **SKIPPED}, V1: v1}, refs={"main": MAIN, "v1": V1})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    _point_hub_at(monkeypatch, f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _snapshot(cache: Path, commit: str) -> Path:
    return cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit


def _one_line_error(name: str, match: str) -> str:
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model(name)
    message = str(error.value)
    assert "\n" not in message and match in message, message
    return message


def test_first_call_downloads_and_second_is_a_cache_hit(hub: Hub, cache: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    folder = resolve_model(REPO)
    download_s = time.perf_counter() - start
    assert folder == _snapshot(cache, MAIN)
    assert (cache / f"models--{REPO.replace('/', '--')}" / "refs" / "main").read_text() == MAIN
    source = tiny_model_path("tiny")
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in source.iterdir() if p.is_file())
    assert (folder / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    assert hub.gets("/model.safetensors") and not any(hub.gets(skipped) for skipped in SKIPPED)

    seen = len(hub.requests)
    start = time.perf_counter()
    assert resolve_model(REPO) == folder
    hit_s = time.perf_counter() - start
    assert len(hub.requests) == seen  # the cache hit asks the hub nothing
    AutoTokenizer.from_pretrained(folder)
    AutoModelForCausalLM.from_pretrained(folder)
    print(f"\nhub stand-in: download {download_s * 1000:.0f} ms ({len(hub.requests)} requests, "
          f"{(folder / 'model.safetensors').stat().st_size / 1e6:.1f} MB of weights), cache hit {hit_s * 1000:.2f} ms (0 requests)")


def test_load_policy_takes_a_hub_id(hub: Hub) -> None:
    from hp_agent.policies import load_policy

    policy = load_policy(REPO, device="cpu")
    assert policy is not None and hub.gets("/model.safetensors")


@pytest.mark.parametrize("revision", ["v1", V1])
def test_revision_selects_the_commit(hub: Hub, cache: Path, revision: str) -> None:
    folder = resolve_model(f"{REPO}@{revision}")
    assert folder == _snapshot(cache, V1)
    assert json.loads((folder / "config.json").read_text())["hp_test_revision"] == "v1"
    refs = cache / f"models--{REPO.replace('/', '--')}" / "refs"
    assert (refs / "v1").read_text() == V1 if revision == "v1" else not (refs / "v1").exists()
    seen = len(hub.requests)
    assert resolve_model(f"{REPO}@{revision}") == folder and len(hub.requests) == seen
    assert not _snapshot(cache, MAIN).exists()


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("hp-test/nope", "no model 'hp-test/nope' on the hub"),
        (f"{REPO}@nope", "has no revision 'nope'"),
        ("hp-test/gated", "HF_TOKEN"),
    ],
)
def test_hub_refusals_are_one_line(hub: Hub, name: str, match: str) -> None:
    message = _one_line_error(name, match)
    assert name.partition("@")[0] in message


def test_a_dropped_connection_leaves_no_partial_file_and_the_next_call_completes(
    hub: Hub, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.drop.add("model.safetensors")
    start = time.perf_counter()
    _one_line_error(REPO, "interrupted")
    assert time.perf_counter() - start < 15  # huggingface_hub retries 5 times, a second apart
    snapshot = _snapshot(cache, MAIN)
    assert not (snapshot / "model.safetensors").exists()
    source = tiny_model_path("tiny")
    for file in snapshot.iterdir():  # what is linked there is whole
        assert file.read_bytes() == (source / file.name).read_bytes()
    assert not [p for p in cache.rglob("*") if p.name.endswith(".incomplete")]
    with monkeypatch.context() as offline:  # incomplete is no cache hit, and offline says what is missing
        offline.setattr(constants, "HF_HUB_OFFLINE", True)
        assert "lacks model.safetensors" in _one_line_error(REPO, "HF_HUB_OFFLINE")

    hub.drop.clear()
    seen = len(hub.requests)
    folder = resolve_model(REPO)
    assert (folder / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    fetched = [path for method, path in hub.requests[seen:] if method == "GET" and "/resolve/" in path]
    assert fetched == [f"/{REPO}/resolve/{MAIN}/model.safetensors"]  # the other files were kept


def test_an_unreachable_hub_is_one_line_within_seconds(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    _point_hub_at(monkeypatch, f"http://127.0.0.1:{port}")
    start = time.perf_counter()
    message = _one_line_error(REPO, "cannot reach the hub")
    assert time.perf_counter() - start < 15
    assert REPO in message and "HF_ENDPOINT" in message and "--model tiny" in message
    with pytest.raises(ModelNotFoundError, match="cannot reach the hub"):
        model_config_file(REPO)


def test_offline_with_nothing_cached_is_one_line(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    message = _one_line_error(REPO, "HF_HUB_OFFLINE")
    assert REPO in message and "--model tiny" in message and not hub.requests


def test_offline_uses_a_complete_cached_snapshot(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = resolve_model(REPO)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    seen = len(hub.requests)
    assert resolve_model(REPO) == folder and model_config_file(REPO) == folder / "config.json"
    assert len(hub.requests) == seen


def test_model_config_file_fetches_the_config_only(hub: Hub, cache: Path) -> None:
    config = model_config_file(REPO)
    assert config == _snapshot(cache, MAIN) / "config.json"
    assert json.loads(config.read_text()) == json.loads((tiny_model_path("tiny") / "config.json").read_text())
    assert [path for _, path in hub.requests if "/resolve/" in path] == [f"/{REPO}/resolve/{MAIN}/config.json"] * 2
    seen = len(hub.requests)
    assert model_config_file(REPO) == config and len(hub.requests) == seen  # cached now
    assert resolve_model(REPO) == config.parent  # the weights come when the model is loaded


def test_model_config_file_for_local_models_and_adapters(tmp_path: Path) -> None:
    tiny = tiny_model_path("tiny")
    assert model_config_file("tiny") == tiny / "config.json"
    assert model_config_file(str(tiny)) == tiny / "config.json"
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "tiny"}))
    assert model_config_file(str(adapter)) == tiny / "config.json"


def test_a_hub_that_never_answers_is_one_line_after_the_timeout(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        _point_hub_at(monkeypatch, f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)
        start = time.perf_counter()
        message = _one_line_error(REPO, "cannot reach the hub")
        assert time.perf_counter() - start < 5 and "Timeout" in message
