"""Write (and read back) ALFWorld game files: PDDL problem, ``game.tw-pddl`` and ``traj_data.json``.

Shared by the offline game sources (:mod:`.synth`, :mod:`.alfred`). The problem text mirrors
ALFWorld's ``initial_state.pddl``: type constants, escaped THOR ids, ``loc|x|z|rot|horizon``
locations, the same ``:init`` predicates (``canContain`` per receptacle instance, properties from
``alfworld.gen.constants``) and the goal from ``alfworld.gen.goal_library``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import alfworld.gen.constants as C
import alfworld.gen.goal_library as glib

DATA_DIR = Path(C.__file__).parent.parent / "data"
TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")

STATIC_RECEPTACLES = frozenset(C.RECEPTACLES - C.MOVABLE_RECEPTACLES_SET)
OBJECT_TYPE_CONSTANTS = tuple(sorted(C.OBJECTS_SET - STATIC_RECEPTACLES))
RECEPTACLE_TYPE_CONSTANTS = tuple(sorted(STATIC_RECEPTACLES))
# Pickupable in THOR: everything that has a valid receptacle, plus four that have none.
PICKUPABLE = frozenset(set().union(*C.VAL_RECEPTACLE_OBJECTS.values()) & C.OBJECTS_SET) | {
    "PaperTowelRoll", "ScrubBrush", "TeddyBear", "Boots"}
PROPERTIES = (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable"),
              ("toggleable", "Toggleable"), ("sliceable", "Sliceable"))
_ESC = (("|", "_bar_"), ("-", "_minus_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_"))


def escape(name: str) -> str:
    for a, b in _ESC:
        name = name.replace(a, b)
    return name


def unescape(name: str) -> str:
    for a, b in _ESC:
        name = name.replace(b, a)
    return name


def loc_name(loc: tuple[int, int, int, int]) -> str:
    return "loc|%d|%d|%d|%d" % tuple(loc)


def can_contain(recep_type: str, obj_type: str) -> bool:
    return obj_type in C.VAL_RECEPTACLE_OBJECTS.get(recep_type, ())


@dataclass(frozen=True)
class TaskSpec:
    """One ALFWorld task: type and ``pddl_params`` targets (ALFRED class names, e.g. ``Apple``)."""

    task_type: str
    object_target: str
    parent_target: str = ""
    toggle_target: str = ""
    mrecep_target: str = ""
    object_sliced: bool = False

    @classmethod
    def from_traj(cls, traj: dict) -> "TaskSpec":
        p = traj["pddl_params"]
        return cls(traj["task_type"], p["object_target"], p.get("parent_target") or "",
                   p.get("toggle_target") or "", p.get("mrecep_target") or "", bool(p.get("object_sliced")))

    def pddl_params(self) -> dict:
        return {"mrecep_target": self.mrecep_target, "object_sliced": self.object_sliced,
                "object_target": self.object_target, "parent_target": self.parent_target,
                "toggle_target": self.toggle_target}

    def folder(self, scene: int) -> str:
        recep = self.toggle_target if self.task_type == "look_at_obj_in_light" else self.parent_target
        obj = self.object_target + ("Sliced" if self.object_sliced else "")
        return f"{self.task_type}-{obj}-{self.mrecep_target or 'None'}-{recep}-{scene}"

    def goal_pddl(self) -> str:
        key = self.task_type + ("_slice" if self.object_sliced else "")
        text = glib.gdict[key]["pddl"].format(obj=self.object_target, recep=self.parent_target,
                                              toggle=self.toggle_target, mrecep=self.mrecep_target)
        return text.replace("#", "-")

    def goal_types(self) -> dict[str, str]:
        """Type constants the goal mentions -> 'object' / 'receptacle'."""
        out = {self.object_target: "object"}
        if self.task_type == "look_at_obj_in_light":
            out[self.toggle_target] = "object"
        else:
            out[self.parent_target] = "receptacle"
        if self.mrecep_target:
            out[self.mrecep_target] = "object"
        return out

    def description(self, rng: random.Random) -> str:
        key = self.task_type + ("_slice" if self.object_sliced else "")
        template = rng.choice(glib.gdict[key]["templates"])
        return template.format(obj=self.object_target.lower(), recep=self.parent_target.lower(),
                               toggle=self.toggle_target.lower(), mrecep=self.mrecep_target.lower())


@dataclass
class Receptacle:
    id: str                         # THOR id, e.g. "Cabinet|+00.68|+00.50|-02.20"
    type: str
    loc: tuple[int, int, int, int]
    openable: bool = False


@dataclass
class SceneObject:
    id: str
    type: str
    loc: tuple[int, int, int, int]
    parent: str | None = None       # receptacle id


@dataclass
class SceneState:
    """Initial state of one game: receptacles, objects and their parents, agent pose."""

    scene: int
    receptacles: list[Receptacle]
    objects: list[SceneObject]
    agent_loc: tuple[int, int, int, int]
    init_action: dict = field(default_factory=dict)

    def recep(self, rid: str) -> Receptacle:
        return next(r for r in self.receptacles if r.id == rid)


def check_game(state: SceneState, task: TaskSpec) -> list[str]:
    """Reasons the problem would be broken or trivially won (empty list: fine).

    Every type constant of the goal must be the type of some instance, else textworld fails
    with ``KeyError: 'val1'``; the goal must be reachable in principle and not already true.
    """
    problems = []
    if task.task_type not in TASK_TYPES:
        problems.append(f"unsupported task type {task.task_type}")
    rtypes = {r.type for r in state.receptacles}
    otypes = {o.type for o in state.objects}
    for name, kind in task.goal_types().items():
        if not name:
            problems.append(f"empty {kind} target")
        elif name not in (otypes if kind == "object" else rtypes):
            problems.append(f"goal {kind} type {name} has no instance (textworld KeyError 'val1')")
    if problems:
        return problems
    targets = [o for o in state.objects if o.type == task.object_target]
    reachable = [o for o in targets if o.type in PICKUPABLE and o.parent is not None]
    need = 2 if task.task_type == "pick_two_obj_and_place" else 1
    if len(reachable) < need:
        problems.append(f"fewer than {need} reachable {task.object_target}")
    if task.task_type == "look_at_obj_in_light":
        if not any(o.type == task.toggle_target and o.parent for o in state.objects):
            problems.append(f"no {task.toggle_target} standing on a receptacle")
    else:
        if not can_contain(task.parent_target, task.object_target):
            problems.append(f"{task.parent_target} cannot contain {task.object_target}")
        device = {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
                  "pick_cool_then_place_in_recep": "Fridge"}.get(task.task_type)
        if device and device not in rtypes:
            problems.append(f"no {device} for {task.task_type}")
        flag = {"pick_clean_then_place_in_recep": "Cleanable", "pick_heat_then_place_in_recep": "Heatable",
                "pick_cool_then_place_in_recep": "Coolable"}.get(task.task_type)
        if flag and task.object_target not in C.VAL_ACTION_OBJECTS[flag]:
            problems.append(f"{task.object_target} is not {flag.lower()}")
        if task.task_type in ("pick_and_place_simple", "pick_two_obj_and_place"):
            rt = {r.id: r.type for r in state.receptacles}
            inside = sum(1 for o in targets if o.parent and rt.get(o.parent) == task.parent_target)
            if inside >= need:
                problems.append("goal already satisfied")
    return problems


def write_problem(state: SceneState, task: TaskSpec, problem_id: str) -> str:
    """PDDL problem text in the layout of ALFWorld's ``initial_state.pddl``."""
    objs = [o for o in state.objects if o.type in C.OBJECTS_SET]
    present = {o.type for o in objs}
    locs = sorted({r.loc for r in state.receptacles} | {o.loc for o in objs} | {state.agent_loc})
    ind = "\n        "
    header = ["(define (problem plan_%s)" % problem_id, "(:domain alfred)", "(:objects", "agent1 - agent",
              ind.join(f"{t} - object" for t in OBJECT_TYPE_CONSTANTS),
              ind.join(f"{t}Type - otype" for t in OBJECT_TYPE_CONSTANTS),
              ind.join(f"{t}Type - rtype" for t in RECEPTACLE_TYPE_CONSTANTS), ""]
    decl = [f"{escape(o.id)} - object" for o in objs]
    decl += [f"{escape(r.id)} - receptacle" for r in state.receptacles]
    decl += [f"{escape(loc_name(lc))} - location" for lc in locs]
    init = [f"(receptacleType {escape(r.id)} {r.type}Type)" for r in state.receptacles]
    init += [f"(objectType {escape(o.id)} {o.type}Type)" for o in objs]
    for r in state.receptacles:
        init += [f"(canContain {r.type}Type {t}Type)" for t in sorted(C.VAL_RECEPTACLE_OBJECTS.get(r.type, ()))
                 if t in present]
    init += [f"(pickupable {escape(o.id)})" for o in objs if o.type in PICKUPABLE]
    init += [f"(isReceptacleObject {escape(o.id)})" for o in objs if o.type in C.MOVABLE_RECEPTACLES_SET]
    init += [f"(openable {escape(r.id)})" for r in state.receptacles if r.openable]
    init.append(f"(atLocation agent1 {escape(loc_name(state.agent_loc))})")
    for pred, key in PROPERTIES:
        init += [f"({pred} {escape(o.id)})" for o in objs if o.type in C.VAL_ACTION_OBJECTS[key]]
    init += [f"(inReceptacle {escape(o.id)} {escape(o.parent)})" for o in objs if o.parent]
    init += [f"(receptacleAtLocation {escape(r.id)} {escape(loc_name(r.loc))})" for r in state.receptacles]
    init += [f"(objectAtLocation {escape(o.id)} {escape(loc_name(o.loc))})" for o in objs]
    return ("\n".join(header) + ind + ind.join(decl) + "\n        )\n    \n\n(:init\n\n" + ind + ind.join(init)
            + "\n        )\n    \n" + task.goal_pddl())


