"""Verification throughput of the code sandbox with 1 and 2 workers (no model).

    .venv/bin/python bench/code_verify.py --programs 64 --repeats 3

The batch is fixed: the first ``--programs`` built-in tasks of ``--split``, every other
one paired with its reference solution (passes all tests) and the rest with a program
that reads its input and prints a wrong answer (fails). Every worker count checks the
same batch through :func:`hp_agent.verifiers.code.verify_batch`; the counts are measured
in turns, ``--repeats`` times, so that load from other processes hits them alike. Also
reported: the wall time of one passing run (start-up, namespaces, all of a task's tests)
as seen by the verifier, median over the passing runs with 1 worker, and the CPU time the
sandbox processes used per program (user + system; unlike wall time, it barely moves when
other processes compete for the cores).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

from hp_agent.envs.code.tasks import builtin_tasks
from hp_agent.verifiers.code import CodeResult, verify_batch
from hp_agent.verifiers.sandbox import SandboxLimits, sandbox_support

WRONG_PROGRAM = "import sys\nsys.stdin.read()\nprint(-1)\n\ndef {name}(*args):\n    return -1\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=64, help="programs in the fixed batch (half pass, half fail)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts to compare")
    parser.add_argument("--repeats", type=int, default=3, help="measure the worker counts in turns, this many times")
    parser.add_argument("--split", default="test", choices=("train", "test"), help="built-in split the tasks come from")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    tasks = list(builtin_tasks(args.split, args.programs))
    programs = [task.solution if i % 2 == 0 else WRONG_PROGRAM.format(name=task.func_name or "solve")
                for i, task in enumerate(tasks)]
    limits = SandboxLimits()
    support = sandbox_support(limits.python, limits.user)
    verify_batch(programs[:2], tasks[:2], workers=1, limits=limits)  # warm the page cache

    seconds, cpu_seconds = dict.fromkeys(workers, 0.0), dict.fromkeys(workers, 0.0)
    results: dict[int, list[CodeResult]] = {}
    for _ in range(args.repeats):
        for w in workers:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            results[w] = verify_batch(programs, tasks, workers=w, limits=limits)
            seconds[w] += time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_seconds[w] += after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    expected = [i % 2 == 0 for i in range(len(tasks))]
    for w, batch in results.items():
        if [r.verdict.success for r in batch] != expected:
            raise SystemExit(f"workers={w}: verdicts differ from the batch's design; the sandbox is misbehaving")
    passing_ms = statistics.median(r.elapsed_s * 1000 for r in results[workers[0]] if r.verdict.success)
    tests = len(tasks[0].tests)

    print(f"sandbox {support.describe()}; {len(tasks)} programs ({tests} tests each, half passing), "
          f"{args.repeats} repeats per row")
    print(f"one passing run ({tests} tests): {passing_ms:.1f} ms median wall time")
    print(f"{'workers':>7} {'programs':>9} {'seconds':>8} {'programs/s':>11} {'ms/program':>11} {'cpu ms/program':>15}")
    rates = {}
    checked = len(tasks) * args.repeats
    for w in workers:
        rates[w] = checked / seconds[w]
        print(f"{w:>7} {checked:>9} {seconds[w]:>8.2f} {rates[w]:>11.1f} {1000 / rates[w]:>11.1f} "
              f"{1000 * cpu_seconds[w] / checked:>15.1f}")
    summary = {"programs": len(tasks), "passing_run_ms": round(passing_ms, 2),
               "cpu_ms_per_program": round(1000 * cpu_seconds[workers[0]] / checked, 2),
               **{f"programs_per_s_{w}": round(rate, 2) for w, rate in rates.items()}}
    if len(workers) >= 2:
        ratio = rates[workers[-1]] / rates[workers[0]]
        summary["ratio"] = round(ratio, 3)
        print(f"ratio {workers[-1]} vs {workers[0]} workers: {ratio:.2f}x")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
