"""Start-up of the sandbox host process: isolation first, then the zygote, then the config, then the loop.

``SandboxPool`` starts it as ``python -m spade_jax.sandbox.host_start --isolation ...`` (the
few settings isolation needs are arguments) with a scrubbed environment and talks to it in
frames (``protocol.py``) over the host's stdin/stdout. Start-up, in this order:

1. preload numpy, the allowed stdlib modules and the worker code (pages workers share);
2. switch to ``--uid`` when asked, take the isolation plan (``isolation.choose_plan``:
   what the kernel grants, under the demanded level), create the pool cgroup when the
   machine allows;
3. enter namespaces when granted (becoming init of a new PID namespace, so every worker
   dies with it), mount a procfs of its own, pivot into the private root;
4. fork the zygote (``zygote.py``): the template every worker is forked from. It exists
   before the host has read its config or any request, so no worker can find them;
5. only now read the ``SandboxConfig`` frame, tell the zygote how workers jail
   themselves (``isolation.build_jail``) and answer with the ``IsolationReport``
   (``isolation.build_report``), or refuse (``strict``).

Then ``Host`` (``host.py``) serves requests in its event loop until shutdown.
"""

from __future__ import annotations

import argparse
import encodings
import gc
import importlib
import os
import pkgutil
import random
import resource
import signal
import socket
import sys
import sysconfig
import tempfile
import traceback

from spade_jax.sandbox import isolation, zygote
from spade_jax.sandbox.cgroups import PoolCgroup
from spade_jax.sandbox.host import Host, HostBase, HostFailure
from spade_jax.sandbox.policy import ALLOWED_MODULES
from spade_jax.sandbox.protocol import ProtocolError, encode_frame, read_frame, write_all
from spade_jax.sandbox.records import ISOLATION_LEVELS, SandboxConfig

# Modules the allowed ones load lazily on first use (numpy submodules, datetime.strptime's
# _strptime, every text codec): preloaded so workers never need to read the filesystem, which
# a per-episode uid may not be allowed to (an interpreter under a private home) and Landlock
# or the private root may not show.
_PRELOAD_EXTRA = ("numpy.random", "numpy.linalg", "numpy.fft", "numpy.polynomial", "numpy.ma", "numpy.char",
                  "numpy.rec", "numpy.strings", "numpy.exceptions", "numpy.dtypes", "numpy.lib.stride_tricks",
                  "numpy.lib.recfunctions", "_strptime", "spade_jax.envs.contract", "spade_jax.envs.tool_use")


def _preload() -> None:
    """Imports everything a worker may use, so workers share the pages and never need the filesystem."""
    codecs = [f"encodings.{m.name}" for m in pkgutil.iter_modules(encodings.__path__)]
    for name in sorted(ALLOWED_MODULES - {"__future__"}) + list(_PRELOAD_EXTRA) + codecs:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    sysconfig.get_paths()  # loads (and caches) the build config while the files are still readable


