"""The worker's kernel layers for real: seccomp (``seccomp.py``) and Landlock (``landlock.py``).

Each kernel test forks a child that sets no_new_privs, installs the layer under test, tries
things and reports each outcome ("ok" or the errno name) over a pipe as JSON; the parent
asserts. A control child without the layer shows that every refused call works otherwise.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import json
import os
import re
import resource
import signal
import socket
import struct
import sys
import threading
import traceback
from pathlib import Path

import pytest

from spade_jax.sandbox import landlock, seccomp

ARCH = seccomp._arch()
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long

needs_seccomp = pytest.mark.skipif(not seccomp.supported(), reason=f"no seccomp filter for {ARCH}")
LANDLOCK_ABI = landlock.abi_version()
needs_landlock = pytest.mark.skipif(LANDLOCK_ABI == 0, reason="this kernel has no Landlock (abi_version() == 0)")


# --- helpers -----------------------------------------------------------------------------------

def in_child(body) -> dict:
    """Runs ``body()`` in a forked child with no_new_privs set; returns the dict it returned."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code, out = 1, {}
        try:
            os.close(read_fd)
            if _libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
                raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
            out = body()
            code = 0
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            out = {"child_error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
        finally:
            try:
                os.write(write_fd, json.dumps(out).encode())
            finally:
                os._exit(code)
    os.close(write_fd)
    raw = b""
    while chunk := os.read(read_fd, 65536):
        raw += chunk
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    assert raw, f"child reported nothing (wait status {status})"
    out = json.loads(raw)
    assert "child_error" not in out, out.get("trace", out)
    assert status == 0
    return out


def outcome(fn, *args) -> str:
    """"ok" when ``fn(*args)`` returns, else the errno name of the OSError it raised."""
    try:
        fn(*args)
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))
    return "ok"


def raw(name: str, *args) -> str:
    """A raw syscall by name: "ok" or the errno name."""
    cargs = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ret = _syscall(ctypes.c_long(seccomp.SYSCALLS[ARCH][name]), *cargs)
    return "ok" if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")


