"""The hostile suite: every program in tests/hostile/ is one attack or failure.

Each one runs in a sandbox pool whose run-time import guard is off (as if it had slipped past
the import policy), next to a well-behaved episode. For each: the attack is rejected or
contained with the right reason, within its deadline; the well-behaved episode is still
served; and nothing is left behind (processes, files, connections). Then the whole corpus
runs at once in one batch, and through admission (where most stop at the parse stage).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from spade_jax.sandbox import EpisodeSpec, IsolationReport, SandboxConfig, SandboxPool, StepResult, host, isolation
from spade_jax.sandbox.admission import AdmissionConfig, admit_batch

HOSTILE = Path(__file__).parent / "hostile"
GOOD = (Path(__file__).parent / "sandbox_examples" / "boxed_game.py").read_text()
SECRET = "s3cr3t-9f8e7d6c"
LOAD_S, CALL_S = 1.5, 1.0
SLACK_S = 2.5  # scheduling noise on a shared 2-core machine
BASE = dict(num_workers=2, load_timeout_s=LOAD_S, call_timeout_s=CALL_S, memory_mb=256, disk_mb=8,
            output_limit_bytes=256 << 10)


@dataclasses.dataclass
class Ctx:
    """What the attacks are pointed at, and what the checks compare against."""

    tmp: Path
    port: int
    listener: socket.socket
    pids: list = dataclasses.field(default_factory=list)

    @property
    def pwned(self) -> Path:
        return self.tmp / "pwned"

    @property
    def secret_file(self) -> Path:
        return self.tmp / "secret.txt"

    def kwargs(self) -> dict:
        return {"path": str(self.pwned), "secret_path": str(self.secret_file), "port": self.port,
                "pids": self.pids, "repo_file": str(Path(__file__).resolve().parents[1] / "README.md")}


def _obs(result: StepResult) -> dict:
    return json.loads(result.observation)


def _no_writes(result, ctx):
    assert all(v != "written" for v in _obs(result).values())


def _bound_below(directory: str) -> set[str]:
    """Names directly under ``directory`` that lead to a directory the private root binds (the
    interpreter's own files: stdlib, numpy, loaded libraries; wherever the checkout lives)."""
    prefix = directory.rstrip("/") + "/"
    binds = isolation.minimal_bind_dirs(host._runtime_dirs())
    return {b[len(prefix):].split("/")[0] for b in binds if b.startswith(prefix)}


def _no_reads(result, ctx):
    data = _obs(result)
    assert SECRET not in result.observation
    assert all(v.endswith("Error") for v in data["files"].values()), data["files"]
    assert set(data["dirs"]["/"]) <= _bound_below("/") | {"dev", "scratch"}, data["dirs"]["/"]
    assert not {"etc", "proc"} & set(data["dirs"]["/"]), data["dirs"]["/"]
    for hidden in ("/tmp", "/home"):
        visible = _bound_below(hidden)
        if visible:  # only the path down to a bound directory, e.g. a checkout under /tmp
            assert set(data["dirs"][hidden]) <= visible, data["dirs"][hidden]
        else:
            assert data["dirs"][hidden] == "FileNotFoundError"


def _clean_env(result, ctx):
    assert SECRET not in result.observation
    assert set(_obs(result)) == {"HOME", "TMPDIR", "LANG", "PATH"}


def _no_escalation(result, ctx):
    data = _obs(result)
    data.pop("uid")
    assert all(v != "succeeded" for v in data.values()), data


def _only_own_fds(result, ctx):
    assert _obs(result)["open_fds"] == [0, 1, 2, 3]


def _disk_capped(result, ctx):
    data = _obs(result)
    assert data["written_mb"] <= 8 and data["error"], data


def _nothing_reached(result, ctx):
    assert all(v not in ("connected", "sent") for v in _obs(result).values())


def _nobody_killed(result, ctx):
    # kill(-1) reports success even when every target refused (EPERM), so what counts is
    # that the host, the sibling and this test process are still alive (checked after).
    data = _obs(result)
    assert all(data[str(pid)] != "sent" for pid in ctx.pids)


def _escape_contained(result, ctx):
    assert result.observation.startswith("system returned") or result.observation == "os not found"


def _forged_clipped(result, ctx):
    assert result.reward == 1.0 and result.raw_reward == 1e9


@dataclasses.dataclass(frozen=True)
class Expect:
    """How one hostile program must end.

    call: where it shows ("start" or "step"); error: substring of the reported error (None:
    the call succeeds and ``check`` inspects what leaked); admission: the stage at which the
    default admission stops it; pool: "open" (import guard off), "forking" (max_processes=16)
    or "guarded" (the default run-time import guard); needs: the isolation property that
    contains it, so that on a machine without namespaces the attack is not run for real
    against the test runner (it would kill pytest or fill /tmp).
    """

    call: str
    error: str | None = None
    timed_out: bool = False
    check: Callable | None = None
    admission: str = "parse"
    pool: str = "open"
    needs: Callable[[IsolationReport], bool] = lambda iso: True


def _private_files(iso):
    return iso.filesystem == "private-root"


def _no_network(iso):
    return iso.network == "none"


def _no_signalling_others(iso):
    return iso.pid_namespace or iso.per_episode_uid


def _no_forks(iso):
    return iso.processes_enforced


EXPECT = {
    "base_exception.py": Expect("step", "KeyboardInterrupt", admission="contract"),
    "deep_recursion.py": Expect("start", "SIGSEGV"),
    "detached_daemon.py": Expect("start", pool="forking", needs=_no_signalling_others),
    "disk_fill.py": Expect("start", check=_disk_capped, needs=_private_files),
    "env_secrets.py": Expect("start", check=_clean_env),
    "escalate.py": Expect("start", check=_no_escalation, needs=lambda iso: iso.syscall_filter),
    "exec_program.py": Expect("start", "no program could be executed", needs=_private_files),
    "fd_probe.py": Expect("start", check=_only_own_fds),
    "forbidden_import.py": Expect("start", "import of 'socket' is not allowed", pool="guarded"),
    "fork_bomb.py": Expect("start", "BlockingIOError", needs=_no_forks),
    "huge_observation.py": Expect("start", "exceeds the limit", admission="contract"),
    "idle_alarm.py": Expect("step", "not live: the worker exited with code 3"),
    "ignore_sigterm.py": Expect("step", "timeout: step", timed_out=True),
    "import_escape.py": Expect("start", check=_escape_contained, needs=_no_forks),
    "infeasible.py": Expect("step", admission="feasibility"),
    "kill_others.py": Expect("start", check=_nobody_killed, needs=_no_signalling_others),
    "loop_in_import.py": Expect("start", "timeout: load", timed_out=True, admission="load"),
    "loop_in_reset.py": Expect("start", "timeout: reset", timed_out=True, admission="contract"),
    "loop_in_step.py": Expect("step", "timeout: step", timed_out=True, admission="contract"),
    "memory_bomb.py": Expect("start", "MemoryError", admission="contract"),
    "nan_reward.py": Expect("step", "reward must be", admission="contract"),
    "network_connect.py": Expect("start", check=_nothing_reached, needs=_no_network),
    "never_ends.py": Expect("step", admission="contract"),
    "nondeterministic.py": Expect("step", admission="determinism"),
    "os_exit.py": Expect("start", "exited with code 7"),
    "protocol_forged_reply.py": Expect("step", check=_forged_clipped),
    "protocol_garbage.py": Expect("start", "protocol error: malformed message"),
    "protocol_huge_frame.py": Expect("start", "protocol error: frame of 4294967295 bytes"),
    "read_host_files.py": Expect("start", check=_no_reads, needs=_private_files),
    "recursion_error.py": Expect("step", "RecursionError", admission="contract"),
    "sleep_in_step.py": Expect("step", "timeout: step", timed_out=True),
    "stderr_flood.py": Expect("start", "output limit exceeded"),
    "stdout_flood.py": Expect("step", "output limit exceeded", admission="contract"),
    "subprocess_shell.py": Expect("start", "BlockingIOError", needs=_no_forks),
    "sys_exit.py": Expect("step", "SystemExit"),
    "tamper_protocol.py": Expect("start", "protocol error"),
    "threads.py": Expect("start", "can't start new thread", needs=_no_forks),
    "trivial_win.py": Expect("step", admission="not_trivial"),
    "two_env_classes.py": Expect("start", "exactly one class", admission="load"),
    "unencodable_info.py": Expect("step", "not JSON-serialisable", admission="contract"),
    "write_outside.py": Expect("start", check=_no_writes, needs=_private_files),
    "wrong_types.py": Expect("step", "5-tuple", admission="contract"),
}


def test_every_hostile_program_has_an_expectation():
    files = sorted(p.name for p in HOSTILE.glob("*.py"))
    assert files == sorted(EXPECT)
    assert len(files) >= 25


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    old = os.environ.get("SPADE_TEST_SECRET")
    os.environ["SPADE_TEST_SECRET"] = SECRET
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "secret.txt").write_text(SECRET)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    yield Ctx(tmp, listener.getsockname()[1], listener)
    listener.close()
    if old is None:
        del os.environ["SPADE_TEST_SECRET"]
    else:
        os.environ["SPADE_TEST_SECRET"] = old


