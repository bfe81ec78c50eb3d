"""Pure parts of the sandbox: framing, raw encoding, trusted-side checks, policy, similarity, seccomp, records."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from spade_jax.envs import library
from spade_jax.sandbox import seccomp
from spade_jax.sandbox.policy import PolicyError, check_program, extract_code, import_refusal
from spade_jax.sandbox.protocol import FrameBuffer, ProtocolError, decode_payload, encode_frame, raw_value
from spade_jax.sandbox.records import EpisodeSpec, IsolationReport, SandboxConfig
from spade_jax.sandbox.similarity import code_similarity, fingerprint, most_similar, normalized_tokens
from spade_jax.sandbox.validate import (ContractViolation, EnvFailure, check_info, check_reset, check_solution,
                                        check_step, clip_reward, unwrap)

EXAMPLE = (Path(__file__).parent / "sandbox_examples" / "boxed_game.py").read_text()


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
    index, score = most_similar(sources[3], [sources[0], sources[3] + "\n# copy\n", sources[5]])
    assert (index, score) == (1, 1.0)
    assert most_similar("x = 1", []) == (-1, 0.0)
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
    report = IsolationReport("namespaces", "none", "private-root", True, True, True, {"cpu_s": 1}, True, ("n",))
    assert report.full and IsolationReport.from_dict(report.to_dict()) == report
    assert math.isclose(SandboxConfig().timeout_reward, -0.5)
