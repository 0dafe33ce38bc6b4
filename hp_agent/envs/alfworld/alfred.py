"""Source 3: ALFWorld games rebuilt from ALFRED task metadata (``json_2.1.0/<split>/.../traj_data.json``).

Exact from the record: task type and targets (``pddl_params``), floor plan, agent start
(``init_action``), every pickupable object's THOR id (its spawned position, formatted as THOR
does) and position. Approximated:

* receptacle instances of the floor plan: the wheel's vetted ones (``-openable.json``), plus
  every receptacle id any ALFRED trajectory of the same floor plan touched (``OpenObject``,
  ``PutObject``, toggles in ``plan.low_actions``; ``coordinateReceptacleObjectId`` of the
  planner's pickups, matched to a known id of that type), plus one synthesized instance of
  each receptacle type the floor plan lists but no record names (as in :mod:`.synth`);
* each object's parent receptacle: exact for objects the trajectory picks up (the planner
  records where from); otherwise the receptacle (of a type that can hold the object) whose
  known pick-up spots in the same floor plan, from all trajectories, or whose own position is
  nearest, height counted twice. On ALFWorld's own train sample this matches the official
  parent type for ~90% of objects;
* lamps (look-at tasks): ids from toggle actions, standing on the nearest table-like receptacle.

ALFWorld's filters apply: ``movable`` and ``Sliced`` tasks are skipped, and only games the
fixed handcoded expert solves within 50 steps are kept.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import alfworld.gen.constants as C

from hp_agent.envs.alfworld.layouts import (agent_start, grid_location, id_position, id_type, load_layout, make_id,
                                            receptacle_location)
from hp_agent.envs.alfworld.pddl import (STATIC_RECEPTACLES, TASK_TYPES, Receptacle, SceneObject, SceneState,
                                         TaskSpec, can_contain)
from hp_agent.envs.alfworld.synth import LAMP_SURFACES, build_receptacles
from hp_agent.errors import UserFileNotFoundError

LAMPS = ("DeskLamp", "FloorLamp")
HEIGHT_WEIGHT = 2.0  # vertical distance counts this much more than horizontal in parent matching
SAME_ID_TOLERANCE = 0.05  # metres: planner coordinates (x4, rounded) vs the real id


class SkipTrial(Exception):
    """The trial is not rebuilt (ALFWorld skips it too)."""


def skip_reason(traj_path: Path) -> str | None:
    folder = str(Path(traj_path).parent.parent.name)
    if "movable" in folder or "Sliced" in folder:
        return "movable or sliced task (ALFWorld skips these)"
    if folder.split("-")[0] not in TASK_TYPES:
        return f"task type {folder.split('-')[0]} not supported"
    return None


def scene_of(traj_path: Path) -> int:
    return int(Path(traj_path).parent.parent.name.rsplit("-", 1)[1])


def _coord_pos(coords: list[float]) -> tuple[float, float, float]:
    # planner coordinates are (x, x, z, z, y, y) in grid units (x4)
    return coords[0] / 4, coords[4] / 4, coords[2] / 4


def _dist(a, b, w: float = HEIGHT_WEIGHT) -> float:
    return math.sqrt((a[0] - b[0]) ** 2 + (a[2] - b[2]) ** 2 + (w * (a[1] - b[1])) ** 2)


class AlfredCatalog:
    """Index of an unpacked ALFRED folder; pools what all trajectories of a floor plan reveal."""

    def __init__(self, root: Path):
        root = Path(root)
        self.root = root / "json_2.1.0" if (root / "json_2.1.0").is_dir() else root
        if not self.root.is_dir():
            raise UserFileNotFoundError(f"ALFRED folder {root} not found")
        self._scenes: dict[int, dict] | None = None

    def trials(self, split: str) -> list[Path]:
        base = self.root / split
        if not base.is_dir():
            raise UserFileNotFoundError(f"no ALFRED split {split!r} under {self.root}")
        return sorted(base.glob("*/*/traj_data.json"))

    def _scan(self) -> dict[int, dict]:
        scenes: dict[int, dict] = defaultdict(lambda: {"ids": set(), "coords": [], "lamps": set(), "picks": []})
        for path in sorted(self.root.glob("*/*/*/traj_data.json")):
            if skip_reason(path) and "Sliced" in path.parent.parent.name:
                continue  # sliced objects have ids of their own
            traj = json.loads(path.read_text())
            info = scenes[int(traj["scene"]["scene_num"])]
            for step in traj["plan"]["low_actions"]:
                a = step["api_action"]
                for key in ("objectId", "receptacleObjectId"):
                    oid = a.get(key)
                    if not oid:
                        continue
                    if id_type(oid) in STATIC_RECEPTACLES:
                        info["ids"].add(oid)
                    elif id_type(oid) in LAMPS:
                        info["lamps"].add(oid)
            moved = set()
            for h in traj["plan"]["high_pddl"]:
                pa = h["planner_action"]
                if pa["action"] == "PickupObject" and "coordinateReceptacleObjectId" in pa:
                    rtype, coords = pa["coordinateReceptacleObjectId"]
                    if pa["objectId"] not in moved and rtype in STATIC_RECEPTACLES:
                        info["coords"].append((rtype, _coord_pos(coords)))
                        info["picks"].append((id_position(pa["objectId"]), rtype, _coord_pos(coords)))
                if pa["action"] in ("PickupObject", "PutObject"):
                    moved.add(pa.get("objectId"))
        return scenes

    def scene_info(self, scene: int) -> dict:
        """Picklable pooled facts of one floor plan: receptacle ids, lamp ids, labelled pick-up spots."""
        if self._scenes is None:
            self._scenes = self._scan()
        raw = self._scenes.get(scene, {"ids": set(), "coords": [], "lamps": set(), "picks": []})
        layout = load_layout(scene)
        ids = set(raw["ids"]) | {r for r in layout.vetted if id_type(r) in STATIC_RECEPTACLES}
        resolved = {}
        for rtype, pos in raw["coords"]:
            resolved[(rtype, pos)] = _resolve(ids, rtype, pos)
        picks = [(pos, resolved[(rtype, rpos)]) for pos, rtype, rpos in raw["picks"]]
        return {"scene": scene, "receptacles": sorted(ids), "lamps": sorted(raw["lamps"]), "picks": picks}


def _resolve(ids: set[str], rtype: str, pos: tuple[float, float, float]) -> str:
    """Receptacle id for planner coordinates: a known id of that type when close, else a new one."""
    basin = rtype in ("SinkBasin", "BathtubBasin")
    same = sorted((_dist(pos, id_position(k), 1.0), k) for k in ids if id_type(k) == rtype)
    if same and (same[0][0] < SAME_ID_TOLERANCE or (basin and same[0][0] < 1.0)):
        return same[0][1]
    rid = make_id(rtype[:-5], *pos) + "|" + rtype if basin else make_id(rtype, *pos)
    ids.add(rid)
    return rid


@dataclass
class Rebuilt:
    trial: str
    task: TaskSpec
    state: SceneState
    task_desc: str
    provenance: dict


def _parent(t: str, pos, recs: list[Receptacle], picks: list) -> tuple[str | None, str]:
    holders = {r.id for r in recs if can_contain(r.type, t)}
    if not holders:
        return None, "none"
    score = {r: _dist(pos, id_position(r)) for r in holders}
    for ppos, rid in picks:
        if rid in holders:
            score[rid] = min(score[rid], _dist(pos, ppos))
    best = min(sorted(score), key=score.get)
    return best, "geometry"


def rebuild(traj_path: Path, scene_info: dict) -> Rebuilt:
    """Scene state and task of one ALFRED trial (raises :class:`SkipTrial`)."""
    reason = skip_reason(traj_path)
    if reason:
        raise SkipTrial(reason)
    traj = json.loads(Path(traj_path).read_text())
    task = TaskSpec.from_traj(traj)
    sc = traj["scene"]
    scene = int(sc["scene_num"])
    layout = load_layout(scene)
    init = sc["init_action"]
    agent_y = float(init.get("y", 0.9009))
    recs = [Receptacle(rid, id_type(rid), receptacle_location(layout, rid, agent_y),
                       id_type(rid) in C.OPENABLE_CLASS_SET and rid in layout.vetted)
            for rid in scene_info["receptacles"]]
    have = {r.type for r in recs}
    extra = [r for r in build_receptacles(layout, random.Random(f"alfred-scene-{scene}"), agent_y)
             if r.type not in have]
    recs += extra
    by_id = {r.id: r for r in recs}

    # exact parents of the objects this trajectory picks up
    known_parent: dict[str, str] = {}
    moved = set()
    for h in traj["plan"]["high_pddl"]:
        pa = h["planner_action"]
        if pa["action"] == "PickupObject" and "coordinateReceptacleObjectId" in pa and pa["objectId"] not in moved:
            rtype, coords = pa["coordinateReceptacleObjectId"]
            rid = _resolve(set(by_id), rtype, _coord_pos(coords))
            if rid in by_id:
                known_parent[pa["objectId"]] = rid
        if pa["action"] in ("PickupObject", "PutObject"):
            moved.add(pa.get("objectId"))

    objects: list[SceneObject] = []
    how: dict[str, int] = defaultdict(int)
    seen = set()
    for pose in sc["object_poses"]:
        t = pose["objectName"].split("_")[0]
        if t not in C.OBJECTS_SET:
            continue
        pos = (pose["position"]["x"], pose["position"]["y"], pose["position"]["z"])
        oid = make_id(t, *pos)
        if oid in seen:
            continue
        seen.add(oid)
        if oid in known_parent:
            parent, src = known_parent[oid], "trajectory"
        else:
            parent, src = _parent(t, pos, recs, scene_info["picks"])
        how[src] += 1
        loc = by_id[parent].loc if parent else grid_location(layout, pos, t, agent_y=agent_y)
        objects.append(SceneObject(oid, t, loc, parent))
    surfaces = [r for r in recs if r.type in LAMP_SURFACES]
    for lamp in scene_info["lamps"]:
        t = id_type(lamp)
        pos = id_position(lamp)
        parent = None
        if t == "DeskLamp" and surfaces:
            parent = min(surfaces, key=lambda r: (_dist(pos, id_position(r.id), 0.0), r.id)).id
        loc = by_id[parent].loc if parent else grid_location(layout, pos, t, agent_y=agent_y)
        objects.append(SceneObject(lamp, t, loc, parent))

    agent = agent_start(init["x"], init["z"], init.get("rotation", 0), init.get("horizon", 30))
    state = SceneState(scene, recs, objects, agent, dict(init))
    rng = random.Random(traj["task_id"])
    provenance = {"split": Path(traj_path).parent.parent.parent.name, "task_id": traj["task_id"],
                  "parents": dict(how), "synthesized_receptacles": [r.id for r in extra]}
    return Rebuilt(traj["task_id"], task, state, task.description(rng), provenance)
