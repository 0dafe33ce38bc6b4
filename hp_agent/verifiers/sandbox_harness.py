"""Sandbox harness: runs one program on test inputs. Started by :mod:`hp_agent.verifiers.sandbox`.

Run as ``python3 -I -S sandbox_harness.py`` with a job (a marshal'd dict, see
``sandbox._job``) on stdin and the results channel on stdout; the verifier imports it
only for its constants and :func:`memfd`. Start-up is paid on every run, so this file
imports only _ctypes, resource and select (~1.5 ms over the interpreter's ~8 ms; the
ctypes package would add ~3 ms, ``json`` ~9 ms).

Two processes:

* the **supervisor** (this process; root when the verifier is root) enters the new
  namespaces the job names. With a mount namespace it builds a root of its own: a
  size-capped tmpfs holding read-only binds of /usr and /etc, device nodes null, zero,
  random and urandom, a /tmp and the work folder, and chroots into it, so the program
  sees no other file of the host. It forks the runner, enforces the wall-clock limit
  and kills whatever the runner left (as child subreaper, orphans come back to it).
* the **runner** (pid 1 of the new pid namespace, so every process it starts dies with
  it) mounts its own /proc, lowers its resource limits, drops to the sandbox user and
  runs the tests, writing one line per test: ``repr((index, status, payload))``.

The runner never sees an expected output: it reports what the program returned or
printed and the verifier compares outside. Whatever the program does to the runner
(patching it, writing to its channel, exiting early) it can only *claim* outputs, and a
claim passes only if it is correct.

Exit status: 124 wall-clock limit hit, 125 set-up failed before the program ran
(message on stderr), 128 + n runner killed by signal n, else the runner's exit code
capped at 123 (so a program cannot pose as a set-up failure).
"""

import _ctypes
import builtins
import marshal
import os
import resource
import select
import sys

# <linux/sched.h>, <linux/mount.h>, <linux/prctl.h>
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
SIGKILL = 9
EXIT_TIMEOUT, EXIT_SETUP_FAILED, MAX_PROGRAM_EXIT = 124, 125, 123
# Annotations compile to strings, never evaluated: LiveCodeBench starter code annotates
# with `List[int]` without importing typing (importing it would cost ~5 ms a run).
CO_FUTURE_ANNOTATIONS = 0x1000000
_CHAR_DEVICE = 0o020000
_DEVICES = {"null": 3, "zero": 5, "random": 8, "urandom": 9}  # minor numbers of major 1
_READ_ONLY_DIRS = ("/usr", "/etc")
_TOP_LEVEL_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")  # merged-/usr symlinks
_ERROR_CHARS = 200



class _CInt(_ctypes._SimpleCData):
    _type_ = "i"