def libc_call(fn, *args) -> tuple[int, str]:
    ctypes.set_errno(0)
    ret = fn(*args)
    return ret, ("ok" if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"))


def run_bpf(prog, nr: int, arch: int, args=(0, 0, 0, 0, 0, 0)) -> int:
    """A classic-BPF interpreter for the instructions the filter uses, over a struct seccomp_data."""
    data = struct.pack("=IIQ6Q", nr, arch, 0, *(a & 0xFFFFFFFFFFFFFFFF for a in args))
    pc, acc = 0, 0
    for _ in range(len(prog)):
        code, jt, jf, k = prog[pc]
        if code == 0x06:
            return k
        if code == 0x20:
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
            continue
        taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
        pc += 1 + (jt if taken else jf)
        assert pc < len(prog)
    raise AssertionError("the program did not return")


# --- the seccomp program, interpreted (every supported architecture) --------------------------

@pytest.mark.parametrize("arch", sorted(seccomp.SYSCALLS))
def test_seccomp_rules_give_the_documented_verdicts(arch):
    me = 4242
    prog = seccomp.filter_program(me, arch)
    audit = seccomp._AUDIT_ARCH[arch]
    nr = seccomp.SYSCALLS[arch]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS

    def verdict(name, *args):
        return run_bpf(prog, nr[name], audit, args + (0,) * (6 - len(args)))

    for name in seccomp.DENIED:
        if name in nr:
            assert verdict(name) == eperm, name
    assert verdict("clone3") == enosys
    assert run_bpf(prog, 0x3FFF, audit) == allow  # unknown numbers are allowed
    assert run_bpf(prog, nr["kill"], 0x40000003) == 0x80000000  # i386 audit arch: kill the process
    if arch == "x86_64":
        assert run_bpf(prog, 0x40000000 | 39, audit) == eperm  # x32 getpid
    # clone: threads and fork pass, any namespace flag is refused
    assert verdict("clone", 0x003D0F00) == allow and verdict("clone", 0x11) == allow
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert verdict("clone", 0x11 | flag) == eperm
    # signals only at itself; the high word of a pid is ignored like the kernel's int cast does
    for name in seccomp.SIGNAL_SELF_ONLY:
        assert verdict(name, me) == allow and verdict(name, me | (7 << 32)) == allow
        assert verdict(name, me + 1) == eperm and verdict(name, 0) == eperm and verdict(name, -1) == eperm
    for name in seccomp.PID_SELF_OR_ZERO:
        assert verdict(name, 0) == allow and verdict(name, me) == allow and verdict(name, 1) == eperm
    assert verdict("setpriority", 0, 0, 5) == allow and verdict("setpriority", 0, me, 5) == allow
    assert verdict("setpriority", 0, 1, 5) == eperm  # another process
    assert verdict("setpriority", 2, 0, 5) == eperm and verdict("setpriority", 1, 0, 5) == eperm  # user, group
    assert verdict("ioprio_set", 1, 0) == allow and verdict("ioprio_set", 1, me + 1) == eperm
    assert verdict("ioprio_set", 3, 0) == eperm
    for cmd in (8, 10, 15, 1024, 1026, 1031):
        assert verdict("fcntl", 3, cmd) == eperm, cmd
    for cmd in (0, 1, 2, 3, 4, 9, 1030, 1032):  # F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_GETOWN, ...
        assert verdict("fcntl", 3, cmd) == allow, cmd
    assert verdict("ioctl", 3, 0x8901) == eperm and verdict("ioctl", 3, 0x5401) == allow
    for name in ("read", "write", "openat", "mmap", "futex", "getpid", "pipe2", "wait4"):
        number = {"x86_64": dict(read=0, write=1, openat=257, mmap=9, futex=202, getpid=39, pipe2=293, wait4=61),
                  "aarch64": dict(read=63, write=64, openat=56, mmap=222, futex=98, getpid=172, pipe2=59,
                                  wait4=260)}[arch][name]
        assert run_bpf(prog, number, audit) == allow, name


def _header_numbers(arch: str) -> dict[str, int] | None:
    path = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
            "aarch64": "/usr/include/asm-generic/unistd.h"}[arch]
    if not os.path.exists(path):
        return None
    text = Path(path).read_text()
    generic = {m[0]: int(m[1]) for m in re.findall(r"#define __NR3264_(\w+) (\d+)", text)}
    numbers = {m[0]: int(m[1]) for m in re.findall(r"#define __NR_(\w+) (\d+)", text)}
    numbers.update({m[0]: generic[m[1]] for m in re.findall(r"#define __NR_(\w+) __NR3264_(\w+)", text)
                    if m[1] in generic})
    return numbers


@pytest.mark.parametrize("arch", sorted(seccomp.SYSCALLS))
def test_seccomp_syscall_numbers_match_the_kernel_headers(arch):
    header = _header_numbers(arch)
    if header is None:
        pytest.skip(f"no unistd header for {arch} on this machine")
    checked = 0
    for name, number in seccomp.SYSCALLS[arch].items():
        if name in header:  # headers older than the newest calls lack them
            assert header[name] == number, name
            checked += 1
    assert checked > 100
    if arch == "aarch64":  # legacy calls that aarch64 never had
        assert not {"alarm", "inotify_init", "uselib", "modify_ldt"} & set(seccomp.SYSCALLS[arch])


# --- seccomp, installed ------------------------------------------------------------------------

