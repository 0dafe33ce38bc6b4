"""Build offline ALFWorld game folders: ``build_games(out_root, source=...)``.

Both sources write ALFWorld's layout, so one loader serves them and the official data::

    <out_root>/json_2.1.1/<split>/<task_type>-<Object>-<MRecep>-<Recep>-<scene>/<trial>/
        game.tw-pddl      {pddl_domain, grammar, pddl_problem, solvable, walkthrough}
        traj_data.json    {task_id, task_type, pddl_params, scene, turk_annotations, source, ...}

Every game is checked on the real engine before it is kept: the problem must load (a goal type
without instances fails in textworld with ``KeyError: 'val1'``; :func:`pddl.check_game` rejects
those before writing) and ALFWorld's handcoded expert (fixed) must win within 50 steps. A game is
written into a private temporary folder and renamed into place, so an interrupted build leaves
no half-written games, and games already present are skipped (cached, idempotent).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from hp_agent.envs.alfworld.pddl import SceneState, TaskSpec, check_game, game_data, traj_data, write_problem
from hp_agent.progress import LoopProgress

JSON_FOLDER = "json_2.1.1"
SOURCES = ("synth", "alfred")
DEFAULT_SYNTH_COUNTS = {"train": 600, "id": 140, "ood": 134}  # id/ood: official split sizes
MAX_ATTEMPTS = 10


def materialize(out_root: Path, split_folder: str, trial: str, task: TaskSpec, state: SceneState, task_desc: str,
                source: str, seed: int = 0, extra: dict | None = None) -> dict:
    """Write one game through a temporary folder; keep it only if the expert solves it.

    Returns a record: ``status`` "written" or "rejected", ``reason``, expert and walkthrough lengths.
    """
    from hp_agent.envs.alfworld.gamecheck import check_game_file

    rec = {"split": split_folder, "trial": trial, "task_type": task.task_type, "folder": task.folder(state.scene)}
    problems = check_game(state, task)
    if problems:
        return {**rec, "status": "rejected", "reason": "; ".join(problems)}
    problem = write_problem(state, task, trial)
    tmp = Path(out_root) / ".tmp_build" / f"{trial}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        traj = traj_data(task, state, trial, task_desc, source, **(extra or {}))
        (tmp / "traj_data.json").write_text(json.dumps(traj, indent=2))
        (tmp / "game.tw-pddl").write_text(json.dumps(game_data(problem, task_desc)))
        result = check_game_file(tmp / "game.tw-pddl", state, task, seed=seed)
        rec.update(expert_steps=len(result.expert_actions), walkthrough_len=len(result.walkthrough),
                   walkthrough_source=result.walkthrough_source)
        if not result.solved:
            return {**rec, "status": "rejected", "reason": result.reason}
        (tmp / "game.tw-pddl").write_text(json.dumps(game_data(problem, task_desc, result.walkthrough)))
        traj.update(expert_steps=len(result.expert_actions), walkthrough_source=result.walkthrough_source)
        (tmp / "traj_data.json").write_text(json.dumps(traj, indent=2))
        final = Path(out_root) / JSON_FOLDER / split_folder / rec["folder"] / trial
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, final)
        except OSError:  # another builder got there first: theirs is as good
            if not (final / "game.tw-pddl").exists():
                raise
        return {**rec, "status": "written"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def existing_trials(out_root: Path, split_folder: str) -> dict[str, Path]:
    """trial name -> folder, for complete games already under ``split_folder``."""
    base = Path(out_root) / JSON_FOLDER / split_folder
    return {p.parent.name: p.parent for p in base.glob("*/*/game.tw-pddl")} if base.exists() else {}


def _cached_record(path: Path, split_folder: str) -> dict:
    traj = json.loads((path / "traj_data.json").read_text())
    game = json.loads((path / "game.tw-pddl").read_text())
    return {"split": split_folder, "trial": path.name, "task_type": traj["task_type"], "folder": path.parent.name,
            "status": "cached", "walkthrough_len": len(game.get("walkthrough") or []),
            "expert_steps": traj.get("expert_steps")}


# ---------------------------------------------------------------------------------------------
# Jobs (module level so worker processes can run them).

def synth_trial_name(seed: int, index: int) -> str:
    return f"trial_synth_s{seed}_{index:06d}"


def _synth_job(args: tuple) -> dict:
    out_root, split, index, seed, max_attempts, scenes = args
    from hp_agent.envs.alfworld import synth

    folder = synth.split_folder(split)
    trial = synth_trial_name(seed, index)
    reasons = []
    for attempt in range(max_attempts):
        cand = synth.sample_candidate(split, index, attempt, seed=seed, scenes=scenes)
        if cand is None:
            reasons.append("no candidate")
            continue
        rec = materialize(Path(out_root), folder, trial, cand.task, cand.state, cand.task_desc, "synth",
                          seed=index, extra={"synth": {"seed": seed, "index": index, "attempt": attempt}})
        if rec["status"] == "written":
            rec["attempts"] = attempt + 1
            rec["rejected"] = reasons
            return rec
        reasons.append(rec["reason"])
    return {"split": folder, "trial": trial, "status": "failed", "attempts": max_attempts, "rejected": reasons,
            "task_type": None}


def _alfred_job(args: tuple) -> dict:
    out_root, split_folder, traj_path, scene_info = args
    from hp_agent.envs.alfworld import alfred

    try:
        built = alfred.rebuild(Path(traj_path), scene_info)
    except alfred.SkipTrial as e:
        return {"split": split_folder, "trial": Path(traj_path).parent.name, "status": "skipped", "reason": str(e),
                "task_type": None}
    rec = materialize(Path(out_root), split_folder, built.trial, built.task, built.state, built.task_desc, "alfred",
                      extra={"alfred": built.provenance})
    rec["attempts"] = 1
    if rec["status"] == "rejected":
        rec["status"] = "failed"
    return rec


def _guarded(job: tuple) -> dict:
    fn, args = job
    try:
        return fn(args)
    except Exception as e:  # noqa: BLE001 - one broken game must not stop a build
        split = args[1]
        if fn is _synth_job:
            from hp_agent.envs.alfworld.synth import split_folder

            split = split_folder(split)
        return {"split": split, "trial": str(args[2]), "status": "failed", "task_type": None,
                "reason": f"error: {type(e).__name__}: {e}"}


def _run(jobs: list[tuple], fn, workers: int, progress: bool, label: str) -> list[dict]:
    jobs = [(fn, job) for job in jobs]
    fn = _guarded
    out = []
    with LoopProgress(f"[{label}]", len(jobs), enabled=progress, every=20) as bar:

        def record(result: dict) -> None:
            out.append(result)
            bar.advance(1, f"{sum(r['status'] == 'written' for r in out)} written")

        if workers <= 1 or len(jobs) <= 1:
            for job in jobs:
                record(fn(job))
            return out
        # fork: workers need no re-import of the caller's script (spawn would re-run an unguarded one)
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        with ctx.Pool(workers) as pool:
            for result in pool.imap_unordered(fn, jobs, chunksize=1):
                record(result)
    return out


def balanced_prefix(trials: list[Path], n: int) -> list[Path]:
    """The first ``n`` of ALFRED ``.../<task_type>-<args>/<trial>/traj_data.json`` paths, one
    task type in turn (path order within a type), so that a capped build covers every type."""
    by_type: dict[str, list[Path]] = {}
    for path in trials:
        by_type.setdefault(path.parent.parent.name.split("-")[0], []).append(path)
    ordered = [group[rank] for rank in range(max(map(len, by_type.values()), default=0))
               for group in by_type.values() if rank < len(group)]
    return ordered[:n]


def build_games(out_root: str | Path, source: str = "synth", splits: tuple[str, ...] | list[str] | None = None,
                counts: dict[str, int] | int | None = None, alfred_dir: str | Path | None = None,
                workers: int = 2, progress: bool = True, seed: int = 0,
                max_attempts: int = MAX_ATTEMPTS, scenes: tuple[int, ...] | None = None) -> dict:
    """Build (or complete) offline ALFWorld games under ``out_root/json_2.1.1``.

    source:  "synth" (from the alfworld wheel, no data) or "alfred" (rebuild ALFRED trials
             found under ``alfred_dir``, which holds ``json_2.1.0/<split>/...`` or the splits).
    splits:  synth: "train", "id" (valid_seen), "ood" (valid_unseen); alfred: ALFRED split
             names ("train", "valid_seen", "valid_unseen"). Default: all three.
    counts:  games per split (synth: how many to make, default 600/140/134; alfred: cap on
             the trials rebuilt, taken one task type in turn, default all). An int applies to every split.
    scenes:  synth only: restrict to these floor plans (intersected with each split's own).
    Returns ``{"source", "seconds", "splits": {folder: {written, cached, failed, skipped,
    attempts, by_task_type}}}``; ``written + cached`` games are on disk.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; valid: {', '.join(SOURCES)}")
    out_root = Path(out_root)
    t0 = time.time()
    records: list[dict] = []
    if source == "synth":
        from hp_agent.envs.alfworld import synth

        splits = list(splits or ("train", "id", "ood"))
        for split in splits:
            folder = synth.split_folder(split)
            n = counts if isinstance(counts, int) else (counts or DEFAULT_SYNTH_COUNTS).get(
                split, DEFAULT_SYNTH_COUNTS.get(split, 0))
            have = existing_trials(out_root, folder)
            jobs = []
            for i in range(n):
                name = synth_trial_name(seed, i)
                if name in have:
                    records.append(_cached_record(have[name], folder))
                else:
                    jobs.append((str(out_root), split, i, seed, max_attempts, scenes))
            records += _run(jobs, _synth_job, workers, progress, f"synth {folder}")
    else:
        from hp_agent.envs.alfworld import alfred

        if alfred_dir is None:
            raise ValueError("source='alfred' needs alfred_dir (the unpacked ALFRED json_2.1.0 data)")
        splits = list(splits or ("train", "valid_seen", "valid_unseen"))
        catalog = alfred.AlfredCatalog(Path(alfred_dir))
        for split in splits:
            trials = catalog.trials(split)
            n = counts if isinstance(counts, int) else (counts or {}).get(split)
            if n is not None:
                trials = balanced_prefix(trials, n)
            have = existing_trials(out_root, split)
            jobs = []
            for path in trials:
                if path.parent.name in have:
                    records.append(_cached_record(have[path.parent.name], split))
                elif alfred.skip_reason(path):
                    records.append({"split": split, "trial": path.parent.name, "status": "skipped",
                                    "reason": alfred.skip_reason(path), "task_type": None})
                else:
                    jobs.append((str(out_root), split, str(path), catalog.scene_info(alfred.scene_of(path))))
            records += _run(jobs, _alfred_job, workers, progress, f"alfred {split}")
    shutil.rmtree(out_root / ".tmp_build", ignore_errors=True)
    summary = summarize(records)
    summary.update(source=source, seconds=round(time.time() - t0, 1))
    if progress:
        print(format_summary(summary), file=sys.stderr, flush=True)
    return summary


def summarize(records: list[dict]) -> dict:
    splits: dict[str, dict] = defaultdict(lambda: {"written": 0, "cached": 0, "failed": 0, "skipped": 0,
                                                   "attempts": 0, "by_task_type": Counter(), "rejections": Counter()})
    for r in records:
        s = splits[r["split"]]
        s[r["status"]] += 1
        s["attempts"] += r.get("attempts", 0)
        if r["status"] in ("written", "cached"):
            s["by_task_type"][r["task_type"]] += 1
        for reason in r.get("rejected", []) + ([r["reason"]] if r["status"] == "failed" and r.get("reason") else []):
            s["rejections"][reason.split(":")[0]] += 1
    return {"splits": {k: {**v, "by_task_type": dict(v["by_task_type"]), "rejections": dict(v["rejections"])}
                       for k, v in splits.items()}, "records": records}


def format_summary(summary: dict) -> str:
    lines = [f"source={summary.get('source')} time={summary.get('seconds')}s"]
    for split, s in summary["splits"].items():
        kept = s["written"] + s["cached"]
        lines.append(f"  {split}: {kept} games ({s['written']} new, {s['cached']} cached), {s['failed']} failed, "
                     f"{s['skipped']} skipped, {s['attempts']} candidate attempts")
        for t, n in sorted(s["by_task_type"].items()):
            lines.append(f"    {t}: {n}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_root")
    ap.add_argument("--source", default="synth", choices=SOURCES)
    ap.add_argument("--from-alfred", dest="alfred_dir", default=None, help="ALFRED json_2.1.0 folder (source 3)")
    ap.add_argument("--splits", nargs="*", default=None)
    ap.add_argument("--count", type=int, default=None, help="games per split")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    source = "alfred" if args.alfred_dir else args.source
    summary = build_games(args.out_root, source=source, splits=args.splits, counts=args.count,
                          alfred_dir=args.alfred_dir, workers=args.workers, seed=args.seed)
    print(json.dumps({k: v for k, v in summary.items() if k != "records"}, indent=1))


if __name__ == "__main__":
    main()
