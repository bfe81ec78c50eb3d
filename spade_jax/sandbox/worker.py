"""The worker side: one forked, jailed process that holds one live environment for one episode.

The zygote forks it; its first frame on the protocol channel (fd 3) is the host's ``load``
request carrying its own program, seed, max_turns and constructor kwargs (nothing about
other episodes ever reaches it). It runs the program's module code, finds the single
``*Env`` class, instantiates it, resets it, and then answers ``step``/``solution``
requests with raw values (``protocol.raw_value``). Nothing here is trusted by the host:
the environment code runs in this same process and may tamper with any of it; the host
checks every reply. Standard library only (plus whatever the environment imports).

Clocks: ``time`` and ``datetime`` read a virtual clock here (``install_virtual_clock``), so
an environment cannot tell a pause between calls from no pause through them. This is a
guard rail, not a boundary: CPython itself reads the vDSO clock (every lock acquire does),
so the wall clock cannot be taken away from the process; admission's paused replay
(``admission.py``) is what catches programs that behave differently after a pause.
"""

from __future__ import annotations

import builtins
import datetime
import linecache
import sys
import time
import traceback
import types

from spade_jax.envs.contract import SUCCESS_REWARD, extract_boxed
from spade_jax.envs.tool_use import ToolUseEnv
from spade_jax.sandbox.policy import DENIED_SUBMODULES, FORBIDDEN_NAMES, import_refusal
from spade_jax.sandbox.protocol import encode_frame, raw_value, read_frame, write_all

CHANNEL_FD = 3
MODULE_NAME = "env_program"
FILENAME = "<env>"
_TRACE_FRAMES = 6
VIRTUAL_EPOCH = 1735689600  # 2025-01-01T00:00:00Z: what "now" is inside an environment
_TICK_NS = 1_000_000  # each clock reading advances the virtual clock by 1 ms


def guarded_builtins() -> dict:
    """A builtins namespace whose ``__import__`` applies the import policy and without file/console access."""
    namespace = dict(builtins.__dict__)
    real_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level:
            raise ImportError("relative imports are not allowed in environment programs")
        reason = import_refusal(name)
        for item in fromlist or ():
            if reason is None and f"{name}.{item}" in DENIED_SUBMODULES:
                reason = import_refusal(f"{name}.{item}")
        if reason:
            raise ImportError(reason)
        return real_import(name, globals, locals, fromlist, level)

    for name in FORBIDDEN_NAMES:
        namespace.pop(name, None)
    namespace["__import__"] = guarded_import
    return namespace