@needs_seccomp
def test_seccomp_denies_sockets_exec_memory_ipc_timers_and_namespaces():
    def body():
        channel, peer = socket.socketpair()  # like fd 3: made before the jail, used with read()/write()
        assert seccomp.install() is True
        r = {}
        r["inet"] = outcome(socket.socket, socket.AF_INET, socket.SOCK_STREAM)
        r["unix"] = outcome(socket.socket, socket.AF_UNIX, socket.SOCK_STREAM)
        r["vsock"] = outcome(socket.socket, 40, socket.SOCK_STREAM)
        r["netlink"] = outcome(socket.socket, 16, socket.SOCK_RAW)
        r["socketpair"] = outcome(socket.socketpair)
        r["memfd"] = outcome(os.memfd_create, "x")
        r["memfd_secret"] = raw("memfd_secret", 0)
        r["execv"] = outcome(os.execv, "/bin/sh", ["sh", "-c", "exit 0"])
        r["channel_write"] = outcome(os.write, channel.fileno(), b"ping")
        r["channel_read"] = os.read(peer.fileno(), 4).decode()
        r["channel_sendmsg"] = outcome(channel.sendmsg, [b"x"])
        r["channel_fiosetown"] = outcome(fcntl.ioctl, channel.fileno(), 0x8901, struct.pack("i", os.getppid()))
        ids, r["shmget"] = libc_call(_libc.shmget, 0, 4096, 0o1600)
        if ids >= 0:
            _libc.shmctl(ids, 0, None)
        ids, r["semget"] = libc_call(_libc.semget, 0, 1, 0o1600)
        if ids >= 0:
            _libc.semctl(ids, 0, 0)
        ids, r["msgget"] = libc_call(_libc.msgget, 0, 0o1600)
        if ids >= 0:
            _libc.msgctl(ids, 0, None)
        r["mq_open"] = raw("mq_open", ctypes.c_char_p(b"spade-kernel-test"), os.O_RDONLY, 0, None)
        r["setitimer"] = outcome(signal.setitimer, signal.ITIMER_REAL, 30.0)
        signal.alarm(30)
        r["alarm_armed"] = signal.getitimer(signal.ITIMER_REAL)[0] > 0
        if "alarm" in seccomp.SYSCALLS[ARCH]:
            r["alarm"] = raw("alarm", 30)
        timer = ctypes.c_int()
        r["timer_create"] = raw("timer_create", 1, None, ctypes.byref(timer))
        r["timerfd_create"] = raw("timerfd_create", 1, 0)
        r["inotify_init1"] = raw("inotify_init1", 0)
        r["io_setup"] = raw("io_setup", 1, ctypes.byref(ctypes.c_ulong()))
        r["io_uring_setup"] = raw("io_uring_setup", 1, None)
        r["ptrace_peek_parent"] = raw("ptrace", 2, os.getppid(), 0, 0)  # PTRACE_PEEKDATA: ESRCH if allowed
        r["personality"] = raw("personality", 0xFFFFFFFF)
        r["unshare"] = libc_call(_libc.unshare, 0x10000000)[1]
        child = _syscall(ctypes.c_long(seccomp.SYSCALLS[ARCH]["clone"]), ctypes.c_long(0x40000000 | signal.SIGCHLD),
                         None, None, None, None)
        if child == 0:
            os._exit(0)
        r["clone_newnet"] = "ok" if child > 0 else errno.errorcode[ctypes.get_errno()]
        if child > 0:
            os.waitpid(child, 0)
        r["clone3"] = raw("clone3", None, 0)
        if ARCH == "x86_64":
            ret = _syscall(ctypes.c_long(0x40000000 | 39))  # x32 getpid
            r["x32"] = "ok" if ret >= 0 else errno.errorcode[ctypes.get_errno()]
        return r

    r = in_child(body)
    assert r.pop("channel_write") == "ok" and r.pop("channel_read") == "ping"
    assert r.pop("alarm_armed") is False  # signal.alarm cannot raise; the timer just never arms
    assert r.pop("clone3") == "ENOSYS"
    assert r == {name: "EPERM" for name in r}, {k: v for k, v in r.items() if v != "EPERM"}
    expected = {"inet", "unix", "vsock", "netlink", "socketpair", "memfd", "memfd_secret", "execv",
                "channel_sendmsg", "channel_fiosetown", "shmget", "semget", "msgget", "mq_open", "setitimer",
                "timer_create", "timerfd_create", "inotify_init1", "io_setup", "io_uring_setup", "ptrace_peek_parent",
                "personality", "unshare", "clone_newnet"}
    assert expected <= set(r)


