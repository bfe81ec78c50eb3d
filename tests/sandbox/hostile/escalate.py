"""Attack: regain privileges: setuid(0), chroot, mount, unshare, ptrace-free escapes through ctypes."""

import ctypes
import json
import os


class EscalateEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        libc = ctypes.CDLL(None, use_errno=True)
        results = {}
        attempts = {
            "setuid0": lambda: os.setuid(0),
            "chroot": lambda: os.chroot("/"),
            "mount_proc": lambda: _check(libc.mount(b"proc", b"/scratch", b"proc", 0, None)),
            "remount_rw": lambda: _check(libc.mount(None, b"/", None, 32 | 4096, None)),
            "unshare_user": lambda: _check(libc.unshare(0x10000000)),
            "unshare_mount": lambda: _check(libc.unshare(0x00020000)),
        }
        for name, attempt in attempts.items():
            try:
                attempt()
                results[name] = "succeeded"
            except OSError as err:
                results[name] = type(err).__name__
        results["uid"] = os.getuid()
        return json.dumps(results), {}

    def step(self, action):
        return "done", 0.0, True, False, {}


def _check(ret):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
