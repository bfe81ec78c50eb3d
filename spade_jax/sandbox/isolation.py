"""Kernel isolation for the sandbox host and its workers: the plan, namespaces, a private root, the jail.

Linux only; raw syscalls through ctypes (Python 3.11 has no os.unshare/os.setns).

The plan (last section of this file) is decided before the host commits to anything:

* ``choose_plan`` applies the demanded level (``auto``, ``strict``, ``namespaces``,
  ``rlimits``) to what ``probe`` finds the kernel grants (the whole namespace setup, tried
  in a throwaway child) and, as root, claims a block of per-episode uids; ``namespaces``
  and ``strict`` fail closed without namespaces;
* ``build_report`` turns the plan, what the host built (pool cgroup, procfs) and what
  seccomp and Landlock grant here into the ``IsolationReport``; ``refusal`` is ``strict``'s
  verdict on that report;
* ``build_jail`` describes how every worker confines itself (``jail_worker``).

The host (``host_start.py``, then ``host.py``) carries the plan out with the mechanisms here:

* The host enters new mount, network, IPC, UTS and PID namespaces (plus a user namespace
  when not root), becomes init of that PID namespace, mounts a procfs of its own (kept as
  an open directory, for the supervisor) and pivots into a private root that holds only
  read-only bind mounts of what the preloaded interpreter needs (stdlib, numpy, the
  directories of loaded shared libraries, a few /dev nodes) and an empty ``/scratch``
  mount point. No /proc, /tmp, home or project directories.
* Each worker (forked by the zygote, ``zygote.py``) is init of its own PID namespace,
  enters its own mount, IPC and network namespaces, mounts a private size-limited tmpfs
  on ``/scratch``, sets rlimits, drops to its own unprivileged uid (or drops every
  capability inside a user namespace), sets no_new_privs, restricts itself with Landlock
  (``landlock.py``) and finally installs the seccomp filter (``seccomp.py``).
  Without namespaces the same jail runs minus the namespace steps, on a private scratch
  directory of the host's disk.

Standard library only.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import platform
import random
import resource
import signal
import socket
import sys
import sysconfig

from spade_jax.sandbox import landlock, seccomp
from spade_jax.sandbox.records import PROTECTIONS, IsolationReport, SandboxConfig

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
HOST_NAMESPACES = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 1 << 14, 1 << 18, 1 << 21
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4

_PIVOT_ROOT_SYSCALL = {"x86_64": 155, "aarch64": 41, "arm64": 41}
_CAP_VERSION_3 = 0x20080522
SCRATCH = "/scratch"
DEV_NODES = ("null", "zero", "urandom", "random")
OOM_SCORE_ADJ_MAX = 1000
_ROOT_MOUNTPOINTS = ("/mnt", "/media", "/srv", "/opt", "/tmp", "/var/tmp", "/home")

_libc = ctypes.CDLL(None, use_errno=True)


class IsolationUnavailable(RuntimeError):
    """The config demands isolation the kernel does not grant here."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(text: str | None):
    return None if text is None else os.fsencode(text)


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
           f"mount {target}")


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(_b(target), ctypes.c_int(flags)), f"umount {target}")


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), f"prctl {option}")


def pivot_root(new_root: str, put_old: str) -> None:
    number = _PIVOT_ROOT_SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown syscall number on {platform.machine()}")
    _check(_libc.syscall(ctypes.c_long(number), _b(new_root), _b(put_old)), "pivot_root")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


def drop_capabilities() -> None:
    """Empties the bounding, ambient, effective, permitted and inheritable capability sets."""
    _drop_bounding_set(strict=True)
    _libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