@needs_seccomp
def test_seccomp_confines_process_calls_to_the_caller():
    parent = os.getpid()
    parent_nice = os.getpriority(os.PRIO_PROCESS, parent)

    def body():
        ppid = os.getppid()
        affinity = os.sched_getaffinity(0)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        got = []
        signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
        assert seccomp.install() is True
        r = {}
        r["kill_parent"] = outcome(os.kill, ppid, 0)
        r["kill_group"] = outcome(os.kill, 0, 0)
        r["kill_all"] = outcome(os.kill, -1, 0)
        r["kill_self"] = outcome(os.kill, os.getpid(), signal.SIGUSR1)
        r["raise_signal"] = outcome(signal.raise_signal, signal.SIGUSR1)
        r["delivered"] = len(got)
        r["prlimit_parent"] = outcome(resource.prlimit, ppid, resource.RLIMIT_NOFILE)
        r["prlimit_self"] = outcome(resource.prlimit, os.getpid(), resource.RLIMIT_NOFILE)
        r["setrlimit_self"] = outcome(resource.setrlimit, resource.RLIMIT_NOFILE, (soft - 1, hard))
        r["setpriority_parent"] = outcome(os.setpriority, os.PRIO_PROCESS, ppid, parent_nice)
        r["setpriority_user"] = outcome(os.setpriority, os.PRIO_USER, 0, parent_nice)
        r["setpriority_self"] = outcome(os.setpriority, os.PRIO_PROCESS, 0, parent_nice + 1)
        r["affinity_parent"] = outcome(os.sched_setaffinity, ppid, affinity)
        r["affinity_self"] = outcome(os.sched_setaffinity, 0, affinity)
        read_end, write_end = os.pipe()
        r["F_GETFL"] = outcome(fcntl.fcntl, read_end, fcntl.F_GETFL)
        r["F_SETFL"] = outcome(fcntl.fcntl, read_end, fcntl.F_SETFL, os.O_NONBLOCK)
        r["F_SETOWN"] = outcome(fcntl.fcntl, read_end, fcntl.F_SETOWN, ppid)
        r["F_SETSIG"] = outcome(fcntl.fcntl, read_end, 10, signal.SIGUSR1)
        r["F_NOTIFY"] = outcome(fcntl.fcntl, read_end, 1026, 0)
        r["F_SETPIPE_SZ"] = outcome(fcntl.fcntl, write_end, 1031, 1 << 20)
        os.write(write_end, b"x")
        r["pipe_io"] = os.read(read_end, 1).decode()
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        r["fork_status"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        box = []
        thread = threading.Thread(target=lambda: box.append(sum(range(1000))))
        thread.start()
        thread.join()
        r["thread"] = box
        return r

    r = in_child(body)
    denied = ("kill_parent", "kill_group", "kill_all", "prlimit_parent", "setpriority_parent", "setpriority_user",
              "affinity_parent", "F_SETOWN", "F_SETSIG", "F_NOTIFY", "F_SETPIPE_SZ")
    allowed = ("kill_self", "raise_signal", "prlimit_self", "setrlimit_self", "setpriority_self", "affinity_self",
               "F_GETFL", "F_SETFL")
    assert {k: r[k] for k in denied} == dict.fromkeys(denied, "EPERM")
    assert {k: r[k] for k in allowed} == dict.fromkeys(allowed, "ok")
    assert r["delivered"] == 2 and r["pipe_io"] == "x" and r["fork_status"] == 7 and r["thread"] == [499500]
    assert os.getpriority(os.PRIO_PROCESS, parent) == parent_nice


@dataclasses.dataclass
class _Item:
    name: str
    weight: float


def _workload() -> dict:
    import numpy as np

    rng = np.random.default_rng(7)
    a = rng.standard_normal((48, 48))
    solved = np.linalg.solve(a @ a.T + 48 * np.eye(48), np.ones(48))
    import random
    words = re.findall(r"[a-z]+", "the quick brown fox jumps over the lazy dog " * 3)
    random.Random(3).shuffle(words)
    items = sorted((_Item(w, len(w) / 3) for w in set(words)), key=lambda i: (i.weight, i.name))
    payload = json.loads(json.dumps({"items": [dataclasses.asdict(i) for i in items], "words": words}))
    return {"solve_sum": round(float(solved.sum()), 9), "svd0": round(float(np.linalg.svd(a)[1][0]), 9),
            "payload": payload, "pick": random.Random(11).sample(range(1000), 5)}


@needs_seccomp
def test_seccomp_leaves_a_numpy_workload_running():
    import numpy  # noqa: F401 - imported before the fork, as the host preloads it

    expected = json.loads(json.dumps(_workload()))

    def body():
        assert seccomp.install() is True
        sys.modules.pop("colorsys", None)  # another test may have imported it: read it again
        fresh = "colorsys" not in sys.modules
        import colorsys  # a module imported only after the filter is in force
        return {"result": _workload(), "fresh_import": fresh and round(colorsys.rgb_to_hsv(1, 0, 0)[0], 3) == 0}

    r = in_child(body)
    assert r["result"] == expected
    assert r["fresh_import"] is True


# --- Landlock ----------------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "data.txt").write_text("hello")
    (tmp_path / "rw").mkdir()
    (tmp_path / "rw" / "sub").mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    return tmp_path


def _landlock_checks(tree: Path, confine: bool, tcp_port: int, abstract_name: bytes) -> dict:
    def read(path):
        with open(path) as f:
            return f.read()

    def write(path, text="x"):
        with open(path, "w") as f:
            f.write(text)

    def tcp_connect():
        with socket.create_connection(("127.0.0.1", tcp_port), timeout=2):
            pass

    def tcp_bind():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))

    def abstract_connect():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(abstract_name)

    r = {}
    if confine:
        r["granted"] = landlock.restrict([str(tree / "ro")], [str(tree / "rw")], ["/dev/null", tree / "missing"])
    r["read_allowed"] = read(tree / "ro" / "data.txt")
    r["list_allowed"] = sorted(os.listdir(tree / "ro"))
    r["write_readonly"] = outcome(write, tree / "ro" / "data.txt")
    r["read_outside"] = outcome(read, tree / "outside.txt")
    if os.path.exists("/etc/hostname"):
        r["read_hostname"] = outcome(read, "/etc/hostname")
    r["list_root"] = outcome(os.listdir, "/")
    r["write_scratch"] = outcome(write, tree / "rw" / "a.txt", "data")
    r["rename_scratch"] = outcome(os.rename, tree / "rw" / "a.txt", tree / "rw" / "sub" / "b.txt")
    r["truncate_scratch"] = outcome(write, tree / "rw" / "sub" / "b.txt", "")
    r["mkdir_scratch"] = outcome(os.mkdir, tree / "rw" / "made")
    r["remove_scratch"] = outcome(os.remove, tree / "rw" / "sub" / "b.txt")
    r["write_outside"] = outcome(write, tree / "evil.txt")
    r["dev_null"] = outcome(write, "/dev/null")
    r["tcp_connect"] = outcome(tcp_connect)
    r["tcp_bind"] = outcome(tcp_bind)
    r["abstract_unix_connect"] = outcome(abstract_connect)
    r["kill_parent"] = outcome(os.kill, os.getppid(), 0)
    r["kill_self"] = outcome(os.kill, os.getpid(), 0)
    return r