class _LibcFunction(_ctypes.CFuncPtr):
    """A libc function returning a C int, called with ints, bytes or None: what
    ``ctypes.CDLL(None, use_errno=True).name`` gives, without the ctypes package."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _CInt


class _Libc:
    _handle = _ctypes.dlopen(None, os.RTLD_NOW)


def _libc_call(name: str, *args: int | bytes | None) -> None:
    """Call libc's ``name``; raise OSError with its errno when it returns non-zero."""
    if _LibcFunction((name, _Libc))(*args) != 0:
        errno = _ctypes.get_errno()
        raise OSError(errno, f"{name}{args[:2]}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, options: str | None = None) -> None:
    def encode(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    _libc_call("mount", encode(source), encode(target), encode(fstype), flags, encode(options))


def _bind_read_only(path: str, root: str) -> None:
    target = root + path
    os.makedirs(target, exist_ok=True)
    _mount(path, target, None, MS_BIND)
    # A bind mount ignores MS_RDONLY; only a remount of it makes it read-only.
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_root(job: dict) -> None:
    """Chroot into a fresh tmpfs root: read-only /usr and /etc (and the interpreter's
    prefix), four device nodes, a /tmp and the work folder, nothing else of the host."""
    root = job["work_dir"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # no mount event leaks to the host
    # Not nodev: the device nodes below live on it (the sandbox user cannot make any).
    _mount("tmpfs", root, "tmpfs", MS_NOSUID, f"size={job['disk_mb']}m,mode=0755")
    prefix = os.path.realpath(sys.base_prefix)  # the interpreter's standard library
    covered = any(prefix == path or prefix.startswith(path + "/") for path in _READ_ONLY_DIRS)
    for path in _READ_ONLY_DIRS + (() if covered else (prefix,)):
        _bind_read_only(path, root)
    for name in _TOP_LEVEL_LINKS:
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), f"{root}/{name}")
    os.mkdir(f"{root}/dev")
    for name, minor in _DEVICES.items():
        os.mknod(f"{root}/dev/{name}", _CHAR_DEVICE | 0o666, os.makedev(1, minor))
        os.chmod(f"{root}/dev/{name}", 0o666)  # mknod's mode is masked by the umask
    os.mkdir(f"{root}/proc")
    os.mkdir(f"{root}/tmp")
    os.chmod(f"{root}/tmp", 0o1777)
    os.mkdir(f"{root}/sandbox", 0o700)
    os.chown(f"{root}/sandbox", job["uid"], job["gid"])
    os.chroot(root)
    os.chdir("/sandbox")


def _set_limits(job: dict) -> None:
    cpu = job["cpu_time_s"]
    for limit, value in ((resource.RLIMIT_AS, job["memory_bytes"]), (resource.RLIMIT_FSIZE, job["file_size_bytes"]),
                         (resource.RLIMIT_NOFILE, job["open_files"]), (resource.RLIMIT_NPROC, job["processes"]),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    # SIGXCPU at the soft limit ends an ordinary process; a namespace's pid 1 ignores it
    # and dies of the SIGKILL at the hard limit one second later.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def _drop_privileges(job: dict) -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(job["gid"])
        os.setuid(job["uid"])
    _libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binaries
    # Set after setuid, which clears it: the runner dies with the supervisor even if it
    # left the process group.
    _libc_call("prctl", PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, the message cut to 200 characters."""
    try:
        message = str(exc)
    except BaseException:  # a hostile or broken __str__
        message = ""
    name = type(exc).__name__
    return f"{name}: {message[:_ERROR_CHARS]}" if message else name


def memfd(data: bytes = b"") -> int:
    """A fresh in-memory file holding ``data``, positioned at its start (close-on-exec)."""
    fd = os.memfd_create("io")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _exit(code=None):
    """``exit()`` and ``quit()``, which come from the site module that ``-S`` skips."""
    raise SystemExit(code)


def _find_function(namespace: dict, name: str):
    """LeetCode style ``Solution().name`` when the program defines class ``Solution``, else ``name``."""
    holder = namespace.get("Solution")
    if isinstance(holder, type) and hasattr(holder, name):
        return lambda *args: getattr(holder(), name)(*args)
    if callable(namespace.get(name)):
        return namespace[name]
    raise NameError(f"function {name!r} is not defined")


def _call(function, args: list) -> tuple[str, str]:
    """Functional test: ("ok", repr of the return value) or ("error", the exception)."""
    try:
        return "ok", repr(function(*args))
    except BaseException as exc:
        return "error", _describe(exc)


def _run_script(code, stdout, output_fd: int, budget: int) -> tuple[str, str]:
    """Stdin test: run the program as __main__; ("ok", its stdout) or ("error", why)."""
    outcome = None
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:  # exit() after printing the answer is common and fine
        if exc.code not in (None, 0):
            outcome = ("error", f"SystemExit: {exc.code!r}"[:_ERROR_CHARS])
    except BaseException as exc:
        outcome = ("error", _describe(exc))
    try:
        stdout.flush()  # ours, even if the program replaced sys.stdout
    except ValueError:  # the program closed it, which flushed it
        pass
    except BaseException as exc:  # e.g. the file size limit
        return outcome or ("error", _describe(exc))
    return outcome or ("ok", os.pread(output_fd, budget + 1, 0).decode("utf-8", "replace"))


def run_tests(job: dict, ready: int) -> None:
    """The runner: set up, say so on ``ready``, then one result line per test."""
    if job["namespaces"] & CLONE_NEWPID and job["namespaces"] & CLONE_NEWNS:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this namespace's processes only
    channel = os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)  # stdin was the job, stdout the channel: neither is the program's
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    _set_limits(job)
    _drop_privileges(job)
    os.write(ready, b"1")
    os.close(ready)
    budget = job["output_bytes"]

    def report(index: int, status: str, payload: str) -> None:
        nonlocal budget
        line = (repr((index, status, payload)) + "\n").encode("utf-8", "replace")
        if len(line) > budget:
            line = (repr((index, "error", "OutputLimitExceeded")) + "\n").encode()
        budget -= len(line)
        os.write(channel, line)

    inputs = job["inputs"]
    functional = job["kind"] == "functional"
    builtins.exit = builtins.quit = _exit
    try:
        code = compile(job["program"], "<solution>", "exec", flags=CO_FUTURE_ANNOTATIONS, dont_inherit=True)
        if functional:
            namespace = {"__name__": "__solution__", "__builtins__": builtins}
            exec(code, namespace)
            function = _find_function(namespace, job["func_name"])
    except BaseException as exc:  # SyntaxError, or the module body failed: every test fails alike
        for index in range(len(inputs)):
            report(index, "error", _describe(exc))
        return
    for index, test_input in enumerate(inputs):
        # Fds 0 and 1 open first (the program may have closed them), so that our
        # descriptors of the new stdin and stdout files get other numbers.
        os.dup2(channel, 0)
        os.dup2(channel, 1)
        input_fd, output_fd = memfd(b"" if functional else test_input.encode()), memfd()
        os.dup2(input_fd, 0)
        os.dup2(output_fd, 1)
        sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)
        sys.stdout = sys.__stdout__ = stdout = open(1, "w", encoding="utf-8", closefd=False)
        report(index, *(_call(function, test_input) if functional else _run_script(code, stdout, output_fd, budget)))
        os.close(input_fd)
        os.close(output_fd)


def _reap_orphans(job: dict) -> None:
    """Kill and reap every child left. In a pid namespace the kernel has killed them
    with its pid 1; otherwise, as subreaper, the runner's orphans are our children."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0 and not job["namespaces"] & CLONE_NEWPID:
            with open(f"/proc/self/task/{os.getpid()}/children", encoding="ascii") as children:
                for child in children.read().split():
                    try:
                        os.kill(int(child), SIGKILL)
                    except ProcessLookupError:
                        pass
        if pid == 0:
            os.waitpid(-1, 0)


def supervise(job: dict) -> int:
    """Enter the namespaces, start the runner, wait at most ``timeout_s``; the exit status."""
    _libc_call("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if job["namespaces"]:
        _libc_call("unshare", job["namespaces"])
    if job["namespaces"] & CLONE_NEWNS:
        build_root(job)
    ready_read, ready_write = os.pipe()
    runner = os.fork()
    if runner == 0:
        code = EXIT_SETUP_FAILED
        try:
            os.close(ready_read)
            run_tests(job, ready_write)
            code = 0
        except BaseException as exc:  # before `ready`: our bug; after: the program's doing
            print(f"sandbox runner: {_describe(exc)}", file=sys.stderr)
        finally:
            os._exit(code)
    os.close(ready_write)
    waiter = os.pidfd_open(runner)
    timed_out = not select.select([waiter], [], [], job["timeout_s"])[0]
    if timed_out:
        os.kill(runner, SIGKILL)
    _, status = os.waitpid(runner, 0)
    _reap_orphans(job)
    if os.read(ready_read, 1) != b"1":  # the runner died before it could run the program
        ending = "hit the wall-clock limit" if timed_out else f"ended with wait status {status:#x}"
        print(f"sandbox runner failed during set-up: it {ending}", file=sys.stderr)
        return EXIT_SETUP_FAILED
    if timed_out:
        return EXIT_TIMEOUT
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return min(os.WEXITSTATUS(status), MAX_PROGRAM_EXIT)


if __name__ == "__main__":
    try:
        _status = supervise(marshal.loads(sys.stdin.buffer.read()))
    except OSError as _exc:
        print(f"sandbox set-up failed: {_exc}", file=sys.stderr)
        _status = EXIT_SETUP_FAILED
    os._exit(_status)
