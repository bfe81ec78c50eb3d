"""Probe: how much time the clocks an environment can read say passed between reset and step.

reset records time.time(), time.monotonic(), time.perf_counter(), datetime.now() and (through
ctypes) libc clock_gettime(CLOCK_MONOTONIC); step reports, for each source, the delta since
reset in seconds, and which sources raised. No breach convention: the test compares the
deltas with the real pause between the calls (a sandbox with a virtual clock shows none of it).
"""

import ctypes
import datetime
import json
import time

CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _clock_gettime():
    libc = ctypes.CDLL(None, use_errno=True)
    spec = _Timespec()
    if libc.clock_gettime(CLOCK_MONOTONIC, ctypes.byref(spec)) != 0:
        raise OSError(ctypes.get_errno(), "clock_gettime failed")
    return spec.tv_sec + spec.tv_nsec * 1e-9


SOURCES = {
    "time.time": time.time,
    "time.monotonic": time.monotonic,
    "time.perf_counter": time.perf_counter,
    "datetime.now": lambda: datetime.datetime.now().timestamp(),
    "clock_gettime": _clock_gettime,
}


def _read_all():
    values, raised = {}, {}
    for name, source in SOURCES.items():
        try:
            values[name] = float(source())
        except Exception as err:
            raised[name] = type(err).__name__
    return values, raised


class TimeSniffEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.start = {}
        self.raised = {}

    def reset(self, seed=None):
        self.start, self.raised = _read_all()
        return "Wait, then step.", {}

    def step(self, action):
        now, raised = _read_all()
        deltas = {name: now[name] - self.start[name] for name in SOURCES if name in now and name in self.start}
        report = {"deltas": deltas, "raised": {**self.raised, **raised}}
        return json.dumps(report), 0.0, True, False, {}
