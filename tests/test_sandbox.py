"""Adversarial suite: hostile programs must be contained, score 0, and leave no trace.

Every hostile program runs through the real verifier. After each one the same escape
checks run: it scored 0; no listener of ours (TCP, UDP, abstract and path Unix sockets)
got a byte; the canary folder (world-writable, so only the sandbox protects it) is
unchanged; no file appeared at the paths programs try to write; no process of the run
is left; the secrets (an env var, a world-readable file) are not in its output. The
module's last teardown prints "N hostile programs tried, M escapes" and asserts M == 0.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hp_agent.envs.code.tasks import CodeTask
from hp_agent.verifiers.code import CodeResult, TestCase, judge_run, verify_batch
from hp_agent.verifiers.sandbox import (
    CLONE_NEWNS,
    SandboxLimits,
    SandboxRun,
    _probe,
    run_in_sandbox,
    sandbox_support,
)

MARKER = f"hpagentmarker{uuid.uuid4().hex[:12]}"
# Every hostile program first names its process COMM (inherited by its forks), so that
# the check finds this session's processes only, never other users' sandbox runs.
COMM = f"hp{uuid.uuid4().hex[:13]}"  # /proc/<pid>/comm holds 15 characters
# prctl(PR_SET_NAME): /proc/self/comm is not writable, its files are root's after setuid.
TAG = f"import ctypes\nctypes.CDLL(None).prctl(15, b'{COMM}', 0, 0, 0)\n"
SECRET = f"s3cret-{uuid.uuid4().hex}"
REPO = Path(__file__).resolve().parents[1]
LIMITS = SandboxLimits(timeout_s=1.5, cpu_time_s=1, memory_mb=256, max_processes=16)

ADD = CodeTask("add", "Return a + b.", "functional", (
    TestCase("1\n2", "3", public=True), TestCase("5\n7", "12", public=True),
    TestCase("100000\n23456", "123456"), TestCase("-500\n-499", "-999"),
), "add", "hostile", 1)
SUM_STDIN = CodeTask("sum", "Print a + b.", "stdin", (
    TestCase("1 2\n", "3\n", public=True), TestCase("100000 23456\n", "123456\n"),
), None, "hostile", 1)
PRIVATE_OUTPUTS = ("123456", "-999")


@dataclass(frozen=True)
class Hostile:
    """A hostile program; ``expect`` is a text its feedback must contain (how it was stopped)."""

    name: str
    program: str
    kind: str = "stdin"
    expect: tuple[str, ...] = ()


HOSTILE = [
    Hostile("infinite loop", "while True:\n    pass\n", expect=("CPU time limit", "TimeoutError")),
    Hostile("sleep past the timeout", "import time\ntime.sleep(60)\n", expect=("TimeoutError",)),
    Hostile("busy threads", "import threading\n\ndef spin():\n    while True:\n        pass\n\n"
            "for _ in range(8):\n    threading.Thread(target=spin).start()\n",
            expect=("CPU time limit", "TimeoutError", "can't start new thread")),  # each thread reserves a 64 MiB arena
    Hostile("memory bomb, one allocation", "x = bytearray(50 * 1024 ** 3)\n", expect=("MemoryError",)),
    Hostile("memory bomb, growing", "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n",
            expect=("MemoryError",)),
    Hostile("fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
    Hostile("fork bomb with exec", "import os\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            "            os.execv('/usr/bin/python3', ['python3', '-c', 'while True: pass', '@MARKER@'])\n"
            "    except OSError:\n        pass\n"),
    Hostile("huge stdout", "import sys\nwhile True:\n    sys.stdout.write('x' * 1000000)\n", expect=("File too large",
                                                                                                     )),
    Hostile("huge raw writes to every fd",
            "import os\nblock = b'y' * 1000000\nwhile True:\n    for fd in range(1, 8):\n"
            "        try:\n            os.write(fd, block)\n        except OSError:\n            pass\n"),
    Hostile("disk filler", "i = 0\nwhile True:\n    with open(f'f{i}', 'wb') as f:\n        f.write(b'z' * 10 ** 6)\n"
            "    i += 1\n", expect=("OSError",)),
    Hostile("too many open files", "files = [open('/dev/null') for _ in range(100000)]\n",
            expect=("Too many open files",)),
    Hostile("write outside the sandbox", "import os\nfor path in @ESCAPE_PATHS@:\n    try:\n"
            "        with open(path, 'w') as f:\n            f.write('escaped')\n    except OSError:\n        pass\n"
            "    try:\n        os.makedirs(path + '.d')\n    except OSError:\n        pass\n"),
    Hostile("delete files",
            "import os, shutil\nfor path in ['@CANARY@', '@CANARY_DIR@']:\n    for remove in (os.remove, "
            "os.rmdir, shutil.rmtree):\n        try:\n            remove(path)\n        except OSError:\n"
            "            pass\n"
            "try:\n    open('@CANARY@', 'w').close()\nexcept OSError:\n    pass\n"),
    Hostile("tcp connection to the host",
            "import socket\nconnection = socket.create_connection(('127.0.0.1', @TCP_PORT@), "
            "timeout=0.5)\nconnection.sendall(b'@MARKER@')\n", expect=("OSError", "unreachable", "refused")),
    Hostile("udp datagram and the internet", "import socket\nudp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "for host in ('127.0.0.1', '0.0.0.0'):\n    try:\n        udp.sendto(b'@MARKER@', (host, @UDP_PORT@))\n"
            "    except OSError:\n        pass\nsocket.create_connection(('8.8.8.8', 53), timeout=0.5)\n"),
    Hostile("unix sockets of the host", "import socket\nfor address in ('\\0@MARKER@', '@UNIX_PATH@'):\n"
            "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n    try:\n        s.connect(address)\n"
            "        s.sendall(b'@MARKER@')\n    except OSError:\n        pass\n"),
    Hostile("read environment secrets",
            "import os\nprint(dict(os.environ))\nfor pid in ['self', '1', '@PARENT_PID@'] + "
            "os.listdir('/proc'):\n    try:\n        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
            "    except OSError:\n        pass\n"),
    Hostile("read host files", "for path in ['@SECRET_FILE@', '@REPO@/hp_agent/envs/code/tasks.py', '/root/.bashrc']:\n"
            "    try:\n        print(open(path).read())\n    except OSError as error:\n        print(error)\n"),
    Hostile("os._exit(0) before the tests", "import os\nos._exit(0)\n", kind="functional", expect=("exited",)),
    Hostile("sys.exit(0) before the tests", "import sys\nsys.exit(0)\n", kind="functional", expect=("SystemExit",)),
    Hostile("sys.exit(0) without output", "import sys\nsys.exit(0)\n", expect=("wrong output",)),
    Hostile("equal to everything", "class Anything(int):\n    def __eq__(self, other):\n        return True\n\n"
            "    __hash__ = int.__hash__\n\n\ndef add(a, b):\n    return Anything(0)\n", kind="functional"),
    Hostile("lying repr", "class Liar:\n    def __eq__(self, other):\n        return True\n\n    def __repr__(self):\n"
            "        return 'True'\n\n\ndef add(a, b):\n    return Liar()\n", kind="functional"),
    Hostile("patch the harness", "import __main__\n__main__._call = lambda function, args: ('ok', '0')\n"
            "__main__._describe = lambda exc: 'ok'\n\n\ndef add(a, b):\n    raise ValueError\n", kind="functional"),
    Hostile("forge result lines", "import os\nfor fd in range(20):\n    for i in range(10):\n        try:\n"
            "            os.write(fd, (repr((i, 'ok', repr(i))) + '\\n').encode())\n        except OSError:\n"
            "            pass\n\n\ndef add(a, b):\n    return None\n", kind="functional"),
    Hostile("override builtins", "import builtins\nbuiltins.repr = lambda value: \"'ok'\"\nbuiltins.print = "
            "lambda *args, **kwargs: None\nbuiltins.open = None\nprint(3)\n"),
    Hostile("hard-coded public answers", "def add(a, b):\n    return {(1, 2): 3, (5, 7): 12}.get((a, b), 0)\n",
            kind="functional", expect=("private tests: 2 of 2 failed",)),
    Hostile("double-forked daemon with exec", "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
            "    if os.fork() == 0:\n        os.execv('/usr/bin/python3', ['python3', '-c', "
            "'import time; time.sleep(60)', "
            "'@MARKER@'])\n    os._exit(0)\ntime.sleep(0.3)\n"),
    Hostile("setsid daemon ignoring signals", "import os, signal, time\nif os.fork() == 0:\n    os.setsid()\n"
            "    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
            "        signal.signal(sig, signal.SIG_IGN)\n"
            "    while True:\n        time.sleep(0.05)\ntime.sleep(0.3)\nprint(3)\n"),
    Hostile("recursion bomb", "def f(n):\n    return f(n + 1)\n\n\nf(0)\n", expect=("RecursionError",)),
    # Through map() each level is a C call too, so the C stack overflows (3.11 runs Python-to-Python calls
    # without C recursion).
    Hostile("C stack overflow", "import sys\nsys.setrecursionlimit(10 ** 9)\n\n\ndef f(n):\n"
            "    return list(map(f, [n + 1]))\n\n\nf(0)\n", expect=("SIGSEGV", "MemoryError")),
    Hostile("privilege escalation", "import os\nfor attempt in (lambda: os.setuid(0), lambda: os.setgid(0), "
            "lambda: os.chroot('/'), lambda: os.setgroups([0])):\n    try:\n        attempt()\n    except OSError:\n"
            "        pass\nprint(os.getuid())\nopen('@REPO@/@MARKER@', 'w').write('escaped')\n"),
    Hostile("signal every process", "import os, signal\nfor pid in [-1, 1, @PARENT_PID@] + list(range(2, 5000)):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nprint(3)\n"),
]


@dataclass
class Ledger:
    """Hostile programs tried and the escapes found, for the closing line."""

    tried: list[str] = field(default_factory=list)
    escapes: dict[str, list[str]] = field(default_factory=dict)


class Listeners:
    """TCP, UDP, abstract and path Unix sockets on this host, counting what reaches them."""

    def __init__(self, unix_path: str):
        self.received: list[str] = []
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix = []
        for address in ("\0" + MARKER, unix_path):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(address)
            server.listen()
            self.unix.append(server)
        os.chmod(unix_path, 0o777)  # connectable by anyone: only the sandbox keeps programs out
        self._threads = [threading.Thread(target=self._accept, args=(s,), daemon=True) for s in [self.tcp, *self.unix]]
        self._threads.append(threading.Thread(target=self._receive, daemon=True))
        for thread in self._threads:
            thread.start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            self.received.append(f"connection on {server.getsockname()!r}")
            connection.close()

    def _receive(self) -> None:
        while True:
            try:
                data, peer = self.udp.recvfrom(4096)
            except OSError:
                return
            self.received.append(f"datagram {data!r} from {peer}")

    def close(self) -> None:
        for server in [self.tcp, self.udp, *self.unix]:
            server.close()


def _sandbox_processes() -> list[tuple[int, str]]:
    """Processes started by this session's hostile programs: named COMM, or MARKER in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue  # exited meanwhile
        if MARKER in cmdline or comm == COMM:
            found.append((int(entry.name), f"{entry.name} ({comm}): {cmdline.strip()}"))
    return found