def describe_error(err: BaseException) -> str:
    """``Type: message`` plus the environment's own frames (with source lines) of the traceback."""
    try:
        head = f"{type(err).__name__}: {err}"
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == FILENAME]
        lines = [f"  line {f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in frames[-_TRACE_FRAMES:]]
        return "\n".join([head[:2000], *lines])
    except BaseException:  # formatting itself failed (e.g. MemoryError, a hostile __str__)
        return type(err).__name__


def install_virtual_clock() -> None:
    """Makes ``time``'s clocks and ``datetime``'s now/today read a virtual clock.

    It starts at VIRTUAL_EPOCH and advances 1 ms per reading, so readings depend only on
    what the episode itself does, never on how long the host waited between calls.
    """
    ticks = [0]

    def now_ns(*_clock) -> int:
        ticks[0] += 1
        return ticks[0] * _TICK_NS

    def wall_ns(*_clock) -> int:
        return VIRTUAL_EPOCH * 1_000_000_000 + now_ns()

    def seconds(read):
        return lambda *clock: read(*clock) / 1e9

    real_localtime, real_gmtime, real_strftime = time.localtime, time.gmtime, time.strftime

    def when(secs):
        return wall_ns() / 1e9 if secs is None else secs

    for name, fn in (("time_ns", wall_ns), ("time", seconds(wall_ns)), ("clock_gettime_ns", now_ns),
                     ("clock_gettime", seconds(now_ns))):
        setattr(time, name, fn)
    for name in ("monotonic", "perf_counter", "process_time", "thread_time"):
        setattr(time, f"{name}_ns", now_ns)
        setattr(time, name, seconds(now_ns))
    time.localtime = lambda secs=None: real_localtime(when(secs))
    time.gmtime = lambda secs=None: real_gmtime(when(secs))
    time.ctime = lambda secs=None: time.asctime(real_localtime(when(secs)))
    time.strftime = lambda fmt, t=None: real_strftime(fmt, real_localtime(when(None)) if t is None else t)

    class VirtualDate(datetime.date):
        @classmethod
        def today(cls):
            return cls.fromtimestamp(time.time())

    class VirtualDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls.fromtimestamp(time.time(), tz)

        @classmethod
        def utcnow(cls):
            return cls.now(datetime.timezone.utc).replace(tzinfo=None)

        @classmethod
        def today(cls):
            return cls.now()

    VirtualDate.__name__ = VirtualDate.__qualname__ = "date"
    VirtualDatetime.__name__ = VirtualDatetime.__qualname__ = "datetime"
    VirtualDate.__module__ = VirtualDatetime.__module__ = "datetime"
    datetime.date, datetime.datetime = VirtualDate, VirtualDatetime


def load_env(program: str, max_turns: int | None, env_kwargs: dict, restrict_imports: bool):
    """Runs the module code and instantiates its single ``*Env`` class."""
    module = types.ModuleType(MODULE_NAME)
    module.__dict__.update(ToolUseEnv=ToolUseEnv, extract_boxed=extract_boxed, SUCCESS_REWARD=SUCCESS_REWARD,
                           __builtins__=guarded_builtins() if restrict_imports else builtins.__dict__,
                           __file__=FILENAME)
    sys.modules[MODULE_NAME] = module
    linecache.cache[FILENAME] = (len(program), None, program.splitlines(True), FILENAME)
    exec(compile(program, FILENAME, "exec"), module.__dict__)
    classes = []
    for value in list(module.__dict__.values()):
        if (isinstance(value, type) and value.__name__.endswith("Env")
                and value.__module__ == MODULE_NAME and value not in classes):
            classes.append(value)
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise LookupError(f"the program must define exactly one class whose name ends in 'Env' (found: {found})")
    cls = classes[0]
    env = cls(**env_kwargs) if max_turns is None else cls(max_turns=max_turns, **env_kwargs)
    tools = []
    if isinstance(env, ToolUseEnv):
        for tool in getattr(env, "tools", None) or ():
            fn = tool.get("function", tool) if isinstance(tool, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                tools.append(fn["name"])
    own_turns = getattr(env, "max_turns", None)
    meta = {"class": cls.__name__, "tool_use": isinstance(env, ToolUseEnv), "tools": tools,
            "has_solution": callable(getattr(env, "solution", None)),
            "max_turns": own_turns if type(own_turns) is int else None}
    return env, meta


def _rough_size(value, limit: int) -> int:
    """A cheap lower bound on the JSON size of a raw value, stopping once past ``limit``."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2
            for key, inner in item.items():
                total += len(key) + 4
                stack.append(inner)
        elif isinstance(item, list):
            total += 2 + len(item)
            stack.extend(item)
        else:
            total += 8
    return total


def _reply(ok: bool, payload, max_bytes: int) -> None:
    if _rough_size(payload, max_bytes) > max_bytes:
        ok, payload = False, f"reply exceeds the limit of {max_bytes} bytes"
    message = {"ok": True, "value": payload} if ok else {"ok": False, "error": payload}
    frame = encode_frame(message)
    if len(frame) > max_bytes:
        frame = encode_frame({"ok": False, "error": f"reply of {len(frame)} bytes exceeds the limit of {max_bytes}"})
    write_all(CHANNEL_FD, frame)


def _call(fn, *args, max_bytes: int) -> None:
    """Runs one env call and replies; output is flushed first, so it belongs to this call
    (the host stops the worker as soon as the reply arrives)."""
    try:
        value = raw_value(fn(*args))
    except BaseException as err:  # SystemExit, KeyboardInterrupt etc. cost the env only this call
        _flush_output()
        _reply(False, describe_error(err), max_bytes)
        return
    _flush_output()
    try:
        _reply(True, value, max_bytes)
    except (TypeError, ValueError, RecursionError, OverflowError) as err:
        _reply(False, f"reply is not encodable: {type(err).__name__}: {err}", max_bytes)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def serve(restrict_imports: bool, max_bytes: int) -> None:
    """Reads this episode's load request, loads and resets the env, then answers requests
    until the host closes the channel."""
    request = read_frame(CHANNEL_FD, max_bytes)
    if not isinstance(request, dict) or request.get("op") != "load":
        raise ValueError("the first request must be 'load'")
    seed = request["seed"]
    try:
        env, meta = load_env(request["program"], request["max_turns"], request["env_kwargs"], restrict_imports)
    except BaseException as err:
        _flush_output()
        _reply(False, describe_error(err), max_bytes)
        return
    del request
    _flush_output()
    _reply(True, meta, max_bytes)
    _call(env.reset, seed, max_bytes=max_bytes)
    while True:
        try:
            request = read_frame(CHANNEL_FD, max_bytes)
        except EOFError:
            return
        op = request.get("op") if isinstance(request, dict) else None
        if op == "step":
            _call(env.step, request.get("action", ""), max_bytes=max_bytes)
        elif op == "solution":
            _call(env.solution, max_bytes=max_bytes)
        else:
            _reply(False, f"unknown request {op!r}", max_bytes)