@lru_cache(maxsize=None)
def domain_text() -> str:
    return (DATA_DIR / "alfred.pddl").read_text()


@lru_cache(maxsize=None)
def grammar_template() -> str:
    return (DATA_DIR / "alfred.twl2").read_text()


def game_data(problem: str, task_desc: str, walkthrough: list[str] | None = None, solvable: bool = True) -> dict:
    """Contents of ``game.tw-pddl``."""
    grammar = grammar_template().replace("UNKNOWN GOAL", task_desc)
    return {"pddl_domain": domain_text(), "grammar": grammar, "pddl_problem": problem,
            "solvable": solvable, "walkthrough": list(walkthrough or [])}


def traj_data(task: TaskSpec, state: SceneState, task_id: str, task_desc: str, source: str, **extra) -> dict:
    """Contents of ``traj_data.json`` (the fields ALFWorld's loader and expert read)."""
    scene = {"floor_plan": f"FloorPlan{state.scene}", "scene_num": state.scene,
             "init_action": state.init_action or {"action": "TeleportFull", "horizon": state.agent_loc[3],
                                                  "rotateOnTeleport": True, "rotation": state.agent_loc[2] * 90,
                                                  "x": state.agent_loc[0] * 0.25, "z": state.agent_loc[1] * 0.25}}
    out = {"task_id": task_id, "task_type": task.task_type, "pddl_params": task.pddl_params(), "scene": scene,
           "turk_annotations": {"anns": [{"task_desc": task_desc[:1].upper() + task_desc[1:] + ".",
                                          "high_descs": []}]},
           "source": source}
    out.update(extra)
    return out