def write_id_maps(outer_uid: int, outer_gid: int) -> None:
    """Maps root inside a fresh user namespace onto the caller's own uid/gid (like --map-root-user)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {outer_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {outer_gid} 1")


def enter_host_namespaces(user_namespace: bool) -> None:
    """Moves the caller into new namespaces; its next child becomes init of the new PID namespace.

    The caller must be single-threaded (a requirement of user namespaces).
    """
    uid, gid = os.geteuid(), os.getegid()
    unshare(HOST_NAMESPACES | (CLONE_NEWUSER if user_namespace else 0))
    if user_namespace:
        write_id_maps(uid, gid)


def root_mountpoint(sources) -> str:
    """An existing directory to build the new root on that hides none of the bind sources."""
    for candidate in _ROOT_MOUNTPOINTS:
        if os.path.isdir(candidate) and not any(
                s == candidate or s.startswith(candidate + "/") for s in sources):
            return candidate
    raise OSError(errno.ENOENT, "no directory to build the sandbox root on")


def probe(user_namespace: bool) -> str | None:
    """Tries the whole namespace setup in a throwaway child; None when it works, else why not."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        status = 1
        try:
            enter_host_namespaces(user_namespace)
            init = os.fork()
            if init == 0:
                mount(None, "/", None, MS_REC | MS_PRIVATE)
                target = root_mountpoint(())
                mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k")
                unshare(CLONE_NEWPID)
                worker = os.fork()
                if worker == 0:
                    unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET)
                    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k")
                    os._exit(0)
                _, code = os.waitpid(worker, 0)
                os._exit(0 if code == 0 else 3)
            _, code = os.waitpid(init, 0)
            status = 0 if code == 0 else 2
            if status:
                os.write(write_fd, b"mount/pid namespace setup failed inside the new namespaces")
        except OSError as err:
            os.write(write_fd, str(err).encode()[:500])
        finally:
            os._exit(status)
    os.close(write_fd)
    message = b""
    while chunk := os.read(read_fd, 4096):
        message += chunk
    os.close(read_fd)
    _, code = os.waitpid(pid, 0)
    if code == 0:
        return None
    return message.decode(errors="replace") or f"probe exited with status {code}"


def _locked_flags(path: str) -> int:
    """Mount flags of ``path``'s mount that a remount inside a user namespace must keep."""
    st = os.statvfs(path).f_flag
    flags = 0
    for st_bit, ms_bit in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                           (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                           (os.ST_RELATIME, MS_RELATIME)):
        if st & st_bit:
            flags |= ms_bit
    return flags


def _bind_readonly(source: str, target: str) -> None:
    """Read-only bind of ``source``. Inside a user namespace the kernel refuses a plain bind of a
    directory with locked submounts (e.g. driver files mounted into /usr/lib): bind recursively then."""
    try:
        mount(source, target, None, MS_BIND)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | _locked_flags(source))


def minimal_bind_dirs(dirs) -> list[str]:
    """Existing real directories from ``dirs``, dropping any already inside another one."""
    real = sorted({os.path.realpath(d) for d in dirs if d and os.path.isdir(d)})
    kept: list[str] = []
    for d in real:
        if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(d)
    return kept


