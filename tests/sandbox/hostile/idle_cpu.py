"""Attack: burn CPU between calls, while the host is not waiting on this episode.

reset arms SIGALRM twice (signal.alarm(1), then a 50 ms periodic setitimer, which replaces
it) with a handler that does about 0.2 s of CPU work per run, and a SIGCONT handler that
records whether it ran (a host that freezes idle workers may stop and continue them). step,
called after a pause, reports whether the timer handler ran between the calls and the user
CPU time spent since reset returned. The handler disarms itself after 40 runs. The test must
pause longer than 1 s between the calls, so that the outcome does not depend on timing
(the 50 ms timer fires well within it, and so does the 1 s alarm when it alone is armed).
What should stop it: idle workers get no CPU (frozen, stopped, or their timers refused by
the syscall filter), or every second they burn is charged to the episode.
"""

import errno
import json
import resource
import signal

MAX_RUNS = 40


def _alarm():
    # alarm() never reports an error: a refused call (seccomp EPERM) returns (unsigned) -1
    if signal.alarm(1) >= 0xFFFFFFFF:
        raise PermissionError(errno.EPERM, "alarm() returned -1")


def _how(err):
    if isinstance(err, OSError) and err.errno in (errno.EPERM, errno.EACCES):
        return "PermissionError"
    return type(err).__name__


def _utime():
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


class IdleCpuEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.iterations = int(kwargs.get("handler_iterations", 10_000_000))
        self.runs = 0
        self.conts = 0
        self.armed = {}
        self.utime0 = None

    def _burn(self, signum, frame):
        self.runs += 1
        total = 0
        for _ in range(self.iterations):
            total += 1
        if self.runs >= MAX_RUNS:
            self._disarm()

    def _cont(self, signum, frame):
        self.conts += 1

    def _disarm(self):
        for disarm in (lambda: signal.setitimer(signal.ITIMER_REAL, 0), lambda: signal.alarm(0)):
            try:
                disarm()
            except (OSError, ValueError):
                pass

    def reset(self, seed=None):
        armed = {}
        for name, action in (("handler", lambda: signal.signal(signal.SIGALRM, self._burn)),
                             ("sigcont_handler", lambda: signal.signal(signal.SIGCONT, self._cont)),
                             ("alarm", _alarm),
                             ("setitimer", lambda: signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05))):
            try:
                action()
                armed[name] = "installed" if name.endswith("handler") else "armed"
            except (OSError, ValueError) as err:
                armed[name] = _how(err)
        self.armed = armed
        self.runs = 0
        try:
            self.utime0 = _utime()
        except OSError:
            self.utime0 = None
        return json.dumps(armed), {}

    def step(self, action):
        try:
            utime = None if self.utime0 is None else _utime() - self.utime0
        except OSError:
            utime = None
        runs = self.runs
        self._disarm()
        if runs > 0:
            timer = f"BREACH: handler ran {runs} times between calls"
        elif all(how in ("armed", "installed") for how in self.armed.values()):
            timer = "armed but never ran"
        else:
            timer = "; ".join(f"{name}: {how}" for name, how in self.armed.items() if how not in ("armed", "installed"))
        report = {"timer": timer, "utime_between_calls": utime, "sigcont_runs": self.conts}
        return json.dumps(report), 0.0, True, False, {}
