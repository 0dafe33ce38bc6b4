"""Fidelity of the offline ALFWorld game sources against the official games.

Builds valid_seen and valid_unseen with source 2 (synthesized from the alfworld wheel) and
source 3 (rebuilt from ALFRED metadata) into a cache folder (idempotent: a second run reuses
the games), then compares with the official ``initial_state.pddl`` / ``game.tw-pddl``:

* source 3, per trial (same trial ids): receptacle instances (exact THOR ids), object
  placements (parent receptacle type and instance), agent start, receptacle locations,
  which trials end up as solvable games, walkthrough and expert lengths;
* source 2, per floor plan: receptacle instances, distribution of parent receptacle types per
  object type (overlap = sum of min of the two distributions), plan length distributions.

Usage: .venv/bin/python scripts/alfworld_fidelity.py [--cache DIR] [--workers 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import glob
import json
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from hp_agent.envs.alfworld import alfred, synth
from hp_agent.envs.alfworld.build import build_games
from hp_agent.envs.alfworld.data import shared_dir, unpack_once
from hp_agent.envs.alfworld.layouts import load_layout
from hp_agent.envs.alfworld.pddl import TASK_TYPES, loc_name, parse_problem

SHARED = shared_dir() / "data"
SPLITS = ("valid_seen", "valid_unseen")


def official_trials(official: Path, split: str) -> dict[str, Path]:
    return {Path(p).parent.name: Path(p).parent
            for p in glob.glob(str(official / "json_2.1.1" / split / "*" / "*" / "initial_state.pddl"))}


def games(root: Path, split: str) -> dict[str, dict]:
    out = {}
    for p in glob.glob(str(root / "json_2.1.1" / split / "*" / "*" / "game.tw-pddl")):
        p = Path(p)
        traj = json.loads((p.parent / "traj_data.json").read_text())
        out[p.parent.name] = {"game": json.loads(p.read_text()), "traj": traj, "dir": p.parent}
    return out


def official_expert_steps(official: Path, split: str, cache: Path) -> dict[str, int | None]:
    """Fixed expert on the official games (steps to win, None if not within 50); cached."""
    from hp_agent.envs.alfworld.engine import AlfworldGame
    from hp_agent.envs.alfworld.gamecheck import run_expert

    path = cache / f"official_expert_{split}.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    for trial, d in sorted(official_trials(official, split).items()):
        if trial in done or not (d / "game.tw-pddl").exists():
            continue
        game = AlfworldGame(d / "game.tw-pddl")
        try:
            ok, actions, _ = run_expert(game, seed=0)
        finally:
            game.close()
        done[trial] = len(actions) if ok else None
        path.write_text(json.dumps(done))
    return done


def mean(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.mean(xs), 2) if xs else None


def frac(n, d):
    return round(n / d, 3) if d else None


def compare_alfred(official: Path, alfred_root: Path, games_root: Path, split: str, off_expert: dict) -> dict:
    """Source 3 vs official, trial by trial."""
    cat = alfred.AlfredCatalog(alfred_root)
    trials = {p.parent.name: p for p in cat.trials(split)}
    offi = official_trials(official, split)
    ours = games(games_root, split)
    c = Counter()
    wt_pairs, ex_pairs = [], []
    for trial, odir in sorted(offi.items()):
        path = trials.get(trial)
        if path is None or alfred.skip_reason(path):
            continue
        op = parse_problem((odir / "initial_state.pddl").read_text())
        built = alfred.rebuild(path, cat.scene_info(alfred.scene_of(path)))
        st = built.state
        c["trials"] += 1
        our_r = {r.id: r for r in st.receptacles}
        common = set(our_r) & set(op.receptacles)
        c["rec_official"] += len(op.receptacles)
        c["rec_ours"] += len(our_r)
        c["rec_common"] += len(common)
        c["rec_loc_same"] += sum(loc_name(our_r[r].loc) == op.recep_locs.get(r) for r in common)
        otc, utc = Counter(op.receptacles.values()), Counter(r.type for r in st.receptacles)
        c["rtype_slots"] += len(set(otc) | set(utc))
        c["rtype_count_equal"] += sum(otc[t] == utc[t] for t in set(otc) | set(utc))
        our_o = {o.id: o for o in st.objects}
        pick = [o for o in op.objects if op.objects[o] in synth.PICKUPABLE]
        c["obj_official"] += len(pick)
        c["obj_found"] += sum(o in our_o for o in pick)
        for o in pick:
            if o not in our_o:
                continue
            mine = our_o[o].parent
            c["obj_parent_type"] += (our_r[mine].type if mine else None) == op.parent_type(o)
            c["obj_parent_inst"] += mine == op.parents.get(o)
        c["agent_same"] += loc_name(st.agent_loc) == op.agent_loc
        has_game = (odir / "game.tw-pddl").exists()
        kept = trial in ours
        c[f"kept_{'off' if has_game else 'nooff'}_{'ours' if kept else 'noours'}"] += 1
        if has_game and kept:
            owt = json.loads((odir / "game.tw-pddl").read_text())["walkthrough"]
            wt_pairs.append((len(owt), len(ours[trial]["game"]["walkthrough"])))
            if off_expert.get(trial) is not None:
                ex_pairs.append((off_expert[trial], ours[trial]["traj"].get("expert_steps")))
    return {
        "trials_compared": c["trials"],
        "receptacle_recall": frac(c["rec_common"], c["rec_official"]),
        "receptacle_precision": frac(c["rec_common"], c["rec_ours"]),
        "receptacle_type_count_agreement": frac(c["rtype_count_equal"], c["rtype_slots"]),
        "receptacle_location_agreement": frac(c["rec_loc_same"], c["rec_common"]),
        "object_id_coverage": frac(c["obj_found"], c["obj_official"]),
        "object_parent_type_match": frac(c["obj_parent_type"], c["obj_found"]),
        "object_parent_instance_match": frac(c["obj_parent_inst"], c["obj_found"]),
        "agent_start_match": frac(c["agent_same"], c["trials"]),
        "games": {"official_and_ours": c["kept_off_ours"], "official_only": c["kept_off_noours"],
                  "ours_only": c["kept_nooff_ours"], "neither": c["kept_nooff_noours"]},
        "walkthrough_len_equal": frac(sum(a == b for a, b in wt_pairs), len(wt_pairs)),
        "walkthrough_len_mean_official_vs_ours": (mean([a for a, _ in wt_pairs]), mean([b for _, b in wt_pairs])),
        "expert_steps_mean_official_vs_ours": (mean([a for a, _ in ex_pairs]), mean([b for _, b in ex_pairs])),
        "expert_steps_equal": frac(sum(a == b for a, b in ex_pairs), len(ex_pairs)),
    }


def _parent_dists(pairs) -> dict:
    d = defaultdict(Counter)
    for scene, otype, ptype in pairs:
        d[(scene, otype)][ptype] += 1
    return d


def _overlap(official_pairs, our_pairs, pooled: bool = False) -> tuple[float | None, float | None]:
    """Object-weighted overlap (sum of min) of parent-type distributions per (scene, object type),
    or per object type over all scenes when ``pooled``; also the share of objects compared."""
    if pooled:
        official_pairs = [(0, t, p) for _, t, p in official_pairs]
        our_pairs = [(0, t, p) for _, t, p in our_pairs]
    od, ud = _parent_dists(official_pairs), _parent_dists(our_pairs)
    overlap = total = present = 0
    for key, oc in od.items():
        n = sum(oc.values())
        total += n
        uc = ud.get(key)
        if not uc:
            continue
        present += n
        un = sum(uc.values())
        overlap += n * sum(min(oc[k] / n, uc[k] / un) for k in set(oc) | set(uc))
    return frac(overlap, total), frac(present, total)


def official_pairs(official: Path, split: str) -> list[tuple]:
    out = []
    for odir in official_trials(official, split).values():
        p = parse_problem((odir / "initial_state.pddl").read_text())
        scene = int(odir.parent.name.rsplit("-", 1)[1])
        out += [(scene, t, p.parent_type(o)) for o, t in p.objects.items() if t in synth.PICKUPABLE]
    return out


def compare_synth(official: Path, games_root: Path, split: str, samples: int = 30) -> dict:
    """Source 2 vs official, floor plan by floor plan."""
    offi = official_trials(official, split)
    by_scene = defaultdict(list)
    for trial, odir in offi.items():
        by_scene[int(odir.parent.name.rsplit("-", 1)[1])].append(parse_problem((odir / "initial_state.pddl").read_text()))
    c = Counter()
    off_pairs, our_pairs = [], []
    for scene, probs in sorted(by_scene.items()):
        layout = load_layout(scene)
        off_recs = {}
        for p in probs:
            off_recs.update(p.receptacles)
            off_pairs += [(scene, t, p.parent_type(o)) for o, t in p.objects.items() if t in synth.PICKUPABLE]
        rng = random.Random(f"fidelity-{scene}")
        recs = synth.build_receptacles(layout, rng)
        ids = {r.id for r in recs}
        c["rec_official"] += len(off_recs)
        c["rec_ours"] += len(ids)
        c["rec_common"] += len(ids & set(off_recs))
        otc, utc = Counter(off_recs.values()), Counter(r.type for r in recs)
        c["rtype_slots"] += len(set(otc) | set(utc))
        c["rtype_count_equal"] += sum(otc[t] == utc[t] for t in set(otc) | set(utc))
        for tt in TASK_TYPES:
            if not synth.scene_supports(tt, layout):
                continue
            tasks = synth.candidate_tasks(tt, layout)
            for _ in range(max(1, samples // len(TASK_TYPES))):
                if not tasks:
                    break
                st = synth.build_state(layout, rng.choice(tasks), rng)
                rt = {r.id: r.type for r in st.receptacles}
                our_pairs += [(scene, o.type, rt.get(o.parent)) for o in st.objects if o.type in synth.PICKUPABLE]
    per_scene, covered = _overlap(off_pairs, our_pairs)
    pooled, _ = _overlap(off_pairs, our_pairs, pooled=True)
    ceiling = None
    if split == "valid_seen":  # two samples of ALFWorld's own process, same floor plans
        train_pairs = official_pairs(official, "valid_train")
        scenes = {s for s, _, _ in train_pairs}
        ceiling, _ = _overlap([x for x in off_pairs if x[0] in scenes], train_pairs)
    ours = games(games_root, {"valid_seen": "valid_seen", "valid_unseen": "valid_unseen"}[split])
    off_games = [json.loads((d / "game.tw-pddl").read_text()) for d in offi.values() if (d / "game.tw-pddl").exists()]
    return {
        "scenes_compared": len(by_scene),
        "receptacle_recall": frac(c["rec_common"], c["rec_official"]),
        "receptacle_precision": frac(c["rec_common"], c["rec_ours"]),
        "receptacle_type_count_agreement": frac(c["rtype_count_equal"], c["rtype_slots"]),
        "object_types_covered": covered,
        "parent_type_overlap_per_scene": per_scene,
        "parent_type_overlap_pooled_over_scenes": pooled,
        "parent_type_overlap_official_train_vs_this_split": ceiling,
        "walkthrough_len_mean_official_vs_ours": (mean([len(g["walkthrough"]) for g in off_games]),
                                                  mean([len(g["game"]["walkthrough"]) for g in ours.values()])),
        "expert_steps_mean_ours": mean([g["traj"].get("expert_steps") for g in ours.values()]),
        "games_ours": len(ours),
        "task_types_ours": dict(Counter(g["traj"]["task_type"] for g in ours.values())),
        "task_types_official": dict(Counter(d.parent.name.split("-")[0] for d in offi.values()
                                            if (d / "game.tw-pddl").exists())),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="/tmp/hp_agent_alfworld_fidelity")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shared", default=str(SHARED))
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--skip-official-expert", action="store_true")
    args = ap.parse_args(argv)
    cache, shared = Path(args.cache), Path(args.shared)
    official = unpack_once(shared / "alfworld_json_2.1.1_official.tar.gz", cache / "official", "alfworld_data",
                           "json_2.1.1")
    alfred_root = unpack_once(shared / "alfred_json_2.1.0_trimmed.tar.gz", cache / "alfred", "json_2.1.0",
                              "valid_seen")
    t0 = time.time()
    report = {"build": {}}
    s3 = build_games(cache / "alfred_games", source="alfred", alfred_dir=alfred_root, splits=SPLITS,
                     workers=args.workers)
    report["build"]["alfred"] = s3["splits"]
    counts = {"id": len([d for d in official_trials(official, "valid_seen").values() if (d / "game.tw-pddl").exists()]),
              "ood": len([d for d in official_trials(official, "valid_unseen").values()
                          if (d / "game.tw-pddl").exists()])}
    s2 = build_games(cache / "synth_games", source="synth", splits=["id", "ood"], counts=counts, workers=args.workers)
    report["build"]["synth"] = s2["splits"]
    report["build_seconds"] = round(time.time() - t0, 1)
    for split in SPLITS:
        off_ex = {} if args.skip_official_expert else official_expert_steps(official, split, cache)
        solved = [v for v in off_ex.values()]
        report[split] = {
            "official_expert_solved": (sum(v is not None for v in solved), len(solved)),
            "alfred": compare_alfred(official, alfred_root, cache / "alfred_games", split, off_ex),
            "synth": compare_synth(official, cache / "synth_games", split),
        }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return report


if __name__ == "__main__":
    sys.exit(main() and 0)
