"""The hostile suite: every program in tests/sandbox/hostile/ is one attack or failure, run in four modes.

Modes (each a set of SandboxConfig overrides for every pool it uses):
  a  as configured: programs marked "guarded" keep the run-time import guard, the rest run
     with it off (as if they had slipped past the import policy); namespaces; root
  b  the import policy off everywhere: only the OS layers stand
  c  namespaces forced off (isolation="rlimits"), import policy off
  d  the pool run as an unprivileged uid created for the test (host_uid), import policy off
  e  d with namespaces forced off as well: the weakest configuration (no per-episode uid, no
     cgroup, no namespaces; seccomp and Landlock are what stands)

Per mode the whole corpus runs at once, next to well-behaved episodes, in three pools (import
guard off; guard off with forks allowed; guard as the mode says): every program is started,
the workers idle for a moment, the step programs are stepped, then everything is closed.
Each program's outcome is then checked on its own (``test_contained``): the attack is
rejected or contained with the right reason within its deadline, the well-behaved episodes
are still served, the host survives, and nothing is left behind (processes, files,
connections, cgroups, IPC). Scenarios that need a pool of their own (pool-wide memory
budget, slow-call denial of service, fork bomb with forks allowed, a host killed from
outside) run per mode too. Finally the default admission rejects each program at its stage.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pwd
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from spade_jax.admission import AdmissionConfig, admit_batch
from spade_jax.sandbox import EpisodeSpec, IsolationReport, SandboxConfig, SandboxPool, StepResult

# Wall-clock and process-count bounds: run alone, not beside other tests (tests/run.sh).
HOSTILE = Path(__file__).parent / "hostile"
GOOD = (Path(__file__).parents[1] / "sandbox_examples" / "boxed_game.py").read_text()
SECRET = "s3cr3t-9f8e7d6c"
LOAD_S, CALL_S = 1.5, 1.0
SLACK_S = 2.5  # scheduling noise on a shared 2-core machine
IDLE_S = 0.6  # how long workers idle between start and step
BASE = dict(num_workers=2, load_timeout_s=LOAD_S, call_timeout_s=CALL_S, memory_mb=256, disk_mb=8,
            output_limit_bytes=256 << 10)


def _unprivileged_uid() -> int:
    """A uid no account and no process on this machine uses (the test's unprivileged user), its
    search started at an offset of this process's pid: RLIMIT_NPROC counts a uid's processes
    machine-wide, so two test processes sharing one (xdist workers, two suites at once) would
    spend each other's process budget (a fork bomb in one made the other's fork fail)."""
    used = {p.info["uids"].real for p in psutil.process_iter(["uids"]) if p.info["uids"]}
    start = 61_234 + (os.getpid() % 1024) * 3
    for uid in [*range(start, 65_000), *range(61_234, start)]:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid not in used:
                return uid
    raise RuntimeError("no free uid for the unprivileged mode")


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    config: dict
    guard: bool


UNPRIVILEGED = _unprivileged_uid()
MODES = {
    "a": Mode("a", {}, guard=True),
    "b": Mode("b", {"restrict_imports": False}, guard=False),
    "c": Mode("c", {"restrict_imports": False, "isolation": "rlimits"}, guard=False),
    "d": Mode("d", {"restrict_imports": False, "host_uid": UNPRIVILEGED}, guard=False),
    "e": Mode("e", {"restrict_imports": False, "host_uid": UNPRIVILEGED, "isolation": "rlimits"}, guard=False),
}
pytestmark = pytest.mark.filterwarnings("ignore:sandbox protections not in force:RuntimeWarning")


@dataclasses.dataclass(eq=False)
class Ctx:
    """What the attacks are pointed at, and what the checks compare against."""

    tmp: Path
    port: int
    listener: socket.socket
    tag: str
    marker: str
    pids: list = dataclasses.field(default_factory=list)

    @property
    def pwned(self) -> Path:
        return self.tmp / "pwned"

    @property
    def secret_file(self) -> Path:
        return self.tmp / "secret.txt"

    def kwargs(self, host_pid: int = 0) -> dict:
        return {"path": str(self.pwned), "secret_path": str(self.secret_file), "port": self.port,
                "pids": self.pids, "repo_file": str(Path(__file__).resolve().parents[2] / "README.md"),
                "host_pid": host_pid, "tag": self.tag, "marker": self.marker,
                "dir": str(self.tmp), "name": f"spade-xep-{self.tag}"}


@dataclasses.dataclass
class Outcome:
    """What one hostile episode did in one mode."""

    start: StepResult
    step: StepResult | None = None
    after: StepResult | None = None
    pool: SandboxPool | None = None
    tree_before: int = 0
    tree_live: int = 0


def _obs(result: StepResult) -> dict:
    return json.loads(result.observation)


def _no_breach(result, ctx, mode):
    assert "BREACH" not in result.observation, result.observation


def _no_writes(result, ctx, mode):
    assert all(v != "written" for v in _obs(result).values())


def _no_reads(result, ctx, mode):
    data = _obs(result)
    assert SECRET not in result.observation
    assert all(v.endswith("Error") for v in data["files"].values()), data["files"]
    for directory, listing in data["dirs"].items():
        if isinstance(listing, list):  # only the private root's own entries may show
            assert not {"etc", "proc", "root", "work"} & set(listing) or directory != "/", listing
            assert directory in ("/", "/tmp", "/home"), (directory, listing)
            assert not (set(listing) & {ctx.tmp.name, "pytest-of-root"}), listing


def _clean_env(result, ctx, mode):
    assert SECRET not in result.observation
    assert set(_obs(result)) == {"HOME", "TMPDIR", "LANG", "PATH"}


def _no_escalation(result, ctx, mode):
    data = _obs(result)
    if data.pop("uid") == 0:  # already root of its own user namespace (mode d): setuid(0) is a no-op
        data.pop("setuid0")
    assert all(v != "succeeded" for v in data.values()), data


def _only_own_fds(result, ctx, mode):
    assert _obs(result)["open_fds"] == [0, 1, 2, 3]


def _disk_capped(result, ctx, mode):
    data = _obs(result)
    assert data["written_mb"] <= 8 and data["error"], data


def _many_files_capped(result, ctx, mode):
    if result.error:  # the host measured the scratch directory over its budget
        assert "scratch directory over its budget" in result.error
    else:  # a size-limited tmpfs refused more
        data = _obs(result)
        assert data["written_mb"] <= 8 and data["stopped_by"], data


def _nothing_reached(result, ctx, mode):
    assert all(v not in ("connected", "sent") for v in _obs(result).values())


def _nobody_killed(result, ctx, mode):
    # kill(-1) reports success even when every target refused (EPERM), so what counts is
    # that the host, the siblings and this test process are still alive (checked after).
    data = _obs(result)
    assert all(data.get(str(pid)) != "sent" for pid in ctx.pids)


def _escape_contained(result, ctx, mode):
    assert result.observation.startswith("system returned") or result.observation == "os not found"


def _forged_clipped(result, ctx, mode):
    assert result.reward == 1.0 and result.raw_reward == 1e9


def _clean_text(result, ctx, mode):
    text = result.observation + json.dumps(result.info)
    assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)
    assert not any(ord(ch) < 32 and ch not in "\n\t" for ch in text)
    assert "\u202e" not in text and "\ufffd" in result.observation


def _no_control_in_error(result, ctx, mode):
    assert "\x1b" not in result.error and "\r" not in result.error


def _virtual_clock(result, ctx, mode):
    deltas = _obs(result)["deltas"]
    python_level = {k: v for k, v in deltas.items() if k != "clock_gettime"}  # the vDSO clock: see README
    assert len(python_level) >= 3, deltas
    for source, delta in python_level.items():
        assert abs(delta) < 0.1, deltas  # the workers idled IDLE_S; the virtual clock did not see it


def _idle_worker_did_nothing(result, ctx, mode):
    data = _obs(result)
    assert "BREACH" not in result.observation, data
    assert data["utime_between_calls"] < 0.05, data


def _one_of(*texts: str) -> Callable:
    def check(result, ctx, mode):
        assert result.error and any(t in result.error for t in texts), result.error
    return check


@dataclasses.dataclass(frozen=True)
class Expect:
    """How one hostile program must end, in every mode.

    call: where it shows ("start" or "step"); error: substring of the reported error (None:
    the call succeeds and ``check`` inspects what leaked; ``check`` may also judge errors);
    guard_error: the error instead when the run-time import guard is on; admission: the
    stage at which the default admission stops it; pool: "open" (import guard off),
    "forking" (max_processes=16) or "guarded" (the mode's import guard); variants: one
    episode per kwargs dict.
    """

    call: str
    error: str | None = None
    timed_out: bool = False
    check: Callable | None = None
    guard_error: str | None = None
    admission: str = "parse"
    pool: str = "open"
    variants: tuple = ({},)


EXPECT = {
    "aggregate_memory.py": Expect("step", admission="contract", variants=({"mb": 20},)),
    "base_exception.py": Expect("step", "KeyboardInterrupt", admission="contract"),
    "cross_episode_socket.py": Expect("step", check=_no_breach,
                                      variants=({"role": "listen"}, {"role": "connect"})),
    # Python 3.12 bounds recursion through C itself (RecursionError); before it the C stack overflows.
    "deep_recursion.py": Expect("start", "SIGSEGV" if sys.version_info < (3, 12) else "RecursionError"),
    "detached_daemon.py": Expect("start", pool="forking"),
    "disk_fill.py": Expect("start", check=_disk_capped),
    "disk_fill_many.py": Expect("start", check=_many_files_capped),
    "env_secrets.py": Expect("start", check=_clean_env),
    "escalate.py": Expect("start", check=_no_escalation),
    "exec_program.py": Expect("start", "no program could be executed"),
    "fd_probe.py": Expect("start", check=_only_own_fds),
    "forbidden_import.py": Expect("start", guard_error="import of 'socket' is not allowed", pool="guarded"),
    "fork_bomb.py": Expect("start", "BlockingIOError"),
    "huge_observation.py": Expect("start", "exceeds the limit", admission="contract"),
    "idle_alarm.py": Expect("start", "Operation not permitted"),
    "idle_cpu.py": Expect("step", check=_idle_worker_did_nothing),
    "ignore_sigterm.py": Expect("step", "timeout: step", timed_out=True),
    "import_escape.py": Expect("start", check=_escape_contained),
    "infeasible.py": Expect("step", admission="feasibility"),
    "kill_others.py": Expect("start", check=_nobody_killed),
    "litter.py": Expect("start", check=_no_breach),
    "loop_in_import.py": Expect("start", "timeout: load", timed_out=True, admission="load"),
    "loop_in_reset.py": Expect("start", "timeout: reset", timed_out=True, admission="contract"),
    "loop_in_step.py": Expect("step", "timeout: step", timed_out=True, admission="contract"),
    "memfd_hog.py": Expect("start", check=_no_breach),
    "memory_bomb.py": Expect("start", "MemoryError", admission="contract"),
    "nan_reward.py": Expect("step", "reward must be", admission="contract"),
    "network_connect.py": Expect("start", check=_nothing_reached),
    "never_ends.py": Expect("step", admission="contract"),
    "nondeterministic.py": Expect("step", admission="determinism"),
    "os_exit.py": Expect("start", "exited with code 7"),
    "peek_host_memory.py": Expect("start", check=_no_breach),
    "proc_snoop.py": Expect("start", check=_no_breach),
    "protocol_bad_values.py": Expect("step", "protocol error", variants=(
        {"variant": "bigint"}, {"variant": "marker"}, {"variant": "utf8"}, {"variant": "okstr"})),
    "protocol_deep_nesting.py": Expect("step", "protocol error: malformed message: RecursionError"),
    "protocol_forged_reply.py": Expect("step", check=_forged_clipped),
    "protocol_garbage.py": Expect("start", "protocol error: malformed message"),
    "protocol_huge_frame.py": Expect("start", "protocol error: frame of 4294967295 bytes"),
    "read_host_files.py": Expect("start", check=_no_reads),
    "recursion_error.py": Expect("step", "RecursionError", admission="contract"),
    "same_uid_attacks.py": Expect("start", check=_no_breach),
    "segfault.py": Expect("start", "SIGSEGV"),
    "sleep_in_step.py": Expect("step", "timeout: step", timed_out=True),
    "slow_calls.py": Expect("step", admission="contract", variants=({"iterations": 3_000_000},)),
    "spoof_output.py": Expect("start", "RuntimeError", check=_no_control_in_error),
    "stderr_flood.py": Expect("start", "output limit exceeded"),
    "stdout_flood.py": Expect("step", "output limit exceeded", admission="contract"),
    "subclass_lies.py": Expect("step", "contract violation", admission="contract",
                               variants=({"variant": "int"}, {"variant": "str"})),
    "subprocess_shell.py": Expect("start", "BlockingIOError"),
    "surrogate_observation.py": Expect("start", check=_clean_text, admission="feasibility"),
    "sys_exit.py": Expect("step", "SystemExit"),
    "tamper_protocol.py": Expect("start", "protocol error"),
    "threads.py": Expect("start", "can't start new thread"),
    "time_sniff.py": Expect("step", check=_virtual_clock),
    "trivial_win.py": Expect("step", admission="not_trivial"),
    "two_env_classes.py": Expect("start", "exactly one class", admission="load"),
    "unencodable_info.py": Expect("step", "not JSON-serialisable", admission="contract"),
    "vsock_netlink.py": Expect("start", check=_no_breach),
    "write_outside.py": Expect("start", check=_no_writes),
    "wrong_types.py": Expect("step", "5-tuple", admission="contract"),
}
# What must hold beyond each episode's own outcome, checked once per mode.
SCENARIOS = ("pool_memory_budget", "slow_calls_bounded", "fork_bomb_with_forks", "host_killed_from_outside")


def test_every_hostile_program_has_an_expectation():
    files = sorted(p.name for p in HOSTILE.glob("*.py"))
    assert files == sorted(EXPECT)
    assert len(files) >= 55


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    old = os.environ.get("SPADE_TEST_SECRET")
    os.environ["SPADE_TEST_SECRET"] = SECRET
    # world-readable and world-writable on purpose: file permissions must not be what stops
    # an unprivileged pool from reading the secret or writing the target
    tmp = Path(tempfile.mkdtemp(prefix="spade-hostile-", dir="/tmp"))
    tmp.chmod(0o1777)
    (tmp / "secret.txt").write_text(SECRET)
    (tmp / "secret.txt").chmod(0o644)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    yield Ctx(tmp, listener.getsockname()[1], listener, secrets.token_hex(4), "MARK-" + secrets.token_hex(8))
    listener.close()
    for child in tmp.iterdir():
        child.unlink()
    tmp.rmdir()
    if old is None:
        del os.environ["SPADE_TEST_SECRET"]
    else:
        os.environ["SPADE_TEST_SECRET"] = old


def _tree(pool: SandboxPool) -> list[psutil.Process]:
    return psutil.Process(pool.host_pid).children(recursive=True)


def _assert_nothing_left(pool: SandboxPool, ctx: Ctx) -> None:
    left = _tree(pool)
    assert len(left) == 2, [(p.pid, p.status(), p.uids().real, p.cmdline()) for p in left]  # host proper + zygote
    assert not ctx.pwned.exists()
    with pytest.raises(BlockingIOError):
        ctx.listener.accept()
    litter = [p for d in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(d).glob(f"spade-litter-{ctx.tag}*")]
    assert not litter, litter


def _pool(mode: Mode, kind: str, **extra) -> SandboxPool:
    config = dict(BASE, **mode.config)
    if kind == "guarded":
        config["restrict_imports"] = mode.guard
    else:
        config["restrict_imports"] = False
    if kind == "forking":
        config["max_processes"] = 16
    config.update(extra)
    return SandboxPool(SandboxConfig(**config))


@functools.cache
def run_mode(name: str, ctx: Ctx) -> tuple[dict, dict]:
    """Runs the whole corpus in one mode; (outcomes by program#variant, isolation reports by pool kind)."""
    mode = MODES[name]
    pools = {kind: _pool(mode, kind) for kind in ("open", "forking", "guarded")}
    try:
        return _run_corpus(pools, ctx), {kind: pool.isolation for kind, pool in pools.items()}
    finally:
        for pool in pools.values():
            pool.close_all()


def _run_corpus(pools: dict, ctx: Ctx) -> dict:
    outcomes: dict[str, Outcome] = {}
    for kind, pool in pools.items():
        goods = pool.start([EpisodeSpec(GOOD, seed=s) for s in range(2)])
        marked = pool.start([EpisodeSpec(GOOD + f"\n# {ctx.marker}\n", seed=9, env_kwargs={"note": ctx.marker})])
        assert all(r.ok for r in goods + marked), [r.error for r in goods + marked]
        ctx.pids = [pool.host_pid, os.getpid()] + [p.pid for p in _tree(pool)]
        names, specs = [], []
        for name, expect in sorted(EXPECT.items()):
            if expect.pool != kind:
                continue
            for i, variant in enumerate(expect.variants):
                names.append(f"{name}#{i}")
                specs.append(EpisodeSpec((HOSTILE / name).read_text(), seed=0,
                                         env_kwargs={**ctx.kwargs(pool.host_pid), **variant}))
        tree_before = len(_tree(pool))
        starts = pool.start(specs)
        tree_live = len(_tree(pool))
        for key, result in zip(names, starts):
            outcomes[key] = Outcome(result, pool=pool, tree_before=tree_before, tree_live=tree_live)
        time.sleep(IDLE_S)
        stepping = [k for k in names if EXPECT[k.split("#")[0]].call == "step"]
        ids = [outcomes[k].start.episode_id for k in stepping] + [r.episode_id for r in goods]
        steps = pool.step(ids, ["\\boxed{1}"] * len(ids))
        for key, result in zip(stepping, steps):
            outcomes[key].step = result
        assert [s.observation for s in steps[len(stepping):]] == ["Total is 1.", "Total is 1."], steps[len(stepping):]
        forged = [k for k in stepping if k.startswith("protocol_forged_reply")]
        for key, result in zip(forged, pool.step([outcomes[k].start.episode_id for k in forged],
                                                 ["\\boxed{1}"] * len(forged))):
            outcomes[key].after = result
        sibling = pool.step([r.episode_id for r in goods], ["\\boxed{2}"] * 2)
        assert [s.observation for s in sibling] == ["Total is 3.", "Total is 3."], sibling
        assert psutil.pid_exists(pool.host_pid)
        pool.close([o.start.episode_id for o in outcomes.values() if o.pool is pool]
                   + [r.episode_id for r in goods + marked])
        assert pool.host_restarts == 0
        _assert_nothing_left(pool, ctx)
    return outcomes


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_contained(name, mode, ctx):
    outcomes, reports = run_mode(mode, ctx)
    expect = EXPECT[name]
    guarded = expect.pool == "guarded" and MODES[mode].guard
    for i in range(len(expect.variants)):
        out = outcomes[f"{name}#{i}"]
        result = out.step if expect.call == "step" else out.start
        if expect.call == "step":
            assert out.start.ok, out.start.error
        deadline = (LOAD_S + CALL_S if expect.call == "start" else CALL_S) + SLACK_S
        assert result.elapsed_s < deadline, result.elapsed_s
        assert result.timed_out == expect.timed_out, result
        error = expect.guard_error if guarded else expect.error
        if error is not None:
            assert result.error is not None and error in result.error, result.error
            assert result.truncated
        elif expect.check is None or not result.error:
            assert result.ok, result.error
        if expect.timed_out and expect.call == "step":
            assert result.reward == -0.5
        if expect.check and not guarded:
            expect.check(result, ctx, mode)
        if name == "escalate.py" and reports["open"].per_episode_uid:
            assert _obs(result)["uid"] != 0
        if name == "detached_daemon.py":
            assert out.tree_live > out.tree_before, "the daemon should be alive until the episode is closed"
        if name == "protocol_forged_reply.py":
            assert out.after.error or out.after.observation == "genuine", out.after  # desynced, still checked


@pytest.mark.parametrize("mode", sorted(MODES))
def test_isolation_in_force_per_mode(mode, ctx):
    """What each mode runs with here; a missing layer is named (on this machine: none but the mode's own)."""
    _, reports = run_mode(mode, ctx)
    report: IsolationReport = reports["open"]
    expected_missing = {
        "a": set(), "b": set(),
        "c": {"private_root", "pid_namespace", "network_namespace", "ipc_namespace", "scratch_tmpfs"},
        "d": {"per_episode_uid", "memory_cgroup", "pids_cgroup"},
        "e": {"private_root", "pid_namespace", "network_namespace", "ipc_namespace", "scratch_tmpfs",
              "per_episode_uid", "memory_cgroup", "pids_cgroup"},
    }[mode]
    kernel_layers = {"seccomp", "landlock_filesystem", "landlock_network", "landlock_scopes"}
    missing = set(report.missing)
    if missing - expected_missing - kernel_layers:
        pytest.fail(f"unexpected protections missing in mode {mode}: {report.missing} ({report.notes})")
    if missing & kernel_layers:
        pytest.skip(f"this kernel lacks {sorted(missing & kernel_layers)}: {report.notes}")
    assert missing == expected_missing, report.to_dict()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_pool_memory_budget_holds_across_episodes(mode, ctx):
    """Five episodes of 150 MB each against a 400 MB pool budget: some are killed for the pool's
    sake (not their own limit), the pool stays within budget, a sibling is served."""
    with _pool(MODES[mode], "open", pool_memory_mb=400) as pool:
        good = pool.start([EpisodeSpec(GOOD, seed=1)])[0]
        program = (HOSTILE / "aggregate_memory.py").read_text()
        starts = pool.start([EpisodeSpec(program, env_kwargs={"mb": 150}) for _ in range(5)])
        steps = pool.step([r.episode_id for r in starts], ["\\boxed{1}"] * 5)
        alive = [s for s in steps if s.ok]
        dead = [s for r, s in zip(starts, steps) if not (r.ok and s.ok)]
        assert 1 <= len(alive) <= 2 and len(dead) >= 3, [(r.error, s.error) for r, s in zip(starts, steps)]
        reasons = [r.error or s.error for r, s in zip(starts, steps) if not (r.ok and s.ok)]
        assert all("memory budget" in e or "out of memory" in e for e in reasons), reasons
        assert pool.stats()["memory_bytes"] <= 400 << 20
        assert pool.step([good.episode_id], ["\\boxed{1}"])[0].observation == "Total is 1."
        pool.close([good.episode_id] + [r.episode_id for r in starts])
        _assert_nothing_left(pool, ctx)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_slow_calls_cannot_hold_an_episode_forever(mode, ctx):
    """Every call well under the call deadline: the episode's time budget still ends it.

    The per-call deadline gets room (a call takes about 0.5 s on an idle core) so that the
    episode budget is what normally fires; on a loaded machine a call may still pass the
    per-call deadline first, and either limit contains the program. What the test bounds is
    what the code controls: the episode ends, timed out, before its 20th call and within one
    call deadline (plus scheduling slack) of its budget.
    """
    call_s = 2.0
    with _pool(MODES[mode], "open", episode_time_s=2.5, call_timeout_s=call_s) as pool:
        program = (HOSTILE / "slow_calls.py").read_text()
        started = time.monotonic()
        first = pool.start([EpisodeSpec(program, env_kwargs={"iterations": 12_000_000})])[0]
        results = [first]
        while results[-1].ok and len(results) < 20:
            results.append(pool.step([first.episode_id], ["\\boxed{1}"])[0])
        last = results[-1]
        assert not last.ok and last.timed_out, last
        assert "time budget of 2.5 s" in last.error or f"took longer than {call_s:g} s" in last.error, last
        assert time.monotonic() - started < 2.5 + call_s + SLACK_S
        pool.close([first.episode_id])
        _assert_nothing_left(pool, ctx)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fork_bomb_with_forks_allowed_leaves_nothing(mode, ctx):
    with _pool(MODES[mode], "forking") as pool:
        bad = pool.start([EpisodeSpec((HOSTILE / "fork_bomb.py").read_text())])[0]
        assert bad.error is not None
        good = pool.start([EpisodeSpec(GOOD, seed=1)])[0]
        assert good.ok
        pool.close([bad.episode_id, good.episode_id])
        _assert_nothing_left(pool, ctx)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_host_killed_from_outside_is_restarted_and_only_its_episodes_fail(mode, ctx):
    with _pool(MODES[mode], "open") as pool:
        before = pool.start([EpisodeSpec(GOOD, seed=s) for s in range(3)])
        inner = [p.pid for p in _tree(pool)]
        psutil.Process(inner[0]).kill()  # the host proper: the OOM killer or a bug, say
        with pytest.warns(RuntimeWarning, match="restarted"):
            lost = pool.step([r.episode_id for r in before], ["\\boxed{1}"] * 3)
        assert all(r.failed_call == "host" and "restarted" in r.error for r in lost)
        assert pool.host_restarts == 1
        after = pool.start([EpisodeSpec(GOOD, seed=4)])[0]
        assert pool.step([after.episode_id], ["\\boxed{1}"])[0].observation == "Total is 1."
        pool.close([r.episode_id for r in before] + [after.episode_id])
        _assert_nothing_left(pool, ctx)


def test_admission_rejects_every_hostile_program_at_the_expected_stage(ctx):
    texts = [(HOSTILE / n).read_text() for n in sorted(EXPECT)]
    with _pool(MODES["a"], "guarded") as pool:
        # slow_calls.py spends most of its budget; the budget itself is tested in test_sandbox_admission
        reports = admit_batch(texts, AdmissionConfig(time_budget_s=5.0), pool=pool, seed=0)
    got = {n: (r.admitted, r.stage) for n, r in zip(sorted(EXPECT), reports)}
    assert got == {n: (False, e.admission) for n, e in EXPECT.items()}
    for n, r in zip(sorted(EXPECT), reports):
        assert r.reason, n


PROBE_SNIFFERS = {  # tests/hostile_admission: programs that try to tell admission probes from play
    "seed_backdoor.py": {"not_trivial"},
    "noop_dodge.py": {"not_trivial"},
    # its coin flips can land alike on a replay (one fresh-clone run in many): not_trivial then
    # rejects it, its random plays winning half the time
    "probe_aware_noise.py": {"determinism", "not_trivial"},
    "pause_switch_real_clock.py": {"determinism"},
    # difficulty levels (calibration trains at a chosen level): each level is replayed and no-op probed
    "level_noise.py": {"determinism"},
    "level_noop.py": {"not_trivial"},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_probe_sniffing_programs_are_rejected(mode):
    """Seed, probe-action and pause sniffing fail admission whatever isolation the pool has
    (the slow-call one is tested with its own budget in test_sandbox_admission)."""
    folder = Path(__file__).parents[1] / "hostile_admission"
    with _pool(MODES[mode], "guarded") as pool:
        reports = admit_batch([(folder / n).read_text() for n in PROBE_SNIFFERS], AdmissionConfig(), pool=pool)
    assert not any(r.admitted for r in reports), [r.reason for r in reports]
    assert all(r.stage in PROBE_SNIFFERS[n] for n, r in zip(PROBE_SNIFFERS, reports)), [r.reason for r in reports]
