"""Where the official ALFWorld game files are, and which games each split holds.

The data root is the folder that holds ``json_2.1.1/`` (and ``logic/``), the same
folder ``$ALFWORLD_DATA`` names for ALFWorld itself. Nothing from the data is ever
copied into the repository. Lookup order (the first that applies wins; docs/alfworld_data.md
says the same):

1. ``data_root`` given explicitly: the env kwarg (``env.kwargs.data_root`` in a config,
   ``AlfworldEnv(data_root=...)``), a folder holding ``json_2.1.1/`` or the official
   tarball. An explicit value that holds no games is an error, never skipped.
2. ``$ALFWORLD_DATA``, when it holds ``json_2.1.1/`` (checked for content: importing
   alfworld sets it to ``~/.cache/alfworld`` whenever it is unset).
3. ``$HP_AGENT_ALFWORLD_TARBALL``: the official tarball (``alfworld_json_2.1.1_official.tar.gz``),
   unpacked once into ``<cache>/alfworld_data``; set but missing is an error.
4. The cache: ``<cache>/alfworld_data`` (``<cache>`` = ``$HP_AGENT_CACHE``, else
   ``~/.cache/hp_agent``), where an earlier unpack left the games.
5. The shared folder's tarball, ``<shared>/data/alfworld_json_2.1.1_official.tar.gz``, unpacked
   once into the cache. ``<shared>`` is ``$HP_AGENT_SHARED``; unset, and only in a source
   checkout (``pyproject.toml`` beside the ``hp_agent`` package, outside site-packages), it
   is ``<checkout>/../shared``: the development fallback. An installed wheel never derives
   a data path from where its code lies.

Splits: ``train`` (the official ``train`` folder when present, else the 200-game
``valid_train`` sample), ``id`` = ``valid_seen`` (140 games), ``ood`` =
``valid_unseen`` (134 games). Folders without ``game.tw-pddl`` are trajectories
ALFWorld dropped; like ALFWorld's ``AlfredTWEnv`` we skip them, skip ``movable`` and
``Sliced`` tasks, and skip games marked unsolvable.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hp_agent.errors import UserFileNotFoundError, UserValueError
from hp_agent.paths import cache_root, source_checkout

JSON_FOLDER = "json_2.1.1"
TARBALL_NAME = "alfworld_json_2.1.1_official.tar.gz"
GAME_FILE = "game.tw-pddl"
CACHE_FOLDER = "alfworld_data"  # under the hp_agent cache: where a tarball is unpacked
TARBALL_SETTING = "HP_AGENT_ALFWORLD_TARBALL"

# ALFWorld's six task types (alfred_tw_env.TASK_TYPES) and the short names we report.
TASK_TYPES: dict[str, str] = {
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick2",
}
SHORT_TASK_TYPES: tuple[str, ...] = tuple(TASK_TYPES.values())

# Split name (ours, ALFWorld's folder names, and AlfredTWEnv's train_eval names) ->
# folders to try under json_2.1.1, first existing wins.
_SPLIT_FOLDERS: dict[str, tuple[str, ...]] = {
    "train": ("train", "valid_train"),
    "valid_train": ("valid_train",),
    "id": ("valid_seen",),
    "valid_seen": ("valid_seen",),
    "eval_in_distribution": ("valid_seen",),
    "ood": ("valid_unseen",),
    "valid_unseen": ("valid_unseen",),
    "eval_out_of_distribution": ("valid_unseen",),
}
SPLITS: tuple[str, ...] = tuple(_SPLIT_FOLDERS)


class AlfworldDataError(UserFileNotFoundError):
    """The ALFWorld game files are missing or incomplete."""


@dataclass(frozen=True)
class GameInfo:
    """One playable official game.

    game_file: path of its ``game.tw-pddl``.
    task_id:   ``<split folder>/<task folder>/<trial>``, e.g.
               ``valid_seen/pick_and_place_simple-Book-None-Desk-310/trial_T2019...``.
    task_type: short task type: pick, look, clean, heat, cool or pick2.
    split:     the split folder it comes from (``valid_seen``, ``valid_unseen``, ...).
    """

    game_file: Path
    task_id: str
    task_type: str
    split: str


def shared_dir() -> Path | None:
    """The project's shared folder: ``$HP_AGENT_SHARED``; unset, ``<checkout>/../shared`` in a
    source checkout, and None in an installed package (no path is derived from its location)."""
    override = os.environ.get("HP_AGENT_SHARED")
    if override:
        return Path(override).expanduser()
    checkout = source_checkout()
    return None if checkout is None else checkout.parent / "shared"


def shared_tarball() -> Path | None:
    """Where the shared copy of the official game files is expected (None: no shared folder)."""
    shared = shared_dir()
    return None if shared is None else shared / "data" / TARBALL_NAME


def cached_root() -> Path:
    """Where a tarball of the official games is unpacked: ``<cache>/alfworld_data``."""
    return cache_root() / CACHE_FOLDER


def _holds_games(root: Path) -> bool:
    return (root / JSON_FOLDER).is_dir()


def unpack_once(tarball: Path, target: Path, member: str | None, expect: str) -> Path:
    """Unpack ``tarball``'s top folder ``member`` to ``target`` unless ``target/expect`` exists.

    ``member=None``: the folder of the tarball that holds ``expect`` (its top, or one or two
    folders down), whatever the tarball calls it.

    Into a temporary folder beside ``target``, then one rename, so a reader never sees a
    half-unpacked tree and two processes unpacking at once both end with a complete copy.
    """
    if (target / expect).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            archive.extractall(staging, filter="data")
        if member is None:
            holders = [folder for folder in (staging, *sorted(staging.glob("*")), *sorted(staging.glob("*/*")))
                       if (folder / expect).exists()]
            unpacked = holders[0] if holders else staging
        else:
            unpacked = staging / member
        if not (unpacked / expect).exists():
            raise AlfworldDataError(f"{tarball} does not hold {member or '*'}/{expect}")
        try:
            os.rename(unpacked, target)
        except OSError:
            # Another process renamed its copy first; theirs is complete, keep it.
            if not (target / expect).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def unpack_tarball(tarball: str | Path, setting: str = "tarball") -> Path:
    """The data root of a tarball of ALFWorld games, unpacked once into ``<cache>/alfworld_data``.

    ``setting`` names where the path came from, for the error when it is no file.
    """
    tarball = Path(tarball).expanduser()
    if not tarball.is_file():
        raise AlfworldDataError(f"{setting}: no such file: {tarball}; point it at the official ALFWorld "
                                f"tarball ({TARBALL_NAME}) or unset it")
    return unpack_once(tarball, cached_root(), None, JSON_FOLDER)


def find_data_root() -> Path | None:
    """The folder holding ``json_2.1.1/``, or None when no copy of the data is found.

    In the order of the module docstring, less its step 1 (an explicit ``data_root``, see
    :func:`require_data_root`): ``$ALFWORLD_DATA``, ``$HP_AGENT_ALFWORLD_TARBALL``, the cache,
    the shared tarball.
    """
    # Checked for content, not presence: importing alfworld sets ALFWORLD_DATA to
    # ~/.cache/alfworld whenever it is unset.
    override = os.environ.get("ALFWORLD_DATA")
    if override and _holds_games(Path(override).expanduser()):
        return Path(override).expanduser()
    named = os.environ.get(TARBALL_SETTING)
    if named:
        return unpack_tarball(named, f"${TARBALL_SETTING}")
    if _holds_games(cached_root()):
        return cached_root()
    shared = shared_tarball()
    if shared is not None and shared.is_file():
        return unpack_tarball(shared)
    return None


def missing_data_message() -> str:
    """Where :func:`find_data_root` looked and how to provide the data."""
    override = os.environ.get("ALFWORLD_DATA")
    shared = shared_tarball()
    if shared is None:
        shared_line = ("$HP_AGENT_SHARED (not set; an installed hp_agent has no default shared folder, "
                       "only a source checkout falls back to <checkout>/../shared)")
    else:
        how = "$HP_AGENT_SHARED" if os.environ.get("HP_AGENT_SHARED") else "the source checkout's ../shared"
        shared_line = f"{shared} (the shared tarball, from {how})"
    looked = [
        "env kwarg data_root (not given)",
        f"$ALFWORLD_DATA={override!r} (no {JSON_FOLDER}/ in it)" if override else "$ALFWORLD_DATA (not set)",
        f"${TARBALL_SETTING} (not set)",
        f"{cached_root()} (the hp_agent cache; $HP_AGENT_CACHE moves it)",
        shared_line,
    ]
    fixes = [
        f"`export ALFWORLD_DATA=DIR`, DIR holding {JSON_FOLDER}/ (e.g. the unpacked {TARBALL_NAME}, or "
        "~/.cache/alfworld after `alfworld-download` where internet is available)",
        f"`export {TARBALL_SETTING}=PATH/{TARBALL_NAME}` (unpacked once into the cache)",
        "the env kwarg data_root, a folder or the tarball (`'env.kwargs={data_root: PATH}'`)",
        "`export HP_AGENT_SHARED=DIR`, DIR/data holding the tarball",
    ]
    return ("ALFWorld game files not found. Looked at, in order:\n  " + "\n  ".join(looked)
            + "\nFix, any one of:\n  " + "\n  ".join(fixes))


def require_data_root(data_root: str | Path | None = None) -> Path:
    """``data_root`` checked (a folder holding ``json_2.1.1/``, or a tarball of one, unpacked
    once into the cache), or the found one; raises :class:`AlfworldDataError` if none."""
    if data_root is not None:
        root = Path(data_root).expanduser()
        if root.is_file():
            return unpack_tarball(root, "data_root")
        if not _holds_games(root):
            raise AlfworldDataError(f"data_root {str(root)!r} holds no {JSON_FOLDER}/ folder; "
                                    f"pass the folder that contains {JSON_FOLDER}/ (ALFWorld's $ALFWORLD_DATA) "
                                    f"or the tarball {TARBALL_NAME}")
        return root
    root = find_data_root()
    if root is None:
        raise AlfworldDataError(missing_data_message())
    return root


def split_folder(root: Path, split: str) -> Path:
    """The ``json_2.1.1/<folder>`` that ``split`` names; clear errors for unknown or absent splits."""
    if split not in _SPLIT_FOLDERS:
        raise UserValueError(f"unknown ALFWorld split {split!r}; valid splits: {', '.join(SPLITS)}")
    candidates = [root / JSON_FOLDER / name for name in _SPLIT_FOLDERS[split]]
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise AlfworldDataError(f"split {split!r} not found: none of {', '.join(map(str, candidates))} exists")


def _playable(game_file: Path) -> bool:
    """AlfredTWEnv's filter: a game file marked solvable (movable/Sliced checked by the caller)."""
    with game_file.open() as f:
        return bool(json.load(f).get("solvable", False))


