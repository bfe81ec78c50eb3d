"""Pure parts of the sandbox: framing, raw encoding, trusted-side checks, policy, similarity, seccomp, records."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from spade_jax.admission.similarity import code_similarity, fingerprint, normalized_tokens
from spade_jax.envs import library
from spade_jax.sandbox import seccomp, validate, worker
from spade_jax.sandbox.policy import PolicyError, check_program, extract_code, import_refusal
from spade_jax.sandbox.protocol import (OPAQUE_KEY, TUPLE_KEY, FrameBuffer, ProtocolError, decode_payload,
                                        encode_frame, raw_value)
from spade_jax.sandbox.records import PROTECTIONS, EpisodeSpec, IsolationReport, SandboxConfig
from spade_jax.sandbox.validate import (ContractViolation, EnvFailure, check_info, check_reset, check_solution,
                                        check_step, clip_reward, unwrap)

EXAMPLE = (Path(__file__).parents[1] / "sandbox_examples" / "boxed_game.py").read_text()


# --- framing ---------------------------------------------------------------------------------

def test_frames_survive_arbitrary_chunking():
    frames = encode_frame({"a": 1}) + encode_frame(["é", None]) + encode_frame("x" * 300)
    buf = FrameBuffer(max_bytes=1000)
    got = []
    for i in range(0, len(frames), 7):
        got += buf.feed(frames[i:i + 7])
    assert [decode_payload(p) for p in got] == [{"a": 1}, ["é", None], "x" * 300]
    assert buf.pending() == 0


def test_frame_header_over_limit_is_refused_before_buffering():
    buf = FrameBuffer(max_bytes=100)
    with pytest.raises(ProtocolError, match="101 bytes exceeds the limit of 100"):
        buf.feed((101).to_bytes(4, "big"))


def test_malformed_payload_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="malformed"):
        decode_payload(b"\xff{not json")


# --- raw values (worker side) ----------------------------------------------------------------

def test_raw_value_marks_tuples_and_converts_numpy_scalars():
    raw = raw_value(("obs", np.float32(0.5), np.bool_(True), False, {"k": (1, 2), "n": np.int64(3)}))
    assert raw == {"__tuple__": ["obs", 0.5, True, False, {"k": {"__tuple__": [1, 2]}, "n": 3}]}
    json.dumps(raw)  # always encodable


def test_raw_value_makes_odd_objects_opaque():
    assert raw_value({1, 2}) == {"__type__": "set"}
    assert raw_value(float("nan")) == {"__type__": "float nan"}
    assert raw_value(np.zeros(3)) == {"__type__": "ndarray"}
    assert raw_value({1: "a", None: "b", 2.5: "c", False: "d"}) == {"1": "a", "null": "b", "2.5": "c", "false": "d"}
    assert raw_value({(1, 2): "a"}) == {"__type__": "dict with key of type tuple"}
    deep = []
    for _ in range(100):
        deep = [deep]
    json.dumps(raw_value(deep))


# --- trusted-side checks -----------------------------------------------------------------------

def _step(*items):
    return {"__tuple__": list(items)}


def test_check_step_accepts_the_contract():
    assert check_step(_step("o", 1, True, False, {"a": {"__tuple__": [1]}}), 100) == ("o", 1.0, True, False,
                                                                                    {"a": [1]})


@pytest.mark.parametrize("raw, message", [
    (["o", 0.0, False, False, {}], "5-tuple, got list"),
    (_step("o", 0.0, False, {}), "5-tuple, got tuple of length 4"),
    (_step(1, 0.0, False, False, {}), "observation must be str, got int"),
    (_step("o", True, False, False, {}), "reward must be a real number, got bool"),
    (_step("o", "1.0", False, False, {}), "reward must be a real number, got str"),
    (_step("o", {"__type__": "float nan"}, False, False, {}), "got float nan"),
    (_step("o", 1e400, False, False, {}), "reward must be finite"),
    (_step("o", 0.0, 1, False, {}), "terminated must be bool, got int"),
    (_step("o", 0.0, False, None, {}), "truncated must be bool, got None"),
    (_step("o", 0.0, False, False, []), "info must be a dict, got list"),
    (_step("o", 0.0, False, False, {"x": {"__type__": "Lock"}}), "info['x'] holds a Lock"),
    (_step("x" * 11, 0.0, False, False, {}), "11 characters, more than the limit 10"),
])
def test_check_step_names_each_violation(raw, message):
    with pytest.raises(ContractViolation, match=message.replace("[", r"\[").replace("(", r"\(")):
        check_step(raw, 10)


def test_check_reset_solution_and_unwrap():
    assert check_reset({"__tuple__": ["hello", {}]}, 10) == ("hello", {})
    with pytest.raises(ContractViolation, match="2-tuple"):
        check_reset("hello", 10)
    assert check_solution("a\nb", 10) == "a\nb"
    with pytest.raises(ContractViolation, match="must return str, got list"):
        check_solution(["a"], 10)
    with pytest.raises(EnvFailure, match="boom"):
        unwrap({"ok": False, "error": "boom"})
    with pytest.raises(ProtocolError):
        unwrap({"value": 1})
    with pytest.raises(ContractViolation, match="larger than"):
        check_info({"x": "y" * 70000})


def test_clip_reward():
    assert [clip_reward(r) for r in (-3.0, -1.0, 0.25, 1.0, 7.5)] == [-1.0, -1.0, 0.25, 1.0, 1.0]


# --- parse stage policy --------------------------------------------------------------------------

def test_extract_code_prefers_the_fenced_block_defining_an_env():
    reply = ("Here is a helper:\n```python\ndef helper():\n    pass\n```\nAnd the env:\n"
             "```python\nclass FooEnv:\n    pass\n```\nDone.")
    assert extract_code(reply) == "class FooEnv:\n    pass\n"
    assert extract_code("```\nclass BarEnv:\n    pass\n```") == "class BarEnv:\n    pass\n"
    assert extract_code("```python\nclass CutEnv:\n    def reset(") == "class CutEnv:\n    def reset(\n"
    assert extract_code("class PlainEnv: pass") == "class PlainEnv: pass"


def test_policy_allows_env_modules_and_refuses_the_rest():
    check_program("import math, random, json\nimport numpy as np\nfrom numpy.random import default_rng\n"
                  "from spade_jax.envs import ToolUseEnv, extract_boxed\nfrom collections import Counter\n")
    for code, reason in [
        ("import os", "import of 'os' is not allowed"),
        ("import subprocess", "'subprocess' is not allowed"),
        ("from socket import socket", "'socket' is not allowed"),
        ("import numpy.ctypeslib", "numpy submodule"),
        ("from numpy import ctypeslib", "numpy submodule"),
        ("from spade_jax.sandbox import pool", "'spade_jax.sandbox' is not allowed"),
        ("from . import x", "relative imports"),
        ("x = open('f')", "use of 'open'"),
        ("__import__('os')", "use of '__import__'"),
        ("x = ().__class__.__subclasses__()", "attribute '__subclasses__'"),
        ("def f(:\n  pass", "syntax error at line 1"),
        ("", "no program text"),
    ]:
        with pytest.raises(PolicyError, match=reason.replace("(", r"\(")):
            check_program(code)
    with pytest.raises(PolicyError, match="more than the limit 10"):
        check_program("x = 1234567890", max_chars=10)
    assert import_refusal("numpy.linalg") is None


# --- similarity ----------------------------------------------------------------------------------

def test_similarity_ignores_names_constants_comments_and_docstrings():
    renamed = (EXAMPLE.replace("target", "goal").replace("total", "acc").replace("SumTargetEnv", "AddEnv")
               .replace("(4, 3 *", "(5, 2 *").replace('"""', '"""Changed doc. ', 1) + "\n# a trailing comment\n")
    assert code_similarity(EXAMPLE, EXAMPLE) == 1.0
    assert code_similarity(EXAMPLE, renamed) == 1.0
    assert normalized_tokens("x = 'a'  # c\n") == ["I", "=", "S"]


def test_distinct_library_envs_are_far_apart():
    sources = [library.render(env.name, None) for env in library.SEED_ENVS]
    prints = [fingerprint(s) for s in sources]
    worst = max(len(a & b) / len(a | b) for i, a in enumerate(prints) for b in prints[i + 1:])
    assert worst < 0.7
    assert code_similarity(sources[3], sources[3] + "\n# copy\n") == 1.0
    assert 0.0 <= code_similarity("def f(:", "class A: pass") <= 1.0  # untokenisable text still compares


# --- seccomp program ---------------------------------------------------------------------------

@pytest.mark.parametrize("arch", sorted(seccomp.SYSCALLS))
def test_seccomp_program_denies_namespace_syscalls_and_allows_the_rest(arch):
    prog = seccomp.filter_program(1, arch)
    assert prog[-1] == (0x06, 0, 0, 0x7FFF0000)  # default: allow
    assert prog[2] == (0x06, 0, 0, 0x80000000)  # foreign architecture: kill
    numbers = seccomp.SYSCALLS[arch]
    eperm = 0x00050000 | 1
    denied = {k for (code, jt, jf, k), nxt in zip(prog, prog[1:]) if code == 0x15 and (jt, jf) == (0, 1)
              and nxt == (0x06, 0, 0, eperm)}
    for name in ("unshare", "setns", "mount", "ptrace", "execve", "socket", "socketpair", "memfd_create",
                 "shmget", "setitimer", "io_uring_setup", "bpf", "pidfd_open"):
        assert numbers[name] in denied, name
    assert numbers["kill"] not in denied  # argument rule, not a plain denial
    assert ("alarm" in numbers) == (arch == "x86_64")  # aarch64 has no legacy calls
    assert len(prog) <= 4096 and all(len(struct.pack("=HBBI", *ins)) == 8 for ins in prog)


# --- records -------------------------------------------------------------------------------------

def test_configs_and_specs_validate_their_fields():
    with pytest.raises(ValueError, match="isolation must be one of"):
        SandboxConfig(isolation="full")
    with pytest.raises(ValueError, match="num_workers must be a positive int"):
        SandboxConfig(num_workers=0)
    with pytest.raises(ValueError, match="env_kwargs must be JSON-serialisable"):
        EpisodeSpec("x", env_kwargs={"lock": object()})
    with pytest.raises(ValueError, match="seed must be an int"):
        EpisodeSpec("x", seed="0")
    assert SandboxConfig.from_dict(SandboxConfig(num_workers=3).to_dict()).num_workers == 3
    with pytest.raises(ValueError, match="host_uid must be a non-negative int"):
        SandboxConfig(host_uid=-1)
    with pytest.raises(ValueError, match="episode_time_s must be > 0"):
        SandboxConfig(episode_time_s=0)
    report = IsolationReport("namespaces", {name: True for name in PROTECTIONS}, {"cpu_s": 1}, {"memory_mb": 1},
                             ("n",))
    assert report.full and IsolationReport.from_dict(report.to_dict()) == report
    weaker = IsolationReport("rlimits", {**report.protections, "pid_namespace": False, "seccomp": False}, {})
    assert weaker.missing == ["seccomp", "pid_namespace"] and not weaker.full and not weaker.syscall_filter
    assert math.isclose(SandboxConfig().timeout_reward, -0.5)


def test_messages_from_workers_are_checked_by_exact_type_without_recursion():
    deep = json.loads("[" * 900 + "]" * 900)  # as deep as the JSON decoder itself allows
    for bad, why in ((deep, "nested deeper"), ({"ok": True, "value": 10 ** 30}, "outside 64 bits"),
                     ({"ok": True, "value": {TUPLE_KEY: 5}}, "malformed tuple"),
                     ({"ok": True, "value": {OPAQUE_KEY: ["x"]}}, "malformed tuple or type marker"),
                     ({"ok": True, "value": {TUPLE_KEY: [], "extra": 1}}, "malformed"),
                     ({"ok": True, "value": [0] * (validate.MAX_NODES + 1)}, "more than")):
        with pytest.raises(ProtocolError, match=why):
            validate.check_message(bad)

    class Sneaky(int):
        pass

    with pytest.raises(ProtocolError, match="type Sneaky"):
        validate.check_message({"ok": True, "value": Sneaky(1)})
    fine = {"ok": True, "value": {TUPLE_KEY: ["obs", 1.0, True, False, {"k": [1, None, "x"]}]}}
    assert validate.check_message(fine) is fine
    observation, *_ = validate.check_step(fine["value"], 100)
    dirty = validate.check_observation("a\ud800b\x1b[2Jc\rd", 100)
    assert dirty == "a\ufffdb\ufffd[2Jc\ufffdd"


def test_raw_value_never_calls_methods_of_subclasses():
    class LyingInt(int):
        def bit_length(self):
            raise AssertionError("called")

    class LyingStr(str):
        def __eq__(self, other):
            raise AssertionError("called")

        __hash__ = str.__hash__

    assert raw_value(LyingInt(5)) == {OPAQUE_KEY: "LyingInt"}
    assert raw_value({LyingStr("__tuple__"): 5}) == {OPAQUE_KEY: "dict with key of type LyingStr"}
    assert raw_value(10 ** 40) == {OPAQUE_KEY: "int out of range"}
    assert raw_value({1: (2, [3.5])}) == {"1": {TUPLE_KEY: [2, [3.5]]}}


def test_virtual_clock_ignores_how_long_the_worker_waited():
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import datetime
            import time as clock

            worker.install_virtual_clock()
            first = (clock.time(), clock.monotonic(), datetime.datetime.now().timestamp())
            clock.sleep(0.3)
            second = (clock.time(), clock.monotonic(), datetime.datetime.now().timestamp())
            now = datetime.datetime.now()
            data = {"deltas": [b - a for a, b in zip(first, second)], "year": now.year,
                    "is_datetime": isinstance(now, datetime.datetime), "today": str(datetime.date.today())}
            os.write(write_fd, json.dumps(data).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    raw = os.read(read_fd, 4096)
    os.close(read_fd)
    assert os.waitpid(pid, 0)[1] == 0
    data = json.loads(raw)
    assert all(0 < d < 0.01 for d in data["deltas"]), data  # 0.3 s passed; the virtual clock moved ~ms
    assert data["year"] == 2025 and data["is_datetime"] and data["today"].startswith("2025-01-01")
