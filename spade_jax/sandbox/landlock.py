"""Landlock for workers, through the raw syscalls (landlock_create_ruleset 444, landlock_add_rule 445,
landlock_restrict_self 446 on x86_64 and aarch64 alike).

Landlock lets an unprivileged process that has set no_new_privs drop access for itself and all
its future children; what a ruleset "handles" is denied unless a rule allows it. What each ABI
version adds (``abi_version`` says which this kernel speaks):

* 1 (5.13): filesystem rights: execute, read/write files, read directories, remove and make
  files, directories, devices, fifos, sockets and symlinks;
* 2 (5.19): REFER, linking or renaming across directories (denied unless handled and allowed);
* 3 (6.2): TRUNCATE (truncate(2), ftruncate(2), open with O_TRUNC);
* 4 (6.7): TCP: bind and connect by port;
* 5 (6.10): IOCTL_DEV, ioctl on character and block devices;
* 6 (6.12): scopes: no connecting to abstract unix sockets, and no signals to processes,
  outside the caller's own Landlock domain;
* 7 (6.15): audit logging controls (workers turn logging of their own denials off, so a hostile
  program cannot flood the audit log).

What the worker gets from ``restrict``: every filesystem right this ABI knows is handled; read
and execute beneath the read paths (interpreter, stdlib, numpy, shared libraries), read/write/
create/remove/rename/truncate beneath the write paths (its scratch directory; no devices,
sockets or execute there), read/write on the named device files (/dev/null, /dev/urandom);
all TCP bind and connect denied (ABI >= 4); abstract unix sockets and signals confined to the
worker's own domain (ABI >= 6). Landlock does not cover stat/chmod/chown/xattrs or fds opened
before ``restrict`` (the channel, stdout pipe), and applies to the calling thread and its later
children only: call it single-threaded. Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import struct

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
RESTRICT_SELF_LOG_SAME_EXEC_OFF = 1 << 0  # ABI 7

ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5
ACCESS_NET_BIND_TCP = 1 << 0  # ABI 4
ACCESS_NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

# Every filesystem right of ABI 1 (bits 0 to 12).
ABI1_FS_RIGHTS = (ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR
                  | ACCESS_FS_REMOVE_DIR | ACCESS_FS_REMOVE_FILE | ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_DIR
                  | ACCESS_FS_MAKE_REG | ACCESS_FS_MAKE_SOCK | ACCESS_FS_MAKE_FIFO | ACCESS_FS_MAKE_BLOCK
                  | ACCESS_FS_MAKE_SYM)
# The only rights a rule on a non-directory may carry.
FILE_RIGHTS = (ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE | ACCESS_FS_TRUNCATE
               | ACCESS_FS_IOCTL_DEV)
READ_RIGHTS = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR
WRITE_RIGHTS = (ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR | ACCESS_FS_WRITE_FILE | ACCESS_FS_REMOVE_DIR
                | ACCESS_FS_REMOVE_FILE | ACCESS_FS_MAKE_DIR | ACCESS_FS_MAKE_REG | ACCESS_FS_MAKE_FIFO
                | ACCESS_FS_MAKE_SYM | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE)
DEVICE_RIGHTS = ACCESS_FS_READ_FILE | ACCESS_FS_WRITE_FILE | ACCESS_FS_TRUNCATE

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_PR_SET_NO_NEW_PRIVS = 38


def _fail(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def abi_version() -> int:
    """The Landlock ABI this kernel speaks; 0 when it has no Landlock (or it is disabled or
    filtered away)."""
    version = _syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(CREATE_RULESET_VERSION))
    if version >= 0:
        return int(version)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return 0
    raise OSError(err, f"landlock_create_ruleset(VERSION): {os.strerror(err)}")


def handled_fs_rights(abi: int) -> int:
    """Every filesystem right ABI ``abi`` knows."""
    if abi < 1:
        return 0
    rights = ABI1_FS_RIGHTS
    if abi >= 2:
        rights |= ACCESS_FS_REFER
    if abi >= 3:
        rights |= ACCESS_FS_TRUNCATE
    if abi >= 5:
        rights |= ACCESS_FS_IOCTL_DEV
    return rights


def _ruleset_attr(abi: int) -> bytes:
    """struct landlock_ruleset_attr {u64 handled_access_fs, handled_access_net, scoped}, cut to the
    size the ABI knows."""
    net = ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    return struct.pack("=QQQ", handled_fs_rights(abi), net, scoped)[:size]


def _paths(paths, what: str) -> list:
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(f"{what} must be a collection of paths, not a single path")
    return list(paths)


def restrict(read_paths, write_paths, device_files=()) -> dict:
    """Confines the calling process (no_new_privs already set) and its future children.

    Returns what is in force: ``{"abi", "filesystem", "tcp", "scopes", "skipped"}`` (paths that
    could not be opened and got no rule); all False with abi 0 where Landlock is unsupported.
    Raises OSError when the ruleset cannot be created, a rule added, or the ruleset enforced.
    """
    groups = [(_paths(read_paths, "read_paths"), READ_RIGHTS), (_paths(write_paths, "write_paths"), WRITE_RIGHTS),
              (_paths(device_files, "device_files"), DEVICE_RIGHTS)]
    abi = abi_version()
    result = {"abi": abi, "filesystem": False, "tcp": False, "scopes": False, "skipped": []}
    if abi == 0:
        return result
    handled = handled_fs_rights(abi)
    attr = _ruleset_attr(abi)
    attr_buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _syscall(ctypes.c_long(_SYS_CREATE_RULESET), attr_buffer, ctypes.c_size_t(len(attr)),
                       ctypes.c_uint32(0))
    if ruleset < 0:
        raise _fail("landlock_create_ruleset")
    try:
        for paths, rights in groups:
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    result["skipped"].append(os.fsdecode(os.fspath(path)))
                    continue
                try:
                    allowed = rights & handled
                    if not stat.S_ISDIR(os.fstat(fd).st_mode):
                        allowed &= FILE_RIGHTS
                    if allowed:
                        rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
                        if _syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset),
                                    ctypes.c_int(RULE_PATH_BENEATH), rule, ctypes.c_uint32(0)) != 0:
                            raise _fail(f"landlock_add_rule {os.fsdecode(os.fspath(path))}")
                finally:
                    os.close(fd)
        flags = RESTRICT_SELF_LOG_SAME_EXEC_OFF if abi >= 7 else 0
        if _syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(flags)) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)
    result.update(filesystem=True, tcp=abi >= 4, scopes=abi >= 6)
    return result


def probe() -> dict:
    """What Landlock grants here, tried in a throwaway forked child (this process stays unrestricted).

    The child restricts itself to ``/dev/null`` (a path every uid can open, unlike the stdlib
    of an interpreter under a private home) and checks that ``/`` is then refused. Returns
    ``{"abi", "filesystem", "tcp", "scopes", "error"}``; ``error`` is None when Landlock is
    absent (abi 0) or worked, else why it failed.
    """
    abi = abi_version()
    report = {"abi": abi, "filesystem": False, "tcp": False, "scopes": False, "error": None}
    if abi == 0:
        return report
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            if _libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                           ctypes.c_ulong(0)) != 0:
                raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
            granted = restrict([], [], [os.devnull])
            os.close(os.open(os.devnull, os.O_RDONLY))
            try:
                os.close(os.open("/", os.O_RDONLY | os.O_DIRECTORY))
            except PermissionError:
                pass
            else:
                raise RuntimeError("landlock_restrict_self succeeded but / stayed readable")
            message = {key: granted[key] for key in ("filesystem", "tcp", "scopes")}
            code = 0
        except BaseException as err:  # noqa: BLE001 - everything goes back to the parent
            message = {"error": f"{type(err).__name__}: {err}"[:500]}
        finally:
            try:
                os.write(write_fd, json.dumps(message).encode())
            finally:
                os._exit(code)
    os.close(write_fd)
    raw = b""
    while chunk := os.read(read_fd, 4096):
        raw += chunk
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    try:
        message = json.loads(raw)
    except ValueError:
        message = {"error": f"probe child exited with status {status} and no report"}
    if "error" in message:
        report["error"] = message["error"]
    else:
        report.update(message)
    return report