def mount_private_proc() -> int | None:
    """A procfs of the caller's (new) PID namespace, as an open directory fd; None if refused.

    Called before ``build_private_root``: the mount itself disappears with the old root,
    the fd keeps it readable for the host alone.
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        return None
    return os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def build_private_root(bind_dirs) -> None:
    """Pivots the calling process (already in a new mount namespace) into the private root."""
    bind_dirs = minimal_bind_dirs(bind_dirs)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    new_root = root_mountpoint(bind_dirs)
    mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for source in bind_dirs:
        target = new_root + source
        os.makedirs(target, mode=0o755, exist_ok=True)
        _bind_readonly(source, target)
    os.mkdir(new_root + "/dev", 0o755)
    for node in DEV_NODES:
        if os.path.exists(f"/dev/{node}"):
            open(f"{new_root}/dev/{node}", "w").close()
            mount(f"/dev/{node}", f"{new_root}/dev/{node}", None, MS_BIND)
    os.mkdir(new_root + SCRATCH, 0o755)
    os.mkdir(new_root + "/.old_root", 0o700)
    os.chdir(new_root)
    pivot_root(".", ".old_root")
    os.chdir("/")
    umount("/.old_root", MNT_DETACH)
    os.rmdir("/.old_root")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def worker_rlimits(cpu_seconds: int, address_space: int, file_size: int, open_files: int,
                   processes: int) -> dict[int, tuple[int, int]]:
    """The rlimits every worker runs under (soft, hard); CPU overrun gets SIGXCPU then SIGKILL."""
    return {
        resource.RLIMIT_CPU: (cpu_seconds, cpu_seconds + 1),
        resource.RLIMIT_AS: (address_space, address_space),
        resource.RLIMIT_FSIZE: (file_size, file_size),
        resource.RLIMIT_NOFILE: (open_files, open_files),
        resource.RLIMIT_NPROC: (processes, processes),
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_MEMLOCK: (0, 0),
        resource.RLIMIT_MSGQUEUE: (0, 0),
    }


def jail_worker(jail: dict, scratch: str, uid: int | None, proc_fd: int | None) -> dict:
    """Confines the calling (freshly forked) worker; raises OSError when any step fails.

    ``jail`` is the host's per-pool description (``build_jail``): namespaces, rlimits,
    scratch size, Landlock paths and whether seccomp is available. Returns what Landlock
    put in force.
    """
    os.setsid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if proc_fd is not None:
        fd = os.open("self/oom_score_adj", os.O_WRONLY, dir_fd=proc_fd)
        try:
            os.write(fd, str(OOM_SCORE_ADJ_MAX).encode())
        finally:
            os.close(fd)
    if jail["namespaces"]:
        unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET)
        owner = 0 if uid is None else uid
        mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              f"size={jail['scratch_bytes']},nr_inodes={jail['scratch_inodes']},mode=0700,uid={owner},gid={owner}")
    os.chdir(scratch)
    for which, limits in jail["rlimits"]:
        resource.setrlimit(which, tuple(limits))
    if uid is not None:
        _drop_bounding_set(strict=False)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError(errno.EPERM, "could not switch to the episode uid")
    elif os.geteuid() == 0:
        drop_capabilities()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 0)
    in_force = {}
    if jail["landlock"]:
        in_force = landlock.restrict(jail["read_paths"], [scratch], jail["device_files"])
    if jail["syscall_filter"]:
        seccomp.install()
    return in_force


def worker_rlimits_list(rlimits: dict) -> list:
    """``worker_rlimits`` as JSON-friendly ``[resource, [soft, hard]]`` pairs (the zygote gets JSON)."""
    return [[which, list(limits)] for which, limits in rlimits.items()]


def probe_syscall_filter() -> bool:
    """Whether this kernel accepts the worker seccomp filter (tried in a throwaway child)."""
    if not seccomp.supported():
        return False
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prctl(PR_SET_NO_NEW_PRIVS, 1)
            code = 0 if seccomp.install() else 1
        except OSError:
            pass
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status == 0


def _drop_bounding_set(strict: bool) -> None:
    """Drops every capability from the bounding set; without CAP_SETPCAP only when ``strict``
    does that fail (a uid switch clears the working sets anyway and no_new_privs blocks regaining)."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL:
                return
            if strict or err != errno.EPERM:
                _check(-1, "drop bounding capability")
            return


# --- planning: what the kernel grants, the level, the report and the jail ----------------------

UID_SPAN = 1 << 16
SCRATCH_INODES = 4096
DEVICE_FILES = tuple(f"/dev/{node}" for node in DEV_NODES)


@dataclasses.dataclass
class Plan:
    """The isolation the host will set up, decided by probing before committing to it."""

    namespaces: bool
    user_namespace: bool = False
    notes: list = dataclasses.field(default_factory=list)
    error: str | None = None
    uid_base: int | None = None
    uid_lock: socket.socket | None = None  # kept open: the claim on the uid block lasts while it does


def claim_uid_range() -> tuple[int, socket.socket]:
    """A block of UID_SPAN uids no other sandbox on this machine uses, for per-episode uids.

    The claim is an abstract unix socket named after the block: bound while this process
    (or its forked host) lives, released by the kernel when they exit, nothing on disk.
    Must run in the machine's network namespace, i.e. before entering ours.
    """
    rng = random.SystemRandom()
    for _ in range(256):
        base = rng.randrange(0x4000, 0x7FFF) * UID_SPAN
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0spade-sandbox-uids-{base:x}")
        except OSError:
            lock.close()
            continue
        lock.set_inheritable(False)
        return base, lock
    raise OSError("no free uid block for per-episode uids")