# ---------------------------------------------------------------------------------------------
# Reading problems back (for validation and for comparing with official initial_state.pddl).

_FACT = re.compile(r"\((\w+) ([^()]*?)\)")


@dataclass
class ParsedProblem:
    receptacles: dict[str, str]                 # id -> type
    recep_locs: dict[str, str]                  # id -> loc string
    objects: dict[str, str]                     # id -> type (objects with an objectType)
    parents: dict[str, str]                     # object id -> receptacle id
    openable: set[str]
    agent_loc: str
    goal: str

    def parent_type(self, obj_id: str) -> str | None:
        p = self.parents.get(obj_id)
        return self.receptacles.get(p) if p else None


def parse_problem(text: str) -> ParsedProblem:
    """Parse an ALFWorld problem (ids unescaped back to THOR ids)."""
    body, _, goal = text.partition("(:goal")
    init = body.split("(:init", 1)[1] if "(:init" in body else ""
    facts: dict[str, list[list[str]]] = {}
    for m in _FACT.finditer(init):
        facts.setdefault(m.group(1), []).append([unescape(a) for a in m.group(2).split()])

    def pairs(name):
        return {a[0]: a[1] for a in facts.get(name, []) if len(a) == 2}

    rtypes = {k: v[:-4] for k, v in pairs("receptacleType").items()}
    otypes = {k: v[:-4] for k, v in pairs("objectType").items()}
    agent = next((a[1] for a in facts.get("atLocation", []) if a[0] == "agent1"), "")
    return ParsedProblem(rtypes, pairs("receptacleAtLocation"), otypes, pairs("inReceptacle"),
                         {a[0] for a in facts.get("openable", [])}, agent, "(:goal" + goal)
