"""Kernel isolation for the sandbox host and its workers: namespaces, a private root, the worker jail.

Linux only; raw syscalls through ctypes (Python 3.11 has no os.unshare/os.setns).

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
* ``probe`` tries the namespace setup in a throwaway child first, so the host only
  commits to namespaces the kernel actually grants.
Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import signal

from spade_jax.sandbox import landlock, seccomp

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

    ``jail`` is the host's per-pool description (``Host.jail``): namespaces, rlimits,
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
