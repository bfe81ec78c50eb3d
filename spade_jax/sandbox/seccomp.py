"""A seccomp-BPF filter for workers: refuse the syscalls an environment has no use for.

Namespaces and mounts (unshare, setns, clone with namespace flags, mount API, pivot_root,
chroot), cross-process access (ptrace, process_vm_*, pidfds, and signals to any process but
the caller itself: without PID namespaces a worker's ``kill(-1, SIGKILL)`` would otherwise
reach every process of its uid), and kernel attack surface that
unprivileged code can reach (keyrings, bpf, userfaultfd, perf events, io_uring, module
and kexec loading, handle-based opens). They fail with EPERM (clone3 with ENOSYS, so libc
falls back to clone, whose flags the filter can inspect); syscalls of a foreign
architecture (e.g. 32-bit int 0x80 on x86_64) kill the process. Everything else is allowed:
the filter narrows the kernel surface, the namespaces and rlimits do the confining.

x86_64 and aarch64 (numbers from the kernel's unistd headers); elsewhere ``install``
returns False and the isolation report says no filter is in force. Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_DENIED = {
    "x86_64": dict(unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161, ptrace=101,
                   process_vm_readv=310, process_vm_writev=311, keyctl=250, add_key=248, request_key=249,
                   bpf=321, userfaultfd=323, perf_event_open=298, io_uring_setup=425, io_uring_enter=426,
                   io_uring_register=427, kexec_load=246, kexec_file_load=320, open_by_handle_at=304,
                   name_to_handle_at=303, init_module=175, finit_module=313, delete_module=176, fsopen=430,
                   fsconfig=431, fsmount=432, fspick=433, open_tree=428, move_mount=429, mount_setattr=442,
                   swapon=167, swapoff=168, reboot=169, acct=163, quotactl=179),
    "aarch64": dict(unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51, ptrace=117,
                    process_vm_readv=270, process_vm_writev=271, keyctl=219, add_key=217, request_key=218,
                    bpf=280, userfaultfd=282, perf_event_open=241, io_uring_setup=425, io_uring_enter=426,
                    io_uring_register=427, kexec_load=104, kexec_file_load=294, open_by_handle_at=265,
                    name_to_handle_at=264, init_module=105, finit_module=273, delete_module=106, fsopen=430,
                    fsconfig=431, fsmount=432, fspick=433, open_tree=428, move_mount=429, mount_setattr=442,
                    swapon=224, swapoff=225, reboot=142, acct=89, quotactl=60),
}
_CLONE = {"x86_64": (56, 435), "aarch64": (220, 435)}
# Signal syscalls whose first argument is the target (thread group) id: only the caller itself.
_SIGNAL = {"x86_64": dict(kill=62, tkill=200, tgkill=234, rt_sigqueueinfo=129, rt_tgsigqueueinfo=297),
           "aarch64": dict(kill=129, tkill=130, tgkill=131, rt_sigqueueinfo=138, rt_tgsigqueueinfo=240)}
_PIDFD = dict(pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438)  # same on both
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000
_NAMESPACE_FLAGS = 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00020000

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def _arch() -> str:
    machine = platform.machine()
    return "aarch64" if machine == "arm64" else machine


def supported() -> bool:
    return _arch() in _DENIED


def filter_program(own_pid: int) -> list[tuple[int, int, int, int]]:
    """The BPF instructions (code, jt, jf, k) for this machine's architecture and a worker whose
    pid (as it sees itself) is ``own_pid``."""
    arch = _arch()
    clone, clone3 = _CLONE[arch]
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog = [(_LD_W_ABS, 0, 0, _OFFSET_ARCH), (_JEQ, 1, 0, _AUDIT_ARCH[arch]), (_RET, 0, 0, _RET_KILL_PROCESS),
            (_LD_W_ABS, 0, 0, _OFFSET_NR)]
    if arch == "x86_64":
        prog += [(_JGE, 0, 1, _X32_SYSCALL_BIT), (_RET, 0, 0, eperm)]
    for number in sorted([*_DENIED[arch].values(), *_PIDFD.values()]):
        prog += [(_JEQ, 0, 1, number), (_RET, 0, 0, eperm)]
    for number in sorted(_SIGNAL[arch].values()):  # allowed only when aimed at the caller itself
        prog += [(_JEQ, 0, 4, number), (_LD_W_ABS, 0, 0, _OFFSET_ARG0), (_JEQ, 0, 1, own_pid & 0xFFFFFFFF),
                 (_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, eperm)]
    prog += [(_JEQ, 0, 1, clone3), (_RET, 0, 0, enosys),
             (_JEQ, 0, 3, clone), (_LD_W_ABS, 0, 0, _OFFSET_ARG0), (_JSET, 0, 1, _NAMESPACE_FLAGS),
             (_RET, 0, 0, eperm),
             (_RET, 0, 0, _RET_ALLOW)]
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> bool:
    """Installs the filter on the calling process (no_new_privs must be set); False if unsupported."""
    if not supported():
        return False
    prog = filter_program(os.getpid())
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(prog), ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                  ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"installing the seccomp filter failed: {errno.errorcode.get(err, err)}")
    return True