@pytest.fixture(scope="module")
def pools(ctx):
    made = {"open": SandboxPool(SandboxConfig(restrict_imports=False, **BASE)),
            "forking": SandboxPool(SandboxConfig(restrict_imports=False, max_processes=16, **BASE)),
            "guarded": SandboxPool(SandboxConfig(**BASE))}
    yield made
    for pool in made.values():
        pool.close_all()


def _tree(pool: SandboxPool) -> list[psutil.Process]:
    return psutil.Process(pool.host_pid).children(recursive=True)


def _baseline(pool: SandboxPool) -> int:
    return 2  # the host proper and its zygote, under the outer guard process


def _assert_nothing_left(pool: SandboxPool, ctx: Ctx) -> None:
    left = [p for p in _tree(pool)]
    assert len(left) == _baseline(pool), [(p.pid, p.status(), p.uids().real, p.cmdline()) for p in left]
    assert not ctx.pwned.exists()
    with pytest.raises(BlockingIOError):
        ctx.listener.accept()


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_hostile_program_is_contained(name, pools, ctx):
    expect = EXPECT[name]
    pool = pools[expect.pool]
    if not expect.needs(pool.isolation):
        pytest.skip(f"the isolation in force here does not contain this attack: {pool.isolation.notes}")
    good = pool.start([EpisodeSpec(GOOD, seed=3)])[0]
    assert good.ok, good.error
    tree = _tree(pool)
    ctx.pids = [pool.host_pid, os.getpid()] + [p.pid for p in tree]  # trainer, host, sibling worker
    started = time.monotonic()
    bad = pool.start([EpisodeSpec((HOSTILE / name).read_text(), seed=0, env_kwargs=ctx.kwargs())])[0]
    try:
        _check_case(name, expect, pool, ctx, good, bad, started, tree)
    finally:
        pool.close([bad.episode_id, good.episode_id])
    _assert_nothing_left(pool, ctx)