def list_games(root: str | Path, split: str) -> list[GameInfo]:
    """The playable games of ``split`` under data root ``root``, sorted by path."""
    return list(_list_games(Path(root).resolve(), split))


@lru_cache(maxsize=16)
def _list_games(root: Path, split: str) -> tuple[GameInfo, ...]:
    # Cached: every env of a rollout pool lists the same split (a JSON parse per game).
    folder = split_folder(root, split)
    games = []
    for game_file in sorted(folder.glob(f"*/*/{GAME_FILE}")):
        task_folder = game_file.parent.parent.name
        if "movable" in task_folder or "Sliced" in task_folder:
            continue  # ALFWorld does not support these tasks in text.
        long_type = task_folder.split("-", 1)[0]
        if long_type not in TASK_TYPES:
            raise AlfworldDataError(f"{game_file}: unknown task type {long_type!r}; known: {', '.join(TASK_TYPES)}")
        if not _playable(game_file):
            continue
        task_id = f"{folder.name}/{task_folder}/{game_file.parent.name}"
        games.append(GameInfo(game_file, task_id, TASK_TYPES[long_type], folder.name))
    if not games:
        raise AlfworldDataError(f"no playable games ({GAME_FILE} files) under {folder}")
    return tuple(games)


def short_task_types(task_types: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """A task type filter as short names (ALFWorld's long names accepted); None = all six."""
    if task_types is None:
        return SHORT_TASK_TYPES
    short = tuple(TASK_TYPES.get(t, t) for t in task_types)
    unknown = [t for t in short if t not in SHORT_TASK_TYPES]
    if unknown or not short:
        raise UserValueError(f"unknown task types {unknown or list(task_types)}; valid: {', '.join(SHORT_TASK_TYPES)} "
                             f"(or {', '.join(TASK_TYPES)})")
    return short


def interleave_by_type(games: list[GameInfo], task_types: tuple[str, ...]) -> list[GameInfo]:
    """Games of ``task_types``, one of each type in turn (in path order within a type),
    so that any prefix of the list is balanced across task types."""
    by_type = {t: [g for g in games if g.task_type == t] for t in task_types}
    ordered: list[GameInfo] = []
    for rank in range(max((len(v) for v in by_type.values()), default=0)):
        ordered.extend(group[rank] for group in by_type.values() if rank < len(group))
    if not ordered:
        raise AlfworldDataError(f"no games of task types {', '.join(task_types)} in this split")
    return ordered


def stored_walkthrough(game_file: str | Path) -> list[str] | None:
    """The solution stored in a game file, as released (raw engine ids in valid_unseen;
    None for games that store none, e.g. valid_train). Translate before playing it."""
    with Path(game_file).open() as f:
        walkthrough = json.load(f).get("walkthrough")
    return list(walkthrough) if walkthrough else None
