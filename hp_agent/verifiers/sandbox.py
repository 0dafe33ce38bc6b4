"""Run an untrusted program on test inputs in a sandbox; report what it output, per test.

Each run starts ``python3 -I -S sandbox_harness.py`` (isolated mode, no site packages)
in a fresh temporary folder, in a new session, with an environment holding only
``PATH`` and ``LANG``. The harness (see its docstring) then, when the kernel allows:

* enters new **mount, network and pid namespaces**: the program sees a private root
  (read-only /usr and /etc, a size-capped tmpfs for /tmp and its working folder), has
  only a down loopback interface, and every process it starts dies with it;
* lowers **resource limits** (CPU seconds, address space, file size, open files,
  processes; no core files) and, when running as root, **drops to the sandbox user**
  (``nobody``: root would ignore the process limit), with ``no_new_privs`` set;
* enforces the **wall-clock limit** and kills everything left.

What the kernel allows is probed once per process (:func:`sandbox_support`) and logged;
without namespaces the limits, the user switch and the process-group kill remain.

The sandbox reports outputs (return values as ``repr``, stdout text), never verdicts:
expected outputs never enter it, so nothing the program does inside can fake a pass.
:mod:`hp_agent.verifiers.code` compares.
"""

from __future__ import annotations

import ast
import functools
import logging
import marshal
import os
import pwd
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hp_agent.errors import UserValueError
from hp_agent.verifiers import sandbox_harness
from hp_agent.verifiers.sandbox_harness import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    EXIT_SETUP_FAILED,
    EXIT_TIMEOUT,
    memfd,
)

log = logging.getLogger(__name__)

