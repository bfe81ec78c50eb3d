"""The worker seccomp-BPF filter: a short list of readable rules compiled to classic BPF.

A worker computes in Python and talks to its supervisor over read()/write() on inherited
fds; everything below fails with EPERM unless noted, by family:

* namespaces and mounts (unshare, setns, clone with a namespace flag, mount API, pivot_root,
  chroot, mount listing): a worker must not rebuild its own view of the system;
* other processes (ptrace, process_vm_*, kcmp, process_madvise/mrelease, pidfd_*; kill, tkill,
  tgkill, rt_(tg)sigqueueinfo only at its own pid; prlimit64, sched_set*, migrate_pages,
  move_pages, get_robust_list only at pid 0 or its own; setpriority and ioprio_set only for a
  single process, itself; fcntl F_SETOWN/F_SETOWN_EX/F_SETSIG/F_SETLEASE/F_NOTIFY and ioctl
  FIOSETOWN/SIOCSPGRP): without PID namespaces ``kill(-1, SIGKILL)`` would reach every process
  of the uid, and SIGIO/lease/dnotify signals are signals sent on the worker's behalf;
* program execution (execve, execveat, uselib): a worker never needs another program;
* sockets (every socket call, socketpair included): no networking, no netlink, no vsock, no
  abstract unix sockets shared across episodes (the inherited channel uses read()/write());
* memory outside RLIMIT_AS (memfd_create, memfd_secret, fcntl F_SETPIPE_SZ): written pages
  that no address-space limit counts;
* SysV and POSIX IPC (shm*, sem*, msg*, mq_*): kernel objects that outlive the worker and are
  shared by everyone in the IPC namespace;
* timers that wake a worker between calls (alarm, setitimer, timer_create/settime,
  timerfd_create/settime): an environment must run only while the host waits on it;
* asynchronous I/O (io_uring_*, io_setup & co.): large kernel surface and a global limit
  (fs.aio-max-nr) one worker could exhaust for all;
* file watches (inotify_*, fanotify_*): per-user instance limits shared across episodes;
* kernel attack surface and introspection (keyctl, add_key, request_key, bpf, userfaultfd,
  perf_event_open, personality, syslog, vhangup, lookup_dcookie, modify_ldt, iopl, ioperm,
  name_to_handle_at, open_by_handle_at);
* system administration (kexec, modules, swap, reboot, acct, quotactl, host/domain name,
  clock setting): privileged anyway, refused before the kernel looks;
* clone3 fails with ENOSYS instead, so libc falls back to clone, whose flags the filter can read.

Syscalls of a foreign architecture (e.g. 32-bit ``int 0x80`` on x86_64) kill the process;
x32 syscalls on x86_64 get EPERM. Everything else is allowed: filesystem reach is left to the
mount namespace and Landlock (``landlock.py``), memory/CPU/processes/files to rlimits, and
signals at the worker's own children to the PID namespace (the pid rules compare with the
installing process's own pid, so a forked child may signal its parent but not itself).

Pid arguments are compared on their low 32 bits (pid_t is an int; a worker in its own PID
namespace is pid 1 as it sees itself). x86_64 and aarch64, numbers from the kernel's unistd
headers (aarch64 has no legacy calls such as alarm or inotify_init; they are just absent
there); elsewhere ``install`` returns False. Standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from typing import NamedTuple

# --- syscall numbers (only those the rules name) -----------------------------------------------

_COMMON = dict(  # the numbering shared by every architecture since 5.1
    pidfd_send_signal=424, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, open_tree=428,
    move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, pidfd_open=434, clone3=435,
    pidfd_getfd=438, process_madvise=440, mount_setattr=442, quotactl_fd=443, memfd_secret=447,
    process_mrelease=448, statmount=457, listmount=458, open_tree_attr=467, listns=470)

SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": dict(
        _COMMON,
        # namespaces and mounts
        unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161,
        # other processes
        ptrace=101, process_vm_readv=310, process_vm_writev=311, kcmp=312, kill=62, tkill=200, tgkill=234,
        rt_sigqueueinfo=129, rt_tgsigqueueinfo=297, prlimit64=302, setpriority=141, sched_setaffinity=203,
        sched_setscheduler=144, sched_setparam=142, sched_setattr=314, ioprio_set=251, migrate_pages=256,
        move_pages=279, get_robust_list=274, fcntl=72, ioctl=16, clone=56,
        # program execution
        execve=59, execveat=322, uselib=134,
        # sockets
        socket=41, socketpair=53, connect=42, accept=43, accept4=288, bind=49, listen=50, sendto=44,
        recvfrom=45, sendmsg=46, recvmsg=47, sendmmsg=307, recvmmsg=299, shutdown=48, getsockname=51,
        getpeername=52, setsockopt=54, getsockopt=55,
        # memory outside RLIMIT_AS
        memfd_create=319,
        # SysV and POSIX IPC
        shmget=29, shmat=30, shmdt=67, shmctl=31, semget=64, semop=65, semtimedop=220, semctl=66,
        msgget=68, msgsnd=69, msgrcv=70, msgctl=71, mq_open=240, mq_unlink=241, mq_timedsend=242,
        mq_timedreceive=243, mq_notify=244, mq_getsetattr=245,
        # timers
        alarm=37, setitimer=38, timer_create=222, timer_settime=223, timerfd_create=283, timerfd_settime=286,
        # asynchronous I/O
        io_setup=206, io_destroy=207, io_getevents=208, io_submit=209, io_cancel=210, io_pgetevents=333,
        # file watches
        inotify_init=253, inotify_init1=294, inotify_add_watch=254, inotify_rm_watch=255,
        fanotify_init=300, fanotify_mark=301,
        # kernel surface
        keyctl=250, add_key=248, request_key=249, bpf=321, userfaultfd=323, perf_event_open=298,
        personality=135, syslog=103, vhangup=153, lookup_dcookie=212, modify_ldt=154, iopl=172, ioperm=173,
        name_to_handle_at=303, open_by_handle_at=304,
        # system administration
        kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313, delete_module=176,
        swapon=167, swapoff=168, reboot=169, acct=163, quotactl=179, sethostname=170, setdomainname=171,
        settimeofday=164, clock_settime=227, clock_adjtime=305, adjtimex=159),
    "aarch64": dict(
        _COMMON,
        unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51,
        ptrace=117, process_vm_readv=270, process_vm_writev=271, kcmp=272, kill=129, tkill=130, tgkill=131,
        rt_sigqueueinfo=138, rt_tgsigqueueinfo=240, prlimit64=261, setpriority=140, sched_setaffinity=122,
        sched_setscheduler=119, sched_setparam=118, sched_setattr=274, ioprio_set=30, migrate_pages=238,
        move_pages=239, get_robust_list=100, fcntl=25, ioctl=29, clone=220,
        execve=221, execveat=281,
        socket=198, socketpair=199, connect=203, accept=202, accept4=242, bind=200, listen=201, sendto=206,
        recvfrom=207, sendmsg=211, recvmsg=212, sendmmsg=269, recvmmsg=243, shutdown=210, getsockname=204,
        getpeername=205, setsockopt=208, getsockopt=209,
        memfd_create=279,
        shmget=194, shmat=196, shmdt=197, shmctl=195, semget=190, semop=193, semtimedop=192, semctl=191,
        msgget=186, msgsnd=189, msgrcv=188, msgctl=187, mq_open=180, mq_unlink=181, mq_timedsend=182,
        mq_timedreceive=183, mq_notify=184, mq_getsetattr=185,
        setitimer=103, timer_create=107, timer_settime=110, timerfd_create=85, timerfd_settime=86,
        io_setup=0, io_destroy=1, io_submit=2, io_cancel=3, io_getevents=4, io_pgetevents=292,
        inotify_init1=26, inotify_add_watch=27, inotify_rm_watch=28, fanotify_init=262, fanotify_mark=263,
        keyctl=219, add_key=217, request_key=218, bpf=280, userfaultfd=282, perf_event_open=241,
        personality=92, syslog=116, vhangup=58, lookup_dcookie=18,
        name_to_handle_at=264, open_by_handle_at=265,
        kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273, delete_module=106,
        swapon=224, swapoff=225, reboot=142, acct=89, quotactl=60, sethostname=161, setdomainname=162,
        settimeofday=170, clock_settime=112, clock_adjtime=266, adjtimex=171),
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

# --- the denial set, by family ----------------------------------------------------------------

NAMESPACES_AND_MOUNTS = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig",
                         "fsmount", "fspick", "open_tree", "open_tree_attr", "move_mount", "mount_setattr",
                         "statmount", "listmount", "listns")
OTHER_PROCESSES = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "process_madvise",
                   "process_mrelease", "pidfd_open", "pidfd_getfd", "pidfd_send_signal")
PROGRAM_EXECUTION = ("execve", "execveat", "uselib")
SOCKETS = ("socket", "socketpair", "connect", "accept", "accept4", "bind", "listen", "sendto", "recvfrom",
           "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "getsockname", "getpeername",
           "setsockopt", "getsockopt")
UNCOUNTED_MEMORY = ("memfd_create", "memfd_secret")
IPC = ("shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl", "msgget", "msgsnd",
       "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
       "mq_getsetattr")
TIMERS = ("alarm", "setitimer", "timer_create", "timer_settime", "timerfd_create", "timerfd_settime")
ASYNC_IO = ("io_uring_setup", "io_uring_enter", "io_uring_register", "io_setup", "io_destroy", "io_submit",
            "io_cancel", "io_getevents", "io_pgetevents")
FILE_WATCHES = ("inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_init",
                "fanotify_mark")
KERNEL_SURFACE = ("keyctl", "add_key", "request_key", "bpf", "userfaultfd", "perf_event_open", "personality",
                  "syslog", "vhangup", "lookup_dcookie", "modify_ldt", "iopl", "ioperm", "name_to_handle_at",
                  "open_by_handle_at")
ADMINISTRATION = ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "swapon",
                  "swapoff", "reboot", "acct", "quotactl", "quotactl_fd", "sethostname", "setdomainname",
                  "settimeofday", "clock_settime", "clock_adjtime", "adjtimex")
DENIED = (NAMESPACES_AND_MOUNTS + OTHER_PROCESSES + PROGRAM_EXECUTION + SOCKETS + UNCOUNTED_MEMORY + IPC
          + TIMERS + ASYNC_IO + FILE_WATCHES + KERNEL_SURFACE + ADMINISTRATION)

SIGNAL_SELF_ONLY = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # arg0 == own pid
PID_SELF_OR_ZERO = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
                    "migrate_pages", "move_pages", "get_robust_list")  # arg0 in (0, own pid)
CLONE_NAMESPACE_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                         | 0x40000000)  # NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET
F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE, F_NOTIFY, F_SETPIPE_SZ = 8, 10, 15, 1024, 1026, 1031
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1

# --- rules ---------------------------------------------------------------------------------------

RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


class Rule(NamedTuple):
    """``action`` for ``syscall``: always (``arg`` None), or when argument ``arg`` (its low 32 bits)
    equals one of ``equals`` or has any of ``any_bits`` set; with ``unless`` when it does not."""
    syscall: str
    action: int
    arg: int | None = None
    equals: tuple[int, ...] = ()
    any_bits: int = 0
    unless: bool = False


def deny(name: str, err: int = errno.EPERM) -> Rule:
    return Rule(name, RET_ERRNO | err)


def deny_if(name: str, arg: int, equals=(), any_bits: int = 0, err: int = errno.EPERM) -> Rule:
    return Rule(name, RET_ERRNO | err, arg, tuple(equals), any_bits)


def deny_unless(name: str, arg: int, equals, err: int = errno.EPERM) -> Rule:
    return Rule(name, RET_ERRNO | err, arg, tuple(equals), unless=True)


def worker_rules(own_pid: int) -> list[Rule]:
    """The worker policy. Rules naming the same syscall all apply (the first that fires wins)."""
    me = own_pid & 0xFFFFFFFF
    rules = [
        deny_if("fcntl", 1, equals=(F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE, F_NOTIFY, F_SETPIPE_SZ)),
        deny_if("ioctl", 1, equals=(FIOSETOWN, SIOCSPGRP)),
        deny_if("clone", 0, any_bits=CLONE_NAMESPACE_FLAGS),
        deny("clone3", errno.ENOSYS),
        *(deny_unless(name, 0, (me,)) for name in SIGNAL_SELF_ONLY),
        *(deny_unless(name, 0, (0, me)) for name in PID_SELF_OR_ZERO),
        deny_unless("setpriority", 0, (PRIO_PROCESS,)), deny_unless("setpriority", 1, (0, me)),
        deny_unless("ioprio_set", 0, (IOPRIO_WHO_PROCESS,)), deny_unless("ioprio_set", 1, (0, me)),
    ]
    return rules + [deny(name) for name in DENIED]


# --- compiling to classic BPF ---------------------------------------------------------------------

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARGS = 0, 4, 16
_MAX_INSTRUCTIONS = 4096


def _arch() -> str:
    machine = platform.machine()
    return "aarch64" if machine == "arm64" else machine


def supported() -> bool:
    return _arch() in SYSCALLS


def _conditional(rule: Rule) -> list[tuple[int, int, int, int]]:
    """Loads the argument, tests it and returns ``rule.action`` when the rule fires; falls through
    (to the next rule of the same syscall) otherwise."""
    tests = [(_JEQ, value & 0xFFFFFFFF) for value in rule.equals]
    if rule.any_bits:
        tests.append((_JSET, rule.any_bits & 0xFFFFFFFF))
    if not tests or not 0 <= rule.arg <= 5:
        raise ValueError(f"rule for {rule.syscall}: argument {rule.arg} (0-5) must be tested against something")
    n = len(tests)
    block = [(_LD_W_ABS, 0, 0, _OFFSET_ARGS + 8 * rule.arg)]  # low word: both arches are little-endian
    for p, (code, k) in enumerate(tests, start=1):  # the action sits at n + 1, fall-through at n + 2
        if rule.unless:  # a match skips the action
            block.append((code, n + 1 - p, 0, k))
        elif p < n:  # a match jumps to the action
            block.append((code, n - p, 0, k))
        else:
            block.append((code, 0, 1, k))
    return block + [(_RET, 0, 0, rule.action)]


def compile_rules(rules: list[Rule], arch: str) -> list[tuple[int, int, int, int]]:
    """BPF (code, jt, jf, k) for ``rules`` on ``arch``; rules naming syscalls ``arch`` lacks are dropped.

    Syscalls with argument rules come first (they are the only ones the kernel cannot cache), then
    the unconditional ones, then allow."""
    numbers = SYSCALLS[arch]
    grouped: dict[str, list[Rule]] = {}
    for rule in rules:
        if rule.syscall in numbers:
            grouped.setdefault(rule.syscall, []).append(rule)
    prog = [(_LD_W_ABS, 0, 0, _OFFSET_ARCH), (_JEQ, 1, 0, _AUDIT_ARCH[arch]), (_RET, 0, 0, RET_KILL_PROCESS),
            (_LD_W_ABS, 0, 0, _OFFSET_NR)]
    if arch == "x86_64":
        prog += [(_JGE, 0, 1, _X32_SYSCALL_BIT), (_RET, 0, 0, RET_ERRNO | errno.EPERM)]
    ordered = sorted(grouped.items(), key=lambda item: item[1][0].arg is None)
    for name, group in ordered:
        if group[0].arg is None:
            if len(group) > 1:
                raise ValueError(f"{name}: an unconditional rule must be the only rule for its syscall")
            body = [(_RET, 0, 0, group[0].action)]
        else:
            if any(rule.arg is None for rule in group):
                raise ValueError(f"{name}: an unconditional rule must be the only rule for its syscall")
            body = [ins for rule in group for ins in _conditional(rule)] + [(_RET, 0, 0, RET_ALLOW)]
        if len(body) > 255:
            raise ValueError(f"{name}: too many argument tests for one BPF jump")
        prog += [(_JEQ, 0, len(body), numbers[name]), *body]
    prog.append((_RET, 0, 0, RET_ALLOW))
    if len(prog) > _MAX_INSTRUCTIONS:
        raise ValueError(f"seccomp program of {len(prog)} instructions exceeds {_MAX_INSTRUCTIONS}")
    return prog


def filter_program(own_pid: int, arch: str | None = None) -> list[tuple[int, int, int, int]]:
    """The worker filter's BPF instructions (code, jt, jf, k) for ``arch`` (default: this machine's)
    and a worker whose pid, as it sees itself, is ``own_pid``."""
    return compile_rules(worker_rules(own_pid), arch or _arch())


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def install() -> bool:
    """Installs the worker filter on the calling process (no_new_privs must already be set).

    False where the architecture is unsupported; OSError when the kernel refuses the filter."""
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
