"""A pool cgroup: one memory and process budget for the whole sandbox, on top of per-worker rlimits.

``PoolCgroup.create`` makes a child cgroup of the calling process's own cgroup in the memory
and pids hierarchies (cgroup v1: two hierarchies, or one where they are co-mounted; cgroup
v2: the unified one) and sets its limits. The host moves the zygote into it right after
forking it, so every worker (forked from the zygote) starts inside, and all episodes
together cannot take more than the pool's memory or processes: past the memory limit the
kernel's OOM killer kills a process *inside the pool* (the one with the largest footprint,
not necessarily the one that allocated last), and past the process limit fork and clone
fail with EAGAIN inside the pool.

What is charged: a page is charged to the cgroup of the process that first touches it and
stays charged there until it is freed; joining later does not move earlier pages (v1 only
moves them with the deprecated ``memory.move_charge_at_immigrate``, v2 never). That holds
for anonymous memory, page cache, tmpfs/shm files and memfd pages alike (an memfd or tmpfs
file that a joined process writes is charged to the pool even when another process holds
it), and for most kernel memory the processes cause (page tables, slab, socket buffers).
This is why the sandbox's process tree joins *before* running any program: a worker forked
from the zygote shares the pages the zygote got from the preloaded host (charged to the
host's cgroup) and only the pages it writes itself count against the pool. tmpfs/shm pages
and page cache in shared filesystems outlive their processes and stay charged to the pool
until the files are removed (or the cache reclaimed).

Nothing here assumes cgroups work: missing, read-only or undelegated cgroups make
``create`` return ``(None, reason)``. After ``create`` every access goes through directory
fds (``dir_fd=``), so the object keeps working after the caller pivots into a root with no
/sys and no /proc. Standard library only.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import secrets
import signal
import time

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_CONTROLLERS = ("memory", "pids")
_KILL_POLL_S = 0.01


@dataclasses.dataclass
class _Location:
    """Where the caller's cgroup of one hierarchy lives: ``path`` on disk, ``controllers`` it serves."""

    path: str
    controllers: tuple[str, ...]


@dataclasses.dataclass
class _Layout:
    version: int
    locations: list[_Location]


@dataclasses.dataclass
class _Dir:
    """One created cgroup directory, reachable only through fds once created."""

    controllers: tuple[str, ...]
    name: str
    path: str            # for messages only; never opened after create()
    parent_fd: int
    fd: int
    procs_fd: int        # O_WRONLY on cgroup.procs (the join fd)


def _unescape(field: str) -> str:
    """Undoes mountinfo's octal escapes (\\040 for a space and so on)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[tuple[str, str, str, str]]:
    """(fstype, mount root, mount point, super options) of every cgroup/cgroup2 mount in ``text``."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 4 or sep < 5:
            continue
        fstype = fields[sep + 1]
        if fstype in ("cgroup", "cgroup2"):
            mounts.append((fstype, _unescape(fields[3]), _unescape(fields[4]), fields[sep + 3]))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller name (``""`` for the v2 line ``0::``) -> the caller's cgroup path in that hierarchy."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if path.endswith(" (deleted)"):
            path = path[:-len(" (deleted)")]
        for name in (controllers.split(",") if controllers else [""]):
            paths[name] = path
    return paths


def _join_mount(mount_root: str, mount_point: str, cg_path: str) -> str | None:
    """The on-disk directory of cgroup ``cg_path`` through a mount of hierarchy subtree ``mount_root``."""
    if mount_root == "/":
        rel = cg_path
    elif cg_path == mount_root or cg_path.startswith(mount_root.rstrip("/") + "/"):
        rel = cg_path[len(mount_root):]
    else:
        return None
    rel = rel.strip("/")
    return os.path.join(mount_point, rel) if rel else mount_point