@needs_landlock
def test_landlock_confines_files_tcp_abstract_sockets_and_signals(tree):
    listener = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0spade-kernel-test-{os.getpid()}".encode()
    abstract.bind(name)
    abstract.listen(4)
    port = listener.getsockname()[1]
    try:
        control = in_child(lambda: _landlock_checks(tree, False, port, name))
        for path in ("evil.txt", "rw/made"):
            p = tree / path
            p.rmdir() if p.is_dir() else p.unlink()
        (tree / "ro" / "data.txt").write_text("hello")
        confined = in_child(lambda: _landlock_checks(tree, True, port, name))
    finally:
        listener.close()
        abstract.close()
    assert {k: v for k, v in control.items() if v != "ok"} == {"read_allowed": "hello", "list_allowed": ["data.txt"]}
    granted = confined.pop("granted")
    assert granted == {"abi": LANDLOCK_ABI, "filesystem": True, "tcp": LANDLOCK_ABI >= 4,
                       "scopes": LANDLOCK_ABI >= 6, "skipped": [str(tree / "missing")]}
    expected = {"read_allowed": "hello", "list_allowed": ["data.txt"], "write_readonly": "EACCES",
                "read_outside": "EACCES", "list_root": "EACCES", "write_scratch": "ok", "rename_scratch": "ok",
                "truncate_scratch": "ok", "mkdir_scratch": "ok", "remove_scratch": "ok", "write_outside": "EACCES",
                "dev_null": "ok", "tcp_connect": "EACCES" if LANDLOCK_ABI >= 4 else "ok",
                "tcp_bind": "EACCES" if LANDLOCK_ABI >= 4 else "ok",
                "abstract_unix_connect": "EPERM" if LANDLOCK_ABI >= 6 else "ok",
                "kill_parent": "EPERM" if LANDLOCK_ABI >= 6 else "ok", "kill_self": "ok"}
    if "read_hostname" in confined:
        expected["read_hostname"] = "EACCES"
    assert confined == expected
    assert not (tree / "evil.txt").exists() and (tree / "ro" / "data.txt").read_text() == "hello"