def _drop_privileges(uid: int, gid: int) -> None:
    """Becomes ``uid``/``gid`` for good (the client started the host as root)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.geteuid() != uid or os.getegid() != gid:
        raise OSError(f"could not switch the sandbox host to uid {uid}")
    # A uid switch leaves the process undumpable: its /proc files stay root's, so it could not
    # write its own uid map (user namespaces) nor its workers their OOM score. Workers never
    # reach the host's /proc entries: PID namespaces or Landlock hide them, seccomp denies ptrace.
    isolation.prctl(isolation.PR_SET_DUMPABLE, 1)


def _build_base(plan: isolation.Plan, cgroup: PoolCgroup | None, cgroup_note: str,
                client_fds: tuple[int, ...]) -> HostBase:
    """Everything before the config: fds, the private root (or a private dir), the zygote."""
    notes = list(plan.notes)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    read_paths = isolation.minimal_bind_dirs(isolation.runtime_dirs())
    vm_bytes = isolation.vm_size_bytes()
    outer_root = os.geteuid() == 0 and (not plan.user_namespace or isolation.outer_uid_is_root())
    pool_dir = None
    if plan.namespaces:
        pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        proc_fd = isolation.mount_private_proc()
        if proc_fd is None:
            notes.append("could not mount a procfs for the host (the pool memory budget needs it or a cgroup)")
        isolation.build_private_root(read_paths)
        isolation.sethostname("sandbox")
    else:
        pidns_fd = None
        proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        pool_dir = tempfile.mkdtemp(prefix="spade_sandbox_")
        os.chmod(pool_dir, 0o711)
    stdlib = sysconfig.get_paths()["stdlib"]
    sys_path = [p for p in sys.path if p == stdlib or p.startswith(stdlib + "/")]
    gc.collect()
    gc.freeze()
    host_sock, zygote_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            host_sock.close()
            for fd in client_fds:
                os.close(fd)
            isolation.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL)
            if not plan.namespaces:
                isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
            zygote.Zygote(zygote_sock, proc_fd, pidns_fd).run()
        finally:
            os._exit(1)
    zygote_sock.close()
    if cgroup is not None:
        cgroup.join(pid)
    return HostBase(plan, proc_fd, pidns_fd, pool_dir, read_paths, sys_path, pid, host_sock, cgroup, cgroup_note, notes,
                 vm_bytes, outer_root)


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spade_jax.sandbox.host_start")
    parser.add_argument("--isolation", choices=ISOLATION_LEVELS, default="auto")
    parser.add_argument("--user-namespace", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--gid", type=int, default=None)
    parser.add_argument("--pool-memory-mb", type=int, required=True)
    parser.add_argument("--pool-processes", type=int, required=True)
    return parser.parse_args(argv)


def _guard_from_outside(cgroup: PoolCgroup | None, client_fds: tuple[int, ...]) -> None:
    """Forks: the child goes on as the host (init of the new PID namespace, if one was entered),
    the parent waits for it and then removes the pool cgroup, however the host ended."""
    child = os.fork()
    if child == 0:
        isolation.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL)
        return
    for fd in client_fds:
        os.close(fd)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if cgroup is not None:
        cgroup.close()
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _refuse(reply_fd: int, error: str, kind: str, code: int):
    write_all(reply_fd, encode_frame({"ok": False, "error": error, "kind": kind}))
    sys.exit(code)


def main() -> None:
    """Entry point: preload, isolate, fork the zygote, then read the config, hand-shake, serve."""
    cmd_fd, reply_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    for fd in (cmd_fd, reply_fd, devnull):
        os.set_inheritable(fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    options = _options(sys.argv[1:])
    _preload()
    if options.uid is not None:
        _drop_privileges(options.uid, options.gid if options.gid is not None else options.uid)
    user_ns = {"auto": None, "yes": True, "no": False}[options.user_namespace]
    plan = isolation.choose_plan(options.isolation, user_ns)
    if plan.error:
        _refuse(reply_fd, plan.error, "isolation", 3)
    cgroup, cgroup_note = PoolCgroup.create(options.pool_memory_mb << 20, options.pool_processes,
                                            f"spade-sandbox-{os.getpid()}-{random.SystemRandom().getrandbits(32):08x}")
    if plan.namespaces:
        isolation.enter_host_namespaces(plan.user_namespace)
    _guard_from_outside(cgroup, (cmd_fd, reply_fd))
    try:
        base = _build_base(plan, cgroup, cgroup_note, (cmd_fd, reply_fd))
    except Exception as err:
        traceback.print_exc(file=sys.stderr)
        _refuse(reply_fd, f"sandbox host setup failed: {err}", "setup" if plan.namespaces else "fatal", 4)
    try:
        config = SandboxConfig.from_dict(read_frame(cmd_fd, 1 << 20))
    except (EOFError, ProtocolError, TypeError, ValueError) as err:
        _refuse(reply_fd, f"bad sandbox config: {err}", "fatal", 2)
    try:
        host = Host(config, base, cmd_fd, reply_fd)
    except Exception as err:
        traceback.print_exc(file=sys.stderr)
        _refuse(reply_fd, f"sandbox host setup failed: {err}", "fatal", 4)
    refusal = isolation.refusal(options.isolation, host.report)
    if refusal:
        _refuse(reply_fd, refusal, "isolation", 3)
    write_all(reply_fd, encode_frame({"ok": True, "isolation": host.report.to_dict()}))
    try:
        host.serve()
    except HostFailure as err:
        print(f"sandbox host: {err}", file=sys.stderr)
        sys.exit(5)


if __name__ == "__main__":
    main()