def choose_plan(level: str, user_namespace: bool | None) -> Plan:
    """Probes namespaces (unless disabled) and applies the demanded level; fails closed when asked
    (``Plan.error``). As root outside a user namespace it also claims a block of per-episode uids."""
    plan = _choose_namespaces(level, user_namespace)
    if plan.error is None and os.geteuid() == 0 and not plan.user_namespace:
        plan.uid_base, plan.uid_lock = claim_uid_range()
    return plan


def _choose_namespaces(level: str, user_namespace: bool | None) -> Plan:
    if level == "rlimits":
        return Plan(False, notes=["namespaces not requested (isolation='rlimits')"])
    if os.environ.get("SPADE_SANDBOX_NO_NAMESPACES") == "1":
        reason = "disabled by SPADE_SANDBOX_NO_NAMESPACES=1"
    elif sys.platform != "linux":
        reason = f"not Linux ({sys.platform})"
    else:
        order = [user_namespace] if user_namespace is not None else ([False, True] if os.geteuid() == 0 else [True])
        attempts = []
        for user_ns in order:
            why = probe(user_ns)
            if why is None:
                return Plan(True, user_namespace=user_ns)
            attempts.append(f"{'with a user namespace' if user_ns else 'as root'}: {why}")
        reason = "; ".join(attempts)
    if level in ("namespaces", "strict"):
        return Plan(False, error=(
            f"isolation={level!r} requires namespaces but they are not available ({reason}). "
            "Run as root, or enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; "
            "on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0), or accept weaker isolation "
            "with SandboxConfig(isolation='auto')."))
    return Plan(False, notes=[f"namespaces unavailable ({reason}): workers share the host's network namespace "
                              "and files (seccomp and Landlock still confine them)"])


def outer_uid_is_root() -> bool:
    """Whether the caller's uid 0 is root outside its user namespace too."""
    with open("/proc/self/uid_map") as f:
        first = f.read().split()
    return len(first) >= 2 and first[1] == "0"