@needs_landlock
def test_landlock_probe_reports_without_restricting_the_caller(tmp_path):
    report = landlock.probe()
    assert report["abi"] == LANDLOCK_ABI >= 1 and report["error"] is None
    assert report["filesystem"] is True and report["tcp"] == (LANDLOCK_ABI >= 4)
    assert report["scopes"] == (LANDLOCK_ABI >= 6)
    if os.path.exists("/etc/hostname"):
        Path("/etc/hostname").read_bytes()
    (tmp_path / "after_probe.txt").write_text("still writable")
    assert os.listdir("/") and os.kill(os.getppid(), 0) is None


def test_landlock_refuses_single_paths_and_reports_an_absent_kernel(monkeypatch):
    with pytest.raises(TypeError):
        landlock.restrict("/usr", [])
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)
    assert landlock.restrict(["/usr"], []) == {"abi": 0, "filesystem": False, "tcp": False, "scopes": False,
                                               "skipped": []}
    assert landlock.probe() == {"abi": 0, "filesystem": False, "tcp": False, "scopes": False, "error": None}
    assert [len(landlock._ruleset_attr(abi)) for abi in (1, 3, 4, 5, 6, 7)] == [8, 8, 16, 16, 24, 24]
    assert landlock.handled_fs_rights(1) == 0x1FFF and landlock.handled_fs_rights(7) == 0xFFFF


@needs_landlock
@needs_seccomp
def test_landlock_and_seccomp_together_still_import_and_compute(tree):
    import numpy  # noqa: F401

    expected = json.loads(json.dumps(_workload()))
    stdlib = os.path.dirname(os.__file__)

    def body():
        granted = landlock.restrict([stdlib], [str(tree / "rw")], ["/dev/null"])
        assert seccomp.install() is True
        sys.modules.pop("colorsys", None)  # another test may have imported it: read it again
        fresh = "colorsys" not in sys.modules
        import colorsys  # read from the stdlib directory through the Landlock read rule
        with open(tree / "rw" / "out.json", "w") as f:
            json.dump(_workload(), f)
        with open(tree / "rw" / "out.json") as f:
            result = json.load(f)
        return {"granted": granted["filesystem"], "fresh": fresh and colorsys.rgb_to_hsv(0, 0, 1)[2] == 1,
                "result": result, "read_outside": outcome(lambda: open(tree / "outside.txt").close()),
                "socket": outcome(socket.socket)}

    r = in_child(body)
    assert r == {"granted": True, "fresh": True, "result": expected, "read_outside": "EACCES", "socket": "EPERM"}
