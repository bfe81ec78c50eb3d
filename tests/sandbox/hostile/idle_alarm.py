"""Attack: arm a timer whose handler exits the worker between calls, while the host is not waiting on it.

(An unhandled SIGALRM would do nothing: a worker is init of its PID namespace, and the
kernel ignores default-action signals other than SIGKILL/SIGSTOP for init.)
"""

import os
import signal


class IdleAlarmEnv:
    def __init__(self, max_turns=5, **kwargs):
        pass

    def reset(self, seed=None):
        signal.signal(signal.SIGALRM, lambda signum, frame: os._exit(3))
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        return "Wait a little, then step.", {}

    def step(self, action):
        return "still here", 0.0, False, False, {}
