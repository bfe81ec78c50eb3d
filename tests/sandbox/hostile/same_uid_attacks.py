"""Attack: everything an unprivileged process may do to other processes of its own uid.

For the host (kwargs['host_pid']) and every pid in kwargs['pids']: probe it (kill 0), renice
it, pin it to CPU 0, lower its open-file limit to 3 (prlimit), ptrace-attach to it (and
detach at once), read its memory (process_vm_readv), and make it the owner of a pipe with
O_ASYNC and F_SETSIG=SIGKILL before writing to the pipe (so the kernel would SIGKILL it);
once, renice every process of this uid (PRIO_USER). Every call that succeeds is a breach
(kill 0 only leaks that the pid exists, and still counts); ProcessLookupError (the pid is
not in this PID namespace) and PermissionError are fine outcomes.
What should stop it: a PID namespace per episode and a uid per episode (and the syscall
filter for ptrace and process_vm_readv). Observation: JSON, one entry per attempt.
"""

import ctypes
import errno
import fcntl
import json
import os
import resource
import signal
import time

PTRACE_ATTACH, PTRACE_DETACH = 16, 17
F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
WALL = 0x40000000


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                                      ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    return libc


def _errno_name():
    code = ctypes.get_errno()
    return errno.errorcode.get(code, f"errno {code}")


def _ptrace(libc, pid):
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        return _errno_name()
    for _ in range(100):  # wait (bounded) for the attach stop, then let it go
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG | WALL)
        except ChildProcessError:
            break
        if waited:
            break
        time.sleep(0.01)
    libc.ptrace(PTRACE_DETACH, pid, None, None)
    return "BREACH: attached (and detached)"


def _vm_read(libc, pid):
    buf = ctypes.create_string_buffer(64)
    local = _IOVec(ctypes.cast(buf, ctypes.c_void_p), 64)
    remote = _IOVec(id(None), 64)  # same address in any process forked from the same interpreter
    got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if got >= 0:
        return f"BREACH: read {got} bytes of its memory"
    name = _errno_name()
    return f"BREACH: permitted ({name} at a guessed address)" if name == "EFAULT" else name


def _async_owner(pid):
    r, w = os.pipe()
    try:
        fcntl.fcntl(r, fcntl.F_SETOWN, pid)
        fcntl.fcntl(r, F_SETSIG, signal.SIGKILL)
        fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)
        os.write(w, b"x")
        return "BREACH: made it the SIGKILL owner of a pipe and wrote to it"
    finally:
        os.close(r)
        os.close(w)


class SameUidAttacksEnv:
    def __init__(self, max_turns=5, **kwargs):
        pids = []
        for pid in [kwargs.get("host_pid"), *kwargs.get("pids", [])]:
            if pid is not None and int(pid) not in pids and int(pid) > 0:
                pids.append(int(pid))
        self.pids = pids

    def reset(self, seed=None):
        results = {}

        def attempt(name, action, success):
            try:
                outcome = action()
                results[name] = success if outcome is None else outcome
            except OSError as err:
                results[name] = type(err).__name__

        try:
            libc = _libc()
        except (OSError, AttributeError) as err:
            libc, results["libc"] = None, type(err).__name__
        for pid in self.pids:
            attempt(f"kill0:{pid}", lambda: os.kill(pid, 0), "BREACH: it exists and may be signalled")
            attempt(f"setpriority:{pid}", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19), "BREACH: reniced")
            attempt(f"sched_setaffinity:{pid}", lambda: os.sched_setaffinity(pid, {0}), "BREACH: pinned to CPU 0")
            attempt(f"prlimit:{pid}", lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, 3)) and None,
                    "BREACH: lowered its open-file limit to 3")
            if libc is not None:
                attempt(f"ptrace:{pid}", lambda: _ptrace(libc, pid), "")
                attempt(f"process_vm_readv:{pid}", lambda: _vm_read(libc, pid), "")
            attempt(f"f_setown:{pid}", lambda: _async_owner(pid), "")
        attempt("setpriority_user", lambda: os.setpriority(os.PRIO_USER, 0, 19),
                "BREACH: reniced every process of its uid")
        return json.dumps(results), {}

    def step(self, action):
        return "done", 0.0, True, False, {}