HARNESS = Path(sandbox_harness.__file__)
# A system interpreter: the sandbox user must be able to read its standard library
# (a virtual environment under /root is mode 700); `-I -S` keep site-packages out.
DEFAULT_PYTHON = "/usr/bin/python3"
_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # nothing inherited: no secrets
# Tried in order by the probe; the first that runs a program is used. A non-root user
# needs a user namespace to create the others.
_ROOT_NAMESPACES = (CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET, 0)
_USER_NAMESPACES = (CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID, 0)
_NAMESPACE_NAMES = {CLONE_NEWUSER: "user", CLONE_NEWNS: "mount", CLONE_NEWNET: "network", CLONE_NEWPID: "pid"}
_FRAMING_BYTES = 64 * 1024  # the results channel's room for line framing beyond the outputs
_BACKSTOP_S = 5.0  # the harness enforces the time limit; this only guards against its failure


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): no verdict can be given."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run (one program against all of a task's tests).

    timeout_s:        wall-clock seconds for the whole run, all tests together.
    cpu_time_s:       CPU seconds per process (RLIMIT_CPU).
    memory_mb:        address space per process in MiB (RLIMIT_AS).
    max_output_bytes: stdout the program may produce over all tests; also the size cap
                      of any file it writes (RLIMIT_FSIZE).
    max_processes:    processes and threads of the sandbox user (RLIMIT_NPROC).
    max_open_files:   file descriptors per process (RLIMIT_NOFILE).
    disk_mb:          size of the tmpfs holding the working folder and /tmp (mount namespace only).
    user:             the user a root verifier drops to.
    python:           interpreter that runs the harness and the program.
    """

    timeout_s: float = 4.0
    cpu_time_s: int = 4
    memory_mb: int = 512
    max_output_bytes: int = 4 * 1024 * 1024
    max_processes: int = 32
    max_open_files: int = 64
    disk_mb: int = 32
    user: str = "nobody"
    python: str = DEFAULT_PYTHON

    def __post_init__(self) -> None:
        minimums = {"timeout_s": 0.01, "cpu_time_s": 1, "memory_mb": 64, "max_output_bytes": 1024, "max_processes": 1,
                    "max_open_files": 16, "disk_mb": 1}
        for key, minimum in minimums.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
                raise UserValueError(f"sandbox limit {key}={value!r} is not valid: expected a number >= {minimum}")
        for key in ("cpu_time_s", "memory_mb", "max_output_bytes", "max_processes", "max_open_files", "disk_mb"):
            if not isinstance(getattr(self, key), int):
                raise UserValueError(f"sandbox limit {key}={getattr(self, key)!r} is not valid: expected an integer")
        if not os.access(self.python, os.X_OK):
            raise UserValueError(f"sandbox python={self.python!r} is not an executable file")


@dataclass(frozen=True)
class SandboxSupport:
    """What the kernel allowed, found by :func:`sandbox_support`: the namespaces every
    run enters and the user it runs as."""

    namespaces: int
    uid: int
    gid: int

    @property
    def network_isolated(self) -> bool:
        return bool(self.namespaces & CLONE_NEWNET)

    def describe(self) -> str:
        names = [name for flag, name in _NAMESPACE_NAMES.items() if self.namespaces & flag]
        return f"namespaces: {', '.join(names) or 'none'}; runs as uid {self.uid}"


@dataclass(frozen=True)
class SandboxRun:
    """What one run claims and how it ended.

    outputs:     test index -> (status, payload) as the runner reported it: ``("ok",
                 repr of the return value or the stdout text)`` or ``("error", "Type:
                 message")``. A claim, not a verdict: compare it outside.
    exit_status: the harness's: 0..123 the program's exit code, 124 wall-clock limit,
                 128 + n killed by signal n.
    elapsed_s:   wall time of the run, start-up included.
    """

    outputs: dict[int, tuple[str, str]]
    exit_status: int
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return self.exit_status == EXIT_TIMEOUT

    def ending(self, limits: SandboxLimits) -> str:
        """Why tests without an output have none, e.g. ``TimeoutError (wall-clock limit 4 s)``."""
        if self.timed_out:
            return f"TimeoutError (wall-clock limit {limits.timeout_s:g} s)"
        if self.exit_status > 128:
            number = self.exit_status - 128
            name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
            cause = {"SIGKILL": " (CPU time limit)", "SIGXCPU": " (CPU time limit)", "SIGSEGV": " (stack overflow?)"}
            return f"killed by {name}{cause.get(name, '')}"
        return f"program exited (status {self.exit_status}) before the test ran"


def _job(program: str, kind: str, inputs: list, func_name: str | None, limits: SandboxLimits,
         support: SandboxSupport, work_dir: str) -> bytes:
    """The harness's instructions. Holds test inputs only: expected outputs never enter the sandbox."""
    return marshal.dumps({
        "program": program, "kind": kind, "inputs": inputs, "func_name": func_name, "work_dir": work_dir,
        "namespaces": support.namespaces, "uid": support.uid, "gid": support.gid,
        "timeout_s": float(limits.timeout_s), "cpu_time_s": limits.cpu_time_s,
        "memory_bytes": limits.memory_mb * 1024 * 1024, "file_size_bytes": limits.max_output_bytes + _FRAMING_BYTES,
        "output_bytes": limits.max_output_bytes, "open_files": limits.max_open_files,
        "processes": limits.max_processes, "disk_mb": limits.disk_mb,
    })


def _parse_outputs(channel: bytes) -> dict[int, tuple[str, str]]:
    """Result lines ``(index, status, payload)``; the first line per index counts, and
    lines that are not such a tuple (the program may write to the channel) are skipped."""
    outputs: dict[int, tuple[str, str]] = {}
    for line in channel.decode("utf-8", "replace").splitlines():
        try:
            index, status, payload = ast.literal_eval(line)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if type(index) is int and status in ("ok", "error") and type(payload) is str:
            outputs.setdefault(index, (status, payload))
    return outputs


def _wait(process: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for the harness (pidfd: no polling delay), then kill its process group;
    whether it exited by itself."""
    waiter = os.pidfd_open(process.pid)
    try:
        exited = bool(select.select([waiter], [], [], timeout_s)[0])
    finally:
        os.close(waiter)
    try:  # the group outlives its leader only if something in it escaped the harness's kill
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    return exited


def run_in_sandbox(program: str, kind: str, inputs: list, func_name: str | None = None,
                   limits: SandboxLimits | None = None) -> SandboxRun:
    """Run ``program`` on each input: ``kind="stdin"`` feeds each input (a str) as stdin;
    ``kind="functional"`` calls ``func_name`` (or ``Solution().func_name``) with each
    input's argument list. Raises :class:`SandboxError` if the sandbox itself fails."""
    if kind not in ("stdin", "functional"):
        raise ValueError(f"kind {kind!r} is not valid: expected 'stdin' or 'functional'")
    if kind == "functional" and not func_name:
        raise ValueError("functional tests need func_name")
    limits = limits or SandboxLimits()
    return _execute(program, kind, inputs, func_name, limits, sandbox_support(limits.python, limits.user))


def _execute(program: str, kind: str, inputs: list, func_name: str | None, limits: SandboxLimits,
             support: SandboxSupport) -> SandboxRun:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hp_agent_sandbox_") as work_dir:
        os.chown(work_dir, support.uid, support.gid)  # the cwd when there is no mount namespace
        job = memfd(_job(program, kind, inputs, func_name, limits, support, work_dir))
        channel, errors = memfd(), memfd()
        try:
            process = subprocess.Popen([limits.python, "-I", "-S", str(HARNESS)], stdin=job, stdout=channel,
                                       stderr=errors, cwd=work_dir, env=_ENVIRONMENT, start_new_session=True)
            exited = _wait(process, limits.timeout_s + _BACKSTOP_S)
            if not exited or process.returncode == EXIT_SETUP_FAILED:
                what = "set-up failed" if exited else f"harness was killed after {limits.timeout_s + _BACKSTOP_S:g} s"
                message = os.pread(errors, 2000, 0).decode(errors="replace").strip()
                raise SandboxError(f"sandbox {what} ({support.describe()}): {message}")
            raw = os.pread(channel, limits.max_output_bytes + _FRAMING_BYTES, 0)
        finally:
            for fd in (job, channel, errors):
                os.close(fd)
    return SandboxRun(_parse_outputs(raw), process.returncode, time.perf_counter() - started)


def _sandbox_ids(user: str) -> tuple[int, int]:
    """(uid, gid) a run uses: ``user``'s when we are root, else our own."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        entry = pwd.getpwnam(user)
    except KeyError as error:
        raise UserValueError(f"sandbox user {user!r} does not exist; name an existing unprivileged user") from error
    return entry.pw_uid, entry.pw_gid


def sandbox_support(python: str = DEFAULT_PYTHON, user: str = "nobody") -> SandboxSupport:
    """What the kernel allows runs of ``python`` as ``user``: probed once per process, logged."""
    return _probe(python, user)


@functools.cache
def _probe(python: str, user: str) -> SandboxSupport:
    """Try namespace sets from the strongest down, each on a one-line program; the first
    that echoes its input is used."""
    uid, gid = _sandbox_ids(user)
    limits = SandboxLimits(python=python, user=user, timeout_s=10.0)
    failures = []
    for namespaces in _ROOT_NAMESPACES if os.geteuid() == 0 else _USER_NAMESPACES:
        support = SandboxSupport(namespaces, uid, gid)
        try:
            run = _execute("print(input())", "stdin", ["probe"], None, limits, support)
        except SandboxError as error:
            failures.append(str(error))
            continue
        if run.outputs.get(0) == ("ok", "probe\n"):
            break
        failures.append(f"{support.describe()}: the probe printed {run.outputs!r}, exit status {run.exit_status}")
    else:
        raise SandboxError("no sandbox configuration could run a program:\n" + "\n".join(failures))
    for failure in failures:
        log.info("code sandbox: unavailable: %s", failure)
    if support.network_isolated:
        log.info("code sandbox: network namespace works; %s", support.describe())
    else:
        log.warning("code sandbox: NO network namespace (the kernel refused it), so programs can reach the "
                    "network; relying on resource limits and the user switch; %s", support.describe())
    return support