def locate(mountinfo: str, proc_cgroup: str, isdir=os.path.isdir) -> tuple[_Layout | None, str]:
    """Decides v1 or v2 and finds the caller's cgroup directories for memory and pids.

    Pure apart from ``isdir``: takes the text of /proc/self/mountinfo and /proc/self/cgroup.
    Returns (layout, "") or (None, reason). v1 wins when both memory and pids are v1
    hierarchies (a hybrid system whose unified mount lacks them); v2 needs the unified
    hierarchy to offer both controllers, which ``create`` checks on disk.
    """
    mounts = parse_mountinfo(mountinfo)
    paths = parse_proc_cgroup(proc_cgroup)
    if not mounts:
        return None, "no cgroup filesystem is mounted"
    v1: dict[str, _Location] = {}
    for controller in _CONTROLLERS:
        if controller not in paths:
            continue
        for fstype, root, point, opts in mounts:
            served = tuple(o for o in opts.split(",") if o in _CONTROLLERS)
            if fstype != "cgroup" or controller not in opts.split(","):
                continue
            where = _join_mount(root, point, paths[controller])
            if where is not None and isdir(where):
                v1[controller] = _Location(where, served)
                break
    if len(v1) == 2:
        locations = []
        for controller in _CONTROLLERS:
            loc = v1[controller]
            if all(existing.path != loc.path for existing in locations):
                locations.append(loc)
        return _Layout(1, locations), ""
    if v1:
        only = next(iter(v1))
        return None, (f"the {only} controller is on a cgroup v1 hierarchy but "
                      f"{'pids' if only == 'memory' else 'memory'} is not: a pool cannot span v1 and v2")
    if "" in paths:
        for fstype, root, point, _ in mounts:
            if fstype != "cgroup2":
                continue
            where = _join_mount(root, point, paths[""])
            if where is not None and isdir(where):
                return _Layout(2, [_Location(where, _CONTROLLERS)]), ""
        return None, "cgroup v2 is in use but this process's cgroup is not visible under any cgroup2 mount"
    return None, "neither the memory nor the pids controller is mounted (no cgroup v1 hierarchy, no cgroup v2)"


def _read_text(name: str, dir_fd: int) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _write_text(name: str, value: str, dir_fd: int) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _keyed(text: str, key: str) -> int | None:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return None


def _why(err: OSError, what: str) -> str:
    if err.errno in (errno.EROFS,):
        return f"{what}: the cgroup filesystem is read-only"
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"{what}: permission denied (cgroups not delegated to this user)"
    return f"{what}: {err.strerror or err}"


def _close_fds(fds) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


