"""hp_agent built as a wheel and installed (not editable) works from outside the source tree,
and finds the ALFWorld games only through its settings, never by path arithmetic.

The scratch venv gets the heavy dependencies (torch, transformers, alfworld) from this
venv's site-packages through a plain path line in a ``.pth`` file: such a line does not
run that folder's own ``.pth`` files, so the editable install of hp_agent stays out and
the wheel is what ``import hp_agent`` finds (asserted below).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from hp_agent.envs.alfworld import data

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ("ALFWORLD_DATA", data.TARBALL_SETTING, "HP_AGENT_SHARED", "HP_AGENT_CACHE", "PYTHONPATH")

pytestmark = pytest.mark.slow


def _package_files() -> list[str]:
    """The files of hp_agent/ a clean clone has (plus new, not ignored ones), relative to the repo."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", "hp_agent"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but caches
        listed = [str(p.relative_to(REPO)) for p in (REPO / "hp_agent").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted(name for name in listed if (REPO / name).is_file())


def _run(command: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """(scratch venv, wheel path, files packaged): the wheel built from a copy of the tree and
    installed without dependencies into a new venv that borrows this venv's site-packages."""
    base = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    # Build from a copy: setuptools leaves build/ (stale modules included) in the folder it builds.
    source, files = base / "src", _package_files()
    for name in ["pyproject.toml", "README.md", *files]:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", base / "dist", source], base, env)
    (wheel,) = (base / "dist").glob("hp_agent-*.whl")

    scratch = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", scratch], base, env)
    python = scratch / "bin" / "python"
    # This venv's pip, run by the scratch interpreter (`--python`), installs into the scratch venv.
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
         base, env)
    target = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       base, env).stdout.strip())
    borrowed = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (target / "borrowed_site_packages.pth").write_text("".join(f"{path}\n" for path in borrowed))
    return scratch, wheel, files


@pytest.fixture
def scratch_env(tmp_path):
    """Environment for commands in the scratch venv: no data settings, run from tmp_path."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HP_AGENT_CACHE=str(tmp_path / "empty-cache"))
    return env


def test_wheel_holds_every_package_file(wheel_venv):
    _, wheel, files = wheel_venv
    packaged = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in files if name not in packaged]
    assert not missing, f"missing from the wheel (add package-data in pyproject.toml): {missing}"


def test_installed_wheel_runs_outside_the_tree(wheel_venv, scratch_env, tmp_path):
    scratch, _, _ = wheel_venv
    hp_agent = scratch / "bin" / "hp-agent"
    where = _run([scratch / "bin" / "python", "-c", "import hp_agent; print(hp_agent.__file__)"],
                 tmp_path, scratch_env).stdout.strip()
    assert Path(where).is_relative_to(scratch), f"hp_agent imported from {where}, not from the wheel"
    listed = _run([hp_agent, "envs"], tmp_path, scratch_env).stdout.split()
    assert {"alfworld", "keys", "math", "code"} <= set(listed)
    # The tiny model is built once per test run in the shared cache (tests/conftest.py).
    scratch_env["HP_AGENT_CACHE"] = os.environ["HP_AGENT_CACHE"]
    result = tmp_path / "keys.json"
    _run([hp_agent, "eval", "--env", "keys", "--model", "tiny", "--split", "test", "--limit", "4",
          "--max-new-tokens", "5", "--output", result], tmp_path, scratch_env)
    assert json.loads(result.read_text())["tasks"] == 4


LOOKUP = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from hp_agent.envs.alfworld import data
    from hp_agent.paths import source_checkout

    assert source_checkout() is None and data.shared_dir() is None and data.shared_tarball() is None
    assert data.find_data_root() is None, data.find_data_root()
    try:
        data.require_data_root()
    except data.AlfworldDataError as error:
        print(error)
    else:
        raise SystemExit("found data with no setting")
    folder, tarball = sys.argv[1:3]
    if folder:
        os.environ["ALFWORLD_DATA"] = folder
        assert data.find_data_root() == Path(folder)
        assert len(data.list_games(data.find_data_root(), "id")) == 140
        del os.environ["ALFWORLD_DATA"]
    if tarball:  # the env kwarg data_root (env.kwargs.data_root) may name the tarball
        assert data.require_data_root(tarball) == data.cached_root()
        assert len(data.list_games(data.cached_root(), "ood")) == 134
""")


def test_installed_wheel_finds_alfworld_data_only_by_setting(wheel_venv, scratch_env, tmp_path):
    scratch, _, _ = wheel_venv
    folder = data.find_data_root()  # in this source checkout: the shared tarball, unpacked
    tarball = data.shared_tarball()
    tarball = tarball if tarball is not None and tarball.is_file() else None
    done = _run([scratch / "bin" / "python", "-c", LOOKUP, folder or "", tarball or ""], tmp_path, scratch_env)
    message = done.stdout
    for place in ("data_root", "$ALFWORLD_DATA", "$HP_AGENT_ALFWORLD_TARBALL", str(tmp_path / "empty-cache"),
                  "$HP_AGENT_SHARED", "alfworld-download"):
        assert place in message, f"{place!r} not named in:\n{message}"
    assert str(REPO.parent / "shared") not in message, message  # no path guessed from where the code lies
    if tarball is None or not all(importlib.util.find_spec(name) for name in ("alfworld", "fast_downward")):
        pytest.skip("no official ALFWorld tarball or no alfworld engine: the CLI episode is not played")
    scratch_env[data.TARBALL_SETTING] = str(tarball)
    scratch_env["HP_AGENT_CACHE"] = str(tmp_path / "cache-3")
    result = tmp_path / "alfworld.json"
    _run([scratch / "bin" / "hp-agent", "eval", "--env", "alfworld", "--policy", "walkthrough", "--split", "id",
          "--limit", "1", "--output", result], tmp_path, scratch_env)
    assert (tmp_path / "cache-3" / "alfworld_data" / "json_2.1.1").is_dir()  # unpacked from the setting
    outcome = json.loads(result.read_text())
    assert outcome["tasks"] == 1 and outcome["pass_at_k"] == 1.0  # the stored solution wins
