"""The supervisor's own measurements and clean-ups where no pool cgroup is available.

* ``rss_bytes``: one read of /proc/<pid>/statm per process; ``read_proc`` any /proc file.
* ``tree_usage``: disk use of a directory tree (allocated blocks), bounded by an entry count.
* ``sweep_owned``: removes what given uids left in shared directories (/tmp, /var/tmp,
  /dev/shm) once their processes are dead.

Everything walks directories through fds (openat with O_NOFOLLOW, unlinkat), never follows a
symlink, never crosses into another filesystem and never recurses in Python. Standard
library only (the host must stay JAX- and numpy-free).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Container, Iterator, Sequence

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PAGE = os.sysconf("SC_PAGE_SIZE")
_GONE = (errno.ENOENT, errno.ESRCH)
# Directories kept open at once while walking; deeper levels are reopened through "..".
_MAX_OPEN_DIRS = 64


def read_proc(pid: int, name: str, proc_fd: int | None) -> bytes | None:
    """The whole of /proc/<pid>/<name> (relative to ``proc_fd`` when given); None when the process is gone."""
    rel = f"{int(pid)}/{name}"
    try:
        if proc_fd is None:
            fd = os.open("/proc/" + rel, os.O_RDONLY | os.O_CLOEXEC)
        else:
            fd = os.open(rel, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd)
    except OSError as err:
        if err.errno in _GONE:
            return None
        raise
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 16384)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as err:
        if err.errno in _GONE:
            return None
        raise
    finally:
        os.close(fd)


def rss_bytes(pid: int, proc_fd: int | None = None) -> int | None:
    """Resident set size of ``pid`` in bytes from /proc/<pid>/statm; None when the process is gone.

    Read under ``proc_fd``, an O_DIRECTORY fd of a procfs root, when given (a pivoted
    supervisor keeps one; ``pid`` must be in that procfs's PID namespace), else /proc. One
    small read (far cheaper than smaps_rollup's PSS; figures in bench/RESULTS.md), readable
    by the worker's supervisor even when the worker is undumpable. Pages shared with the process it was
    forked from count in full, so a supervisor compares it with that process's RSS.
    """
    raw = read_proc(pid, "statm", proc_fd)
    if not raw:
        return None
    fields = raw.split()
    return int(fields[1]) * _PAGE if len(fields) > 1 else None


class _Frame:
    __slots__ = ("fd", "dev", "ino", "names", "path", "name", "uid")

    def __init__(self, fd, st, names, path, name):
        self.fd, self.dev, self.ino, self.uid = fd, st.st_dev, st.st_ino, st.st_uid
        self.names, self.path, self.name = names, path, name


def _listdir(fd: int) -> list[str]:
    try:
        return os.listdir(fd)
    except OSError:
        return []


def _walk(root: str, descend=None) -> Iterator[tuple[str, int, str, os.stat_result, str]]:
    """Iterative walk of ``root``'s filesystem below it: yields (event, parent_fd, name, lstat, path).

    event "entry" comes for every entry (directories before their contents), "leave" for a
    directory once its contents are done (post-order); the parent fd is open while the
    consumer runs, so it may unlinkat/rmdir the entry through it. Symlinks are never
    followed (the root itself excepted), other filesystems are skipped entirely, entries that
    vanish are skipped, a directory replaced between lstat and open is skipped. At most
    _MAX_OPEN_DIRS directory fds are open: deeper trees are walked back up through ".." with
    a device/inode check (a directory moved meanwhile ends the walk of that root).
    ``descend(lstat)``, when given, decides whether to enter a directory below the root.
    Raises OSError when ``root`` cannot be opened.
    """
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(root_fd)
    root_dev = st.st_dev
    stack = [_Frame(root_fd, st, _listdir(root_fd), root.rstrip("/") or "/", "")]
    low = 0       # stack[:low] have their fds closed
    try:
        while stack:
            top = stack[-1]
            if top.names:
                name = top.names.pop()
                try:
                    est = os.stat(name, dir_fd=top.fd, follow_symlinks=False)
                except OSError:
                    continue
                if est.st_dev != root_dev:
                    continue
                path = f"{top.path.rstrip('/')}/{name}"
                yield "entry", top.fd, name, est, path
                if not stat.S_ISDIR(est.st_mode) or (descend is not None and not descend(est)):
                    continue
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=top.fd)
                except OSError:
                    continue
                fst = os.fstat(fd)
                if (fst.st_dev, fst.st_ino) != (est.st_dev, est.st_ino):
                    os.close(fd)
                    continue
                stack.append(_Frame(fd, fst, _listdir(fd), path, name))
                if len(stack) - low > _MAX_OPEN_DIRS:
                    os.close(stack[low].fd)
                    stack[low].fd = -1
                    low += 1
                continue
            stack.pop()
            if not stack:
                os.close(top.fd)
                break
            parent = stack[-1]
            if parent.fd < 0:
                try:
                    pfd = os.open("..", _DIR_FLAGS, dir_fd=top.fd)
                except OSError:
                    pfd = -1
                if pfd >= 0:
                    pst = os.fstat(pfd)
                    if (pst.st_dev, pst.st_ino) != (parent.dev, parent.ino):
                        os.close(pfd)
                        pfd = -1
                if pfd < 0:
                    os.close(top.fd)
                    return        # moved under us: stop rather than guess where we are
                parent.fd = pfd
                low = len(stack) - 1
            os.close(top.fd)
            top.fd = -1
            yield "leave", parent.fd, top.name, _FrameStat(top), top.path
    finally:
        for frame in stack:
            if frame.fd >= 0:
                os.close(frame.fd)


class _FrameStat:
    """The bits of a directory's lstat a "leave" event carries."""

    __slots__ = ("st_dev", "st_ino", "st_uid", "st_mode")

    def __init__(self, frame: _Frame):
        self.st_dev, self.st_ino, self.st_uid, self.st_mode = frame.dev, frame.ino, frame.uid, stat.S_IFDIR


def tree_usage(path: str, max_entries: int) -> tuple[int, int, bool]:
    """(bytes, entries, truncated) below directory ``path``.

    bytes counts allocated blocks (st_blocks * 512, so sparse files count what they use;
    each hard-linked inode once); entries counts files, directories, symlinks and the rest
    below ``path`` (not ``path`` itself). Never follows symlinks, never enters other
    filesystems. Stops at ``max_entries``: truncated is True when the tree holds more.
    Raises OSError when ``path`` cannot be opened as a directory.
    """
    used, entries, truncated = 0, 0, False
    linked: set[tuple[int, int]] = set()
    walk = _walk(path)
    try:
        for event, _, _, st, _ in walk:
            if event != "entry":
                continue
            if entries >= max_entries:
                truncated = True
                break
            entries += 1
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in linked:
                    continue
                linked.add(key)
            used += st.st_blocks * 512
    finally:
        walk.close()
    return used, entries, truncated


def sweep_owned(directories: Sequence[str], uids: Container[int]) -> list[str]:
    """Removes every entry owned by one of ``uids`` anywhere below each of ``directories``.

    Files, symlinks (the link, never its target), sockets, fifos and devices owned by those
    uids are unlinked; directories they own are removed once emptied (one that still holds
    someone else's entries stays). Directories of other owners are searched only where those
    uids could have created entries: world-writable ones, and ones whose group is one of
    them (episode uids have no other groups), so a large shared /tmp costs little. Works
    through directory fds (unlinkat/rmdir with dir_fd), never follows a symlink, never
    crosses into another filesystem, skips what vanishes or cannot be removed, and never
    removes the given directories themselves. Returns the removed paths. Call it once the
    uids' processes are dead, or it races with them. A directory that cannot be opened
    is skipped.
    """
    removed: list[str] = []
    def reachable(st) -> bool:
        return bool(st.st_mode & stat.S_IWOTH) or st.st_uid in uids or st.st_gid in uids

    for top in directories:
        walk = _walk(top, reachable)
        try:
            for event, parent_fd, name, st, path in walk:
                if st.st_uid not in uids:
                    continue
                try:
                    if event == "leave":
                        os.rmdir(name, dir_fd=parent_fd)
                    elif not stat.S_ISDIR(st.st_mode):
                        os.unlink(name, dir_fd=parent_fd)
                    else:
                        continue
                except OSError:
                    continue
                removed.append(path)
        except OSError:
            pass          # the directory itself cannot be opened
        finally:
            walk.close()
    return removed