def _stray_processes(grace_s: float = 3.0) -> list[str]:
    """This session's sandbox processes still alive after ``grace_s`` (time for the kernel's teardown)."""
    deadline = time.monotonic() + grace_s
    while (found := _sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, _ in found:  # do not let one leak spoil the next tests
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return [description for _, description in found]


@pytest.fixture(scope="module")
def ledger(pytestconfig) -> Ledger:
    record = Ledger()
    yield record
    escaped = sum(bool(found) for found in record.escapes.values())
    line = f"sandbox adversarial suite: {len(record.tried)} hostile programs tried, {escaped} escapes"
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shown even under pytest -q
        print(f"\n{line}")
    assert escaped == 0, record.escapes


@pytest.fixture(scope="module")
def host(ledger):
    """The host-side bait: listeners, a canary folder, a secret file and env var, escape paths."""
    base = Path(tempfile.mkdtemp(prefix=f"hp_agent_canary_{MARKER}_"))
    base.chmod(0o777)  # world-writable without the sticky bit: only the sandbox protects it
    canary, secret_file = base / "canary.txt", base / "secret.txt"
    canary.write_text("canary")
    secret_file.write_text(SECRET)
    for path in (canary, secret_file):
        path.chmod(0o666)
    listeners = Listeners(f"/tmp/hp_agent_sock_{MARKER}")
    escape_paths = [f"/tmp/{MARKER}", f"/var/tmp/{MARKER}", f"/dev/shm/{MARKER}", f"{REPO}/{MARKER}",
                    f"{base}/{MARKER}", f"../{MARKER}", f"/{MARKER}", f"/root/{MARKER}", f"/run/lock/{MARKER}"]
    host_paths = [p for p in escape_paths if p.startswith("/")]  # "../x" resolves inside the sandbox only
    before = sorted(p.name for p in base.iterdir())
    os.environ["HP_AGENT_TEST_SECRET"] = SECRET
    sandbox_dirs = set(Path(tempfile.gettempdir()).glob("hp_agent_sandbox_*"))
    bait = {"@MARKER@": MARKER, "@REPO@": str(REPO), "@CANARY@": str(canary), "@CANARY_DIR@": str(base),
            "@SECRET_FILE@": str(secret_file), "@TCP_PORT@": str(listeners.tcp.getsockname()[1]),
            "@UDP_PORT@": str(listeners.udp.getsockname()[1]), "@UNIX_PATH@": f"/tmp/hp_agent_sock_{MARKER}",
            "@PARENT_PID@": str(os.getpid()), "@ESCAPE_PATHS@": repr(escape_paths)}
    yield {"bait": bait, "listeners": listeners, "canary": canary, "secret_file": secret_file, "base": base,
           "before": before,
           "escape_paths": host_paths}
    os.environ.pop("HP_AGENT_TEST_SECRET", None)
    listeners.close()
    os.unlink(f"/tmp/hp_agent_sock_{MARKER}")
    # After the whole suite: nothing left running, nothing outside the sandbox changed.
    assert not _stray_processes()
    assert canary.read_text() == "canary" and sorted(p.name for p in base.iterdir()) == before
    assert not [p for p in host_paths if os.path.lexists(p)]
    leaked = set(Path(tempfile.gettempdir()).glob("hp_agent_sandbox_*")) - sandbox_dirs
    assert not [p for p in leaked if p.exists()], "sandbox work folders were left behind"
    for path in base.iterdir():
        path.unlink()
    base.rmdir()


def _escapes(case: Hostile, run: SandboxRun, result: CodeResult, host: dict) -> list[str]:
    found = []
    if result.verdict.reward != 0.0 or result.verdict.success:
        found.append(f"scored {result.verdict.reward}")
    if host["listeners"].received:
        found.append(f"network reached the host: {host['listeners'].received}")
        host["listeners"].received.clear()
    if not host["canary"].exists() or host["canary"].read_text() != "canary" or \
            sorted(p.name for p in host["base"].iterdir()) != host["before"]:
        found.append("the canary folder changed")
    written = [p for p in host["escape_paths"] if os.path.lexists(p) or os.path.lexists(p + ".d")]
    if written:
        found.append(f"wrote outside the sandbox: {written}")
    if found:
        _restore(host)  # so that the next program is judged on its own
    if stray := _stray_processes():
        found.append(f"processes outlived the run: {stray}")
    if SECRET in repr(run.outputs):
        found.append("a secret reached the program's output")
    if any(value in result.verdict.feedback for value in PRIVATE_OUTPUTS):
        found.append("feedback shows a private expected output")
    return found


def _restore(host: dict) -> None:
    """Undo what an escaped program did to the bait."""
    for path in host["escape_paths"]:
        for leftover in (Path(path), Path(path + ".d")):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            elif os.path.lexists(leftover):
                leftover.unlink()
    host["base"].mkdir(mode=0o777, exist_ok=True)
    host["base"].chmod(0o777)
    for path in host["base"].iterdir():
        if path.name not in host["before"]:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    host["canary"].write_text("canary")
    host["canary"].chmod(0o666)
    if not host["secret_file"].exists():
        host["secret_file"].write_text(SECRET)
        host["secret_file"].chmod(0o666)


def _program(case: Hostile, bait: dict[str, str]) -> str:
    program = TAG + case.program
    for token, value in bait.items():
        program = program.replace(token, value)
    return program


@pytest.mark.parametrize("case", HOSTILE, ids=[case.name for case in HOSTILE])
def test_hostile_program_is_contained(case: Hostile, host: dict, ledger: Ledger) -> None:
    task = ADD if case.kind == "functional" else SUM_STDIN
    inputs = [[int(x) for x in t.input.split()] for t in task.tests] if case.kind == "functional" else \
        [t.input for t in task.tests]
    started = time.perf_counter()
    run = run_in_sandbox(_program(case, host["bait"]), task.kind, inputs, task.func_name, LIMITS)
    elapsed = time.perf_counter() - started
    result = judge_run(task, run, LIMITS)
    found = _escapes(case, run, result, host)
    if elapsed > LIMITS.timeout_s + 3.0:
        found.append(f"ran {elapsed:.1f} s, past the {LIMITS.timeout_s} s limit")
    ledger.tried.append(case.name)
    ledger.escapes[case.name] = found
    assert not found, found
    if case.expect:
        assert any(text in result.verdict.feedback for text in case.expect), result.verdict.feedback


def test_kill_all_does_not_reach_concurrent_runs(ledger: Ledger) -> None:
    """A program killing every process it can runs beside honest ones: they still pass."""
    killer = "import os\nfor _ in range(200):\n    try:\n        os.kill(-1, 9)\n    except OSError:\n        pass\n"
    honest = "def add(a, b):\n    return a + b\n"
    programs = [honest, killer] * 4
    results = verify_batch(programs, [ADD] * len(programs), workers=4, limits=LIMITS)
    ledger.tried.append("kill -1 beside concurrent runs")
    found = [f"honest run {i} failed: {r.verdict.feedback}" for i, r in enumerate(results)
             if programs[i] is honest and not r.verdict.success]
    found += [f"kill -1 scored {r.verdict.reward}" for i,
              r in enumerate(results) if programs[i] is killer and r.verdict.reward]
    ledger.escapes["kill -1 beside concurrent runs"] = found
    assert not found


def test_the_probe_logs_what_the_kernel_allowed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hp_agent.verifiers.sandbox"):
        support = _probe.__wrapped__(LIMITS.python, LIMITS.user)
    assert support == sandbox_support()
    assert "network namespace" in caplog.text
    assert ("network namespace works" in caplog.text) == support.network_isolated


def test_an_honest_run_is_fast_and_isolated() -> None:
    program = "import os, socket\nprint(os.getuid(), os.getcwd(), sorted(os.listdir('/')), socket.if_nameindex())\n"
    run = run_in_sandbox(program, "stdin", [""], limits=LIMITS)
    status, output = run.outputs[0]
    support = sandbox_support()
    assert status == "ok" and output.split()[0] == str(support.uid)
    if support.namespaces & CLONE_NEWNS:  # a root of its own
        assert "/sandbox" in output and "'work'" not in output and "'root'" not in output
    if support.network_isolated:
        assert "(1, 'lo')" in output and "eth" not in output
    assert run.elapsed_s < 2.0