class PoolCgroup:
    """A child cgroup holding every process of the sandbox, with one memory and one pids limit.

    Create with ``PoolCgroup.create``; processes join through ``join(pid)``. The
    caller itself should not join (``kill_all`` spares the calling process, and its
    directories cannot be removed while it is inside). Every method works through the
    directory fds opened in ``create``. The fds are O_CLOEXEC but survive fork: a forked
    worker must close all of ``fds()`` after joining (a jailed process that keeps the join
    fd can still only move its own processes into the pool; one that keeps a directory fd
    of the parent cgroup while still uid 0 could move itself out).

    Memory is charged where it is first touched (see the module docstring): join first,
    then run programs. When the pool hits its memory limit the OOM killer picks the member
    with the largest footprint, so the caller must stay outside (or set its own
    oom_score_adj to -1000).
    """

    def __init__(self, version: int, dirs: list[_Dir], memory_limit: int, max_processes: int,
                 swap_limited: bool, enabled_controllers: list[tuple[int, str]]):
        self.version = version
        self._dirs = dirs
        self.memory_limit = memory_limit
        self.max_processes = max_processes
        self.swap_limited = swap_limited
        self._enabled = enabled_controllers   # (parent fd, "+memory +pids") we wrote on v2
        self._closed = False
        self.last_error: str | None = None
        self.name = dirs[0].name
        self.paths = tuple(d.path for d in dirs)
        self._memory = next(d for d in dirs if "memory" in d.controllers)
        self._pids = next(d for d in dirs if "pids" in d.controllers)

    # ---------------------------------------------------------------- creation
    @classmethod
    def create(cls, memory_bytes: int, max_processes: int, name: str) -> tuple["PoolCgroup | None", str]:
        """Makes cgroup ``name`` under the caller's own cgroup with these limits.

        Returns (pool, "") or (None, one-line reason) when cgroups are missing, read-only,
        not delegated, or lack the memory/pids controllers; never raises for those.
        ``name`` must be unique on the machine (an existing cgroup of that name is an error).
        """
        if memory_bytes < 1 or max_processes < 1:
            raise ValueError("memory_bytes and max_processes must be positive")
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"bad cgroup name {name!r}")
        try:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
            with open("/proc/self/cgroup") as f:
                proc_cgroup = f.read()
        except OSError as err:
            return None, f"cannot read /proc/self/mountinfo or /proc/self/cgroup: {err.strerror}"
        layout, reason = locate(mountinfo, proc_cgroup)
        if layout is None:
            return None, reason
        if layout.version == 1:
            return cls._create_v1(layout, memory_bytes, max_processes, name)
        return cls._create_v2(layout, memory_bytes, max_processes, name)

    @staticmethod
    def _make_dir(loc: _Location, name: str, opened: list[int], made: list[tuple[int, str]],
                  parent_fd: int | None = None) -> _Dir:
        """mkdir + fds (opening ``loc.path`` unless its fd is given); records what it opened/made
        so a failing create can undo it. Raises OSError."""
        if parent_fd is None:
            parent_fd = os.open(loc.path, _DIR_FLAGS)
            opened.append(parent_fd)
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        made.append((parent_fd, name))
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
        opened.append(fd)
        procs_fd = os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd)
        opened.append(procs_fd)
        return _Dir(loc.controllers, name, os.path.join(loc.path, name), parent_fd, fd, procs_fd)

    @classmethod
    def _undo(cls, opened: list[int], made: list[tuple[int, str]], enabled=()) -> None:
        """Removes what a failing create() made, takes back what it enabled, closes what it opened."""
        for parent_fd, name in reversed(made):
            try:
                os.rmdir(name, dir_fd=parent_fd)
            except OSError:
                pass
        cls._disable(enabled)
        _close_fds(reversed(opened))

    @classmethod
    def _create_v1(cls, layout: _Layout, memory_bytes: int, max_processes: int, name: str):
        opened: list[int] = []
        made: list[tuple[int, str]] = []
        dirs: list[_Dir] = []
        step = "open the cgroup directories"
        try:
            for loc in layout.locations:
                step = f"create {os.path.join(loc.path, name)}"
                dirs.append(cls._make_dir(loc, name, opened, made))
            memory = next(d for d in dirs if "memory" in d.controllers)
            pids = next(d for d in dirs if "pids" in d.controllers)
            step = "set memory.limit_in_bytes"
            _write_text("memory.limit_in_bytes", str(memory_bytes), memory.fd)
            swap_limited = False
            if _exists("memory.memsw.limit_in_bytes", memory.fd):
                step = "set memory.memsw.limit_in_bytes"
                _write_text("memory.memsw.limit_in_bytes", str(memory_bytes), memory.fd)
                swap_limited = True
            try:
                # v1 copies oom_kill_disable from the parent: make sure the pool kills, not hangs.
                _write_text("memory.oom_control", "0", memory.fd)
            except OSError:
                pass
            step = "set pids.max"
            _write_text("pids.max", str(max_processes), pids.fd)
        except OSError as err:
            cls._undo(opened, made)
            if err.errno == errno.EEXIST:
                return None, f"{step}: a cgroup named {name!r} already exists"
            return None, _why(err, f"cgroup v1: cannot {step}")
        return cls(1, dirs, memory_bytes, max_processes, swap_limited or not _swap_present(), []), ""

    @classmethod
    def _create_v2(cls, layout: _Layout, memory_bytes: int, max_processes: int, name: str):
        loc = layout.locations[0]
        opened: list[int] = []
        made: list[tuple[int, str]] = []
        enabled: list[tuple[int, str]] = []
        try:
            parent_fd = os.open(loc.path, _DIR_FLAGS)
        except OSError as err:
            return None, _why(err, f"cgroup v2: cannot open {loc.path}")
        opened.append(parent_fd)
        try:
            available = _read_text("cgroup.controllers", parent_fd).split()
            active = _read_text("cgroup.subtree_control", parent_fd).split()
        except OSError as err:
            cls._undo(opened, made)
            return None, _why(err, f"cgroup v2: cannot read the controllers of {loc.path}")
        missing = [c for c in _CONTROLLERS if c not in available]
        if missing:
            cls._undo(opened, made)
            return None, (f"cgroup v2: controller(s) {', '.join(missing)} not available in {loc.path} "
                          "(not enabled by the parent cgroup / not delegated)")
        to_enable = " ".join(f"+{c}" for c in _CONTROLLERS if c not in active)
        if to_enable:
            try:
                _write_text("cgroup.subtree_control", to_enable, parent_fd)
            except OSError as err:
                cls._undo(opened, made)
                if err.errno == errno.EBUSY:
                    return None, (f"cgroup v2: cannot enable {to_enable} in {loc.path}/cgroup.subtree_control: "
                                  "the cgroup has processes of its own (no-internal-processes rule); start the "
                                  "sandbox from a cgroup whose children may get memory and pids, e.g. move the "
                                  "trainer into a leaf of a delegated cgroup first")
                return None, _why(err, f"cgroup v2: cannot enable {to_enable} in {loc.path}")
            enabled.append((parent_fd, to_enable))
        step = f"create {os.path.join(loc.path, name)}"
        try:
            d = cls._make_dir(loc, name, opened, made, parent_fd)
            fd = d.fd
            step = "set memory.max"
            _write_text("memory.max", str(memory_bytes), fd)
            swap_limited = False
            if _exists("memory.swap.max", fd):
                step = "set memory.swap.max"
                _write_text("memory.swap.max", "0", fd)
                swap_limited = True
            step = "set pids.max"
            _write_text("pids.max", str(max_processes), fd)
        except OSError as err:
            cls._undo(opened, made, enabled)
            if err.errno == errno.EEXIST:
                return None, f"cgroup v2: {step}: a cgroup named {name!r} already exists"
            return None, _why(err, f"cgroup v2: cannot {step}")
        return cls(2, [d], memory_bytes, max_processes, swap_limited or not _swap_present(), enabled), ""

    @staticmethod
    def _disable(enabled) -> None:
        """Best effort (v2): takes back the controllers create() enabled, unless another child cgroup exists."""
        for parent_fd, spec in enabled:
            try:
                if any(entry.is_dir(follow_symlinks=False) for entry in os.scandir(parent_fd)):
                    continue
                _write_text("cgroup.subtree_control", spec.replace("+", "-"), parent_fd)
            except OSError:
                pass

    # ---------------------------------------------------------------- reporting
    def describe(self) -> str:
        """One line for the isolation report, e.g. ``cgroup v1: memory 4096 MB, 4096 processes``."""
        line = f"cgroup v{self.version}: memory {self.memory_limit >> 20} MB, {self.max_processes} processes"
        if not self.swap_limited:
            line += " (swap not limited: the kernel has no swap accounting)"
        return line

    def fds(self) -> list[int]:
        """Every fd this object holds (a forked worker closes them all after joining)."""
        out: list[int] = []
        for d in self._dirs:
            out += [d.procs_fd, d.fd, d.parent_fd]
        return sorted(set(out))

    # ---------------------------------------------------------------- membership
    def join(self, pid: int) -> None:
        """Moves process ``pid`` (in the caller's PID namespace; its whole thread group) into the pool."""
        self._check_open()
        for d in self._dirs:
            os.write(d.procs_fd, str(int(pid)).encode())

    def pids(self) -> list[int]:
        """Members visible from the caller's PID namespace (on v1: the union of both hierarchies)."""
        self._check_open()
        members: set[int] = set()
        for d in self._dirs:
            try:
                text = _read_text("cgroup.procs", d.fd)
            except OSError:
                continue
            members.update(int(p) for p in text.split() if p.isdigit() and int(p) > 0)
        return sorted(members)

    # ---------------------------------------------------------------- measurements
    def memory_bytes(self) -> int:
        """Memory charged to the pool now (v1 memory.usage_in_bytes, v2 memory.current)."""
        self._check_open()
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        return int(_read_text(name, self._memory.fd))

    def oom_kills(self) -> int:
        """Processes the OOM killer killed in the pool so far (0 where the kernel does not count them)."""
        self._check_open()
        if self.version == 1:
            value = _keyed(_read_text("memory.oom_control", self._memory.fd), "oom_kill")
        else:
            value = _keyed(_read_text("memory.events", self._memory.fd), "oom_kill")
        return value or 0

    def processes(self) -> int:
        """Processes and threads counted against pids.max (pids.current)."""
        self._check_open()
        return int(_read_text("pids.current", self._pids.fd))

    # ---------------------------------------------------------------- teardown
    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILLs every member except the caller; True once none is left.

        v2 with cgroup.kill (Linux 5.14+) kills the whole cgroup atomically. Otherwise forks
        are stopped first (pids.max set to 0 for the duration) and every listed pid is sent
        SIGKILL, again and again until the pool is empty or ``timeout_s`` has passed.
        Killed processes leave cgroup.procs as they exit, but ``processes()`` (pids.current)
        drops only once their parents reap them.
        """
        self._check_open()
        me = os.getpid()
        deadline = time.monotonic() + timeout_s
        if self.version == 2 and _exists("cgroup.kill", self._dirs[0].fd) and me not in self.pids():
            try:
                _write_text("cgroup.kill", "1", self._dirs[0].fd)
            except OSError:
                pass
        frozen = False
        try:
            while True:
                left = [p for p in self.pids() if p != me]
                if not left:
                    return True
                if not frozen:
                    try:
                        _write_text("pids.max", "0", self._pids.fd)
                        frozen = True
                    except OSError:
                        pass
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                if time.monotonic() >= deadline:
                    return not [p for p in self.pids() if p != me]
                time.sleep(_KILL_POLL_S)
        finally:
            if frozen:
                try:
                    _write_text("pids.max", str(self.max_processes), self._pids.fd)
                except OSError:
                    pass

    def close(self, timeout_s: float = 5.0) -> bool:
        """Kills every member, removes the cgroup directories and closes the fds. Idempotent.

        True when nothing is left behind; otherwise ``last_error`` says what is (the fds are
        closed either way; a directory that could not be removed is left to the kernel's
        usual rules, e.g. removable by hand once its processes are gone).
        """
        if self._closed:
            return self.last_error is None
        errors = []
        if not self.kill_all(timeout_s):
            errors.append(f"processes still in the pool after {timeout_s:g} s: {self.pids()[:10]}")
        deadline = time.monotonic() + max(timeout_s, 1.0)
        for d in self._dirs:
            while True:
                try:
                    os.rmdir(d.name, dir_fd=d.parent_fd)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    # EBUSY while killed members finish exiting.
                    if err.errno != errno.EBUSY or time.monotonic() >= deadline:
                        errors.append(f"cannot remove {d.path}: {err.strerror}")
                        break
                    time.sleep(_KILL_POLL_S)
        self._disable(self._enabled)
        _close_fds(self.fds())
        self._closed = True
        self.last_error = "; ".join(errors) or None
        return not errors

    def __enter__(self) -> "PoolCgroup":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the pool cgroup is closed")


def _swap_present() -> bool:
    """Whether the machine has any swap (read at create time, before any pivot)."""
    try:
        with open("/proc/swaps") as f:
            return len(f.read().strip().splitlines()) > 1
    except OSError:
        return True


def available() -> tuple[bool, str]:
    """Whether a pool cgroup can be made here: tries one (tiny limits) and removes it again."""
    pool, reason = PoolCgroup.create(64 << 20, 16, f"spade-probe-{os.getpid()}-{secrets.token_hex(4)}")
    if pool is None:
        return False, reason
    line = f"cgroup v{pool.version}: pools can be made under {', '.join(os.path.dirname(p) for p in pool.paths)}"
    if not pool.close():
        return False, f"{line}, but the probe cgroup could not be removed: {pool.last_error}"
    return True, line