def _check_case(name, expect, pool, ctx, good, bad, started, tree):
    result, deadline = bad, LOAD_S + CALL_S
    if expect.call == "step":
        assert bad.ok, bad.error
        if name == "idle_alarm.py":
            time.sleep(0.5)
        started = time.monotonic()
        result, deadline = pool.step([bad.episode_id], ["\\boxed{1}"])[0], CALL_S
    elapsed = time.monotonic() - started
    assert elapsed < deadline + SLACK_S
    assert result.timed_out == expect.timed_out
    if expect.error is None:
        assert result.ok, result.error
    else:
        assert result.error is not None and expect.error in result.error, result.error
        assert result.truncated
    if expect.timed_out and expect.call == "step":
        assert result.reward == -0.5
    if expect.check:
        expect.check(result, ctx)
    if name == "escalate.py" and pool.isolation.per_episode_uid:
        assert _obs(result)["uid"] != 0
    if name == "detached_daemon.py":
        assert len(_tree(pool)) > len(tree), "the daemon should be alive until the episode is closed"
    if name == "protocol_forged_reply.py":
        after = pool.step([bad.episode_id], ["\\boxed{1}"])[0]
        assert "not live: protocol error" in after.error
    sibling = pool.step([good.episode_id], ["\\boxed{2}"])[0]
    assert sibling.ok and sibling.observation == "Total is 2.", sibling
    assert psutil.pid_exists(pool.host_pid)


def test_fork_bomb_with_forks_allowed_leaves_nothing(pools, ctx):
    pool = pools["forking"]
    if not pool.isolation.pid_namespace:
        pytest.skip("without PID namespaces a fork bomb is only bounded by the per-uid process limit")
    bad = pool.start([EpisodeSpec((HOSTILE / "fork_bomb.py").read_text())])[0]
    assert bad.error is not None
    good = pool.start([EpisodeSpec(GOOD, seed=1)])[0]
    assert good.ok
    pool.close([bad.episode_id, good.episode_id])
    _assert_nothing_left(pool, ctx)


def test_whole_corpus_at_once_next_to_good_episodes(pools, ctx):
    pool = pools["open"]
    names = [n for n in sorted(EXPECT) if EXPECT[n].pool == "open" and EXPECT[n].needs(pool.isolation)]
    specs = [EpisodeSpec((HOSTILE / n).read_text(), seed=0, env_kwargs=ctx.kwargs()) for n in names]
    goods = [EpisodeSpec(GOOD, seed=s) for s in range(4)]
    started = time.monotonic()
    results = pool.start(specs[:len(specs) // 2] + goods + specs[len(specs) // 2:])
    good_results = results[len(specs) // 2:len(specs) // 2 + 4]
    bad_results = results[:len(specs) // 2] + results[len(specs) // 2 + 4:]
    assert all(r.ok for r in good_results), [r.error for r in good_results]
    for name, r in zip(names, bad_results):
        if EXPECT[name].call == "start" and EXPECT[name].error:
            assert EXPECT[name].error in (r.error or ""), (name, r.error)
    live = [r.episode_id for r in bad_results if r.ok] + [r.episode_id for r in good_results]
    steps = pool.step(live, ["\\boxed{2}"] * len(live))
    assert [s.observation for s in steps[-4:]] == ["Total is 2."] * 4
    # 42 programs, a handful with 1-1.5 s deadlines, two calls at a time
    assert time.monotonic() - started < 60
    pool.close([r.episode_id for r in results])
    _assert_nothing_left(pool, ctx)


def test_admission_rejects_every_hostile_program_at_the_expected_stage(pools):
    texts = [(HOSTILE / n).read_text() for n in sorted(EXPECT)]
    reports = admit_batch(texts, AdmissionConfig(), pool=pools["guarded"])
    got = {n: (r.admitted, r.stage) for n, r in zip(sorted(EXPECT), reports)}
    assert got == {n: (False, e.admission) for n, e in EXPECT.items()}
    for n, r in zip(sorted(EXPECT), reports):
        assert r.reason, n