def vm_size_bytes() -> int:
    """The caller's address space now: workers get RLIMIT_AS on top of what they inherit."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmSize not found in /proc/self/status")


def runtime_dirs() -> list[str]:
    """What the preloaded interpreter needs: stdlib, numpy, and the directories of loaded libraries.

    Never the interpreter's site-packages as a whole (only numpy from it).
    """
    paths = sysconfig.get_paths()
    site = {os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])}
    dirs = {paths["stdlib"]}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        package = os.path.dirname(numpy.__file__)
        dirs.update({package, package + ".libs"})
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/") and ".so" in os.path.basename(path):
                dirs.add(os.path.dirname(path))
    return [d for d in dirs if os.path.realpath(d) not in site]


def config_rlimits(config: SandboxConfig, vm_bytes: int) -> dict[int, tuple[int, int]]:
    """``worker_rlimits`` for ``config``; the address space is ``memory_mb`` on top of ``vm_bytes``."""
    return worker_rlimits(config.cpu_seconds, vm_bytes + config.memory_mb * (1 << 20),
                          config.disk_mb * (1 << 20), config.open_files, config.max_processes)


def build_report(plan: Plan, config: SandboxConfig, rlimits: dict, *, notes: list, outer_root: bool,
                 cgroup, cgroup_note: str, has_procfs: bool) -> IsolationReport:
    """The protections in force: ``plan`` plus what the host built (``cgroup``: the pool cgroup
    or None, ``has_procfs``: the host reads its workers' /proc) and what seccomp and Landlock
    grant here (probed in throwaway children)."""
    notes = list(notes)
    syscall_filter = probe_syscall_filter()
    if not syscall_filter:
        notes.append("no seccomp filter (unsupported architecture or kernel)")
    ll = landlock.probe()
    if not ll.get("filesystem"):
        notes.append(f"Landlock unavailable ({ll.get('error') or 'kernel without Landlock'}): reads and writes "
                     "outside the scratch directory rest on namespaces, uids and file permissions")
    elif not (ll.get("tcp") and ll.get("scopes")):
        notes.append(f"Landlock ABI {ll.get('abi')}: no TCP rules (needs 4) or no socket/signal scoping (needs 6)")
    per_episode_uid = plan.uid_base is not None
    process_limit = per_episode_uid or not outer_root
    if plan.user_namespace:
        notes.append("one uid for all episodes (only one uid is mapped in the user namespace); capabilities dropped")
    if not process_limit:
        notes.append("the process limit is not enforced for root's uid: fork is not blocked")
    if cgroup is None:
        notes.append(f"no pool cgroup ({cgroup_note}): " + (
            "the host sums its workers' memory against the budget" if has_procfs
            else "no procfs either, so the pool memory budget is not enforced"))
    if not plan.namespaces:
        notes.append("scratch directories are on the host's disk; the host bounds their size after every call "
                     "and while calls run")
    protections = {
        "zygote": True, "idle_stop": True, "seccomp": syscall_filter,
        "private_root": plan.namespaces, "pid_namespace": plan.namespaces,
        "network_namespace": plan.namespaces, "ipc_namespace": plan.namespaces,
        "per_episode_uid": per_episode_uid, "process_limit": process_limit,
        "landlock_filesystem": bool(ll.get("filesystem")), "landlock_network": bool(ll.get("tcp")),
        "landlock_scopes": bool(ll.get("scopes")),
        "memory_cgroup": cgroup is not None, "pids_cgroup": cgroup is not None,
        "scratch_tmpfs": plan.namespaces,
    }
    assert set(protections) == set(PROTECTIONS)
    if cgroup is not None:
        memory_by = processes_by = cgroup.describe()
    else:
        memory_by = ("host supervisor (sum of what each worker's resident set grew beyond the zygote's)"
                     if has_procfs else "not enforced")
        processes_by = ("per-episode RLIMIT_NPROC" if process_limit else "not enforced") + \
            f" x max_live_episodes={config.max_live_episodes}"
    method = ("user-namespaces" if plan.user_namespace else "namespaces") if plan.namespaces else "rlimits"
    return IsolationReport(
        method=method, protections=protections,
        rlimits={"cpu_s": config.cpu_seconds, "address_space_mb": rlimits[resource.RLIMIT_AS][0] >> 20,
                 "file_size_mb": config.disk_mb, "open_files": config.open_files,
                 "processes": config.max_processes},
        budget={"memory_mb": config.pool_memory_mb, "memory_by": memory_by, "processes": config.pool_processes,
                "processes_by": processes_by, "episode_time_s": config.episode_time_s,
                "cgroup_paths": list(cgroup.paths) if cgroup is not None else []},
        notes=tuple(notes))


def refusal(level: str, report: IsolationReport) -> str | None:
    """Why ``level`` refuses to run under ``report``, or None (only ``strict`` asks for every protection)."""
    if level == "strict" and report.missing:
        return ("isolation='strict' but these protections are not in force: "
                f"{', '.join(report.missing)} ({'; '.join(report.notes)})")
    return None


def build_jail(plan: Plan, config: SandboxConfig, report: IsolationReport, rlimits: dict, read_paths: list,
               sys_path: list) -> dict:
    """How every worker confines itself (``jail_worker``), plus what it needs to run (its
    ``sys.path``, whether imports are restricted, the message size cap); the host sends it
    once to the zygote."""
    return {"namespaces": plan.namespaces, "rlimits": worker_rlimits_list(rlimits),
            "scratch_bytes": config.disk_mb << 20, "scratch_inodes": SCRATCH_INODES,
            "landlock": report.protections["landlock_filesystem"], "read_paths": read_paths,
            "device_files": [f for f in DEVICE_FILES if os.path.exists(f)],
            "syscall_filter": report.protections["seccomp"], "sys_path": sys_path,
            "restrict_imports": config.restrict_imports, "max_message_bytes": config.max_message_bytes}
