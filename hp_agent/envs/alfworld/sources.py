"""Which folder of ALFWorld games an env plays: official, synthesized or rebuilt from ALFRED.

All three sources use ALFWorld's folder layout (``<root>/json_2.1.1/<split>/...``), so once a
root is chosen :mod:`hp_agent.envs.alfworld.data` lists its games the same way.

* ``official``: ``$ALFWORLD_DATA`` or the shared tarball (:func:`data.find_data_root`).
* ``synth``:    games synthesized from the alfworld wheel into ``<cache>/alfworld_synth``;
  a missing split is built on first use (:func:`ensure_synthesized`), once, under a file
  lock, so parallel env workers wait for one builder instead of racing.
* ``alfred``:   games rebuilt from ALFRED task records into ``<cache>/alfworld_alfred`` by
  ``hp-agent data alfworld --from-alfred DIR``.
* ``auto`` (the default): official games where they are found; otherwise synthesized ones
  for ``train``. For the evaluation splits (``id``, ``ood``) ``auto`` does not substitute
  silently: results on synthesized games are not comparable with published ALFWorld
  numbers, so the error says how to get the official games and how to ask for the
  synthesized stand-in explicitly.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

from hp_agent.envs.alfworld.data import (
    JSON_FOLDER,
    AlfworldDataError,
    find_data_root,
    missing_data_message,
    require_data_root,
)
from hp_agent.errors import UserValueError
from hp_agent.paths import cache_root

SOURCES = ("auto", "official", "synth", "alfred")
MANIFEST = "builds.json"  # per split folder: the game count last asked of the builder


def synth_root() -> Path:
    """Where synthesized games live: ``<cache>/alfworld_synth``."""
    return cache_root() / "alfworld_synth"


def alfred_root() -> Path:
    """Where games rebuilt from ALFRED records live: ``<cache>/alfworld_alfred``."""
    return cache_root() / "alfworld_alfred"


def resolve_data_root(split: str, source: str = "auto", data_root: str | Path | None = None,
                      num_games: int | None = None) -> Path:
    """The data root an env of ``split`` plays, building synthesized games where needed.

    ``data_root`` (a folder holding ``json_2.1.1/``) wins over ``source``.
    """
    if data_root is not None:
        return require_data_root(data_root)
    if source not in SOURCES:
        raise UserValueError(f"unknown ALFWorld source {source!r}; valid: {', '.join(SOURCES)}")
    if source in ("auto", "official"):
        root = find_data_root()
        if root is not None:
            return root
        if source == "official" or split != "train":
            raise AlfworldDataError(missing_data_message() + "\n" + stand_in_hint(split))
    if source == "alfred":
        root = alfred_root()
        if not (root / JSON_FOLDER).is_dir():
            raise AlfworldDataError(f"no games rebuilt from ALFRED in {root}; build them with "
                                    "`hp-agent data alfworld --from-alfred DIR` (DIR: ALFRED's json_2.1.0 folder "
                                    "or alfred_json_2.1.0_trimmed.tar.gz)")
        return root
    return ensure_synthesized(split, num_games)


def stand_in_hint(split: str) -> str:
    """Which synthesized split can stand in for an official one, and how to ask for it."""
    from hp_agent.envs.alfworld.synth import split_folder

    try:
        folder = split_folder(split)
    except ValueError:
        return ""
    rooms = "the four valid_unseen floor plans" if folder == "valid_unseen" else "ALFRED's seen floor plans"
    return (f"Stand-in without the official games: synthesized {folder} games ({rooms}; built from the alfworld "
            f"wheel, ~4 s a game): `hp-agent eval --env alfworld --split {split} --source synth`, or "
            "env kwarg source='synth'. Their success rates are not comparable with published ALFWorld results.")


def _requested(root: Path) -> dict[str, int]:
    path = root / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def ensure_synthesized(split: str, num_games: int | None = None, workers: int | None = None) -> Path:
    """Build the synthesized ``split`` (``num_games`` games, default the builder's count)
    unless an earlier build already asked for at least that many; returns the root."""
    from hp_agent.envs.alfworld.build import DEFAULT_SYNTH_COUNTS, build_games
    from hp_agent.envs.alfworld.synth import split_folder
    from hp_agent.files import atomic_write_text

    folder = split_folder(split)
    wanted = num_games or DEFAULT_SYNTH_COUNTS[{"valid_seen": "id", "valid_unseen": "ood"}.get(folder, folder)]
    root = synth_root()
    if _requested(root).get(folder, 0) >= wanted:
        return root
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the games built
        requested = _requested(root)
        if requested.get(folder, 0) < wanted:
            workers = workers or min(4, os.cpu_count() or 1)
            print(f"ALFWorld: building {wanted} synthesized {folder} games into {root} (once; about 4 s a game "
                  f"per worker, {workers} workers)", file=sys.stderr, flush=True)
            build_games(root, source="synth", splits=[split], counts={split: wanted}, workers=workers)
            atomic_write_text(root / MANIFEST, json.dumps({**requested, folder: wanted}, indent=1))
    return root


def source_of(root: Path) -> str:
    """Which source ``root`` holds, in words."""
    root = Path(root)
    if root == synth_root():
        return f"synthesized from the alfworld wheel ({root})"
    if root == alfred_root():
        return f"rebuilt from ALFRED task records ({root})"
    if os.environ.get("ALFWORLD_DATA") and Path(os.environ["ALFWORLD_DATA"]).expanduser() == root:
        return f"official, $ALFWORLD_DATA ({root})"
    if root == cache_root() / "alfworld_data":
        return f"official, the shared tarball unpacked to {root}"
    return str(root)
