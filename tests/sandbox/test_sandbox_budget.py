"""The sandbox's pool-wide budget: a pool cgroup (cgroups.py) and the fallback measurements (usage.py).

Real kernel behaviour throughout: children join a real cgroup and get OOM-killed, forks
fail at pids.max, files are really chowned and swept. Tests skip with the reason where
the machine does not allow them (no writable cgroups, not root).
"""

from __future__ import annotations

import builtins
import gc
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from spade_jax.sandbox import cgroups, isolation, usage
from spade_jax.sandbox.cgroups import PoolCgroup

# Wall-clock and process-count bounds: run alone, not beside other tests (tests/run.sh).
pytestmark = pytest.mark.serial

MB = 1 << 20
IS_ROOT = os.geteuid() == 0
TEST_UID = 61000 + os.getpid() % 1000
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (chown / setresuid to a test uid)")


# ---------------------------------------------------------------- helpers
def _make_pool(memory_bytes: int, max_processes: int) -> PoolCgroup:
    pool, why = PoolCgroup.create(memory_bytes, max_processes, f"spade-test-{os.getpid()}-{secrets.token_hex(3)}")
    if pool is None:
        pytest.skip(f"no writable pool cgroup here: {why}")
    return pool


@pytest.fixture
def pool64():
    pool = _make_pool(64 * MB, 64)
    yield pool
    assert pool.close(), pool.last_error


def _spawn(body, pool: PoolCgroup | None = None):
    """Forks a child that joins ``pool`` (through ``join``, then closes every pool fd) and runs
    ``body(report, wait)``: report(text) sends a line to the parent, wait() blocks until the
    parent calls go(). Returns (pid, read_lines, go)."""
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            gc.disable()
            os.close(report_r)
            os.close(go_w)
            if pool is not None:
                pool.join(os.getpid())
                for fd in pool.fds():
                    os.close(fd)
            body(lambda text: os.write(report_w, f"{text}\n".encode()), lambda: os.read(go_r, 1))
        except BaseException as err:  # noqa: BLE001 - reported through the exit code and the pipe
            try:
                os.write(report_w, f"error {type(err).__name__}: {err}\n".encode())
            except OSError:
                pass
            code = 3
        finally:
            os._exit(code)
    os.close(report_w)
    os.close(go_r)
    buffer = bytearray()

    def read_lines(until: str | None = None, timeout_s: float = 20.0) -> list[str]:
        """Lines so far; with ``until``, blocks until a line starting with it arrives (or EOF)."""
        deadline = time.monotonic() + timeout_s
        while True:
            lines = buffer.decode().splitlines()
            if until is not None and any(line.startswith(until) for line in lines):
                return lines
            remaining = 0.0 if until is None else deadline - time.monotonic()
            if until is not None and remaining <= 0:
                raise TimeoutError(f"no {until!r} from the child; got {lines}")
            ready, _, _ = select.select([report_r], [], [], remaining)
            if not ready:
                if until is None:
                    return lines
                continue
            chunk = os.read(report_r, 65536)
            if not chunk:
                return lines
            buffer.extend(chunk)

    def go() -> None:
        os.write(go_w, b"x")

    return pid, read_lines, go


def _wait(pid: int, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise TimeoutError(f"child {pid} did not finish in {timeout_s} s")


def _reap(pid: int) -> None:
    """Kills and reaps ``pid`` if a failed test left it behind."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _touch(size: int) -> bytearray:
    block = bytearray(size)
    block[::4096] = b"\1" * len(range(0, size, 4096))
    return block


def _gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


# ---------------------------------------------------------------- cgroups
def test_available_reports_a_reason():
    ok, line = cgroups.available()
    assert isinstance(ok, bool) and line and "\n" not in line
    print(f"\navailable(): {ok}, {line}")


def test_locate_decides_between_v1_and_v2():
    """The decision logic on the mount tables of other kinds of machines (v2 only, hybrid, none)."""
    v2_mounts = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    isdir = lambda path: True  # noqa: E731
    layout, why = cgroups.locate(v2_mounts, "0::/user.slice/app.scope\n", isdir)
    assert layout.version == 2 and layout.locations[0].path == "/sys/fs/cgroup/user.slice/app.scope", why
    hybrid = ("35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
              "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
              "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    layout, why = cgroups.locate(hybrid, "4:memory:/a/b\n8:pids:/\n0::/\n", isdir)
    assert layout.version == 1 and [loc.path for loc in layout.locations] == [
        "/sys/fs/cgroup/memory/a/b", "/sys/fs/cgroup/pids"], why
    comounted = "35 31 0:32 / /cg\\040x rw - cgroup cgroup rw,memory,pids\n"
    layout, why = cgroups.locate(comounted, "4:memory,pids:/job\n", isdir)
    assert layout.version == 1 and [loc.path for loc in layout.locations] == ["/cg x/job"], why
    container = "35 31 0:32 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    layout, why = cgroups.locate(container, "0::/docker/abc/inner\n", isdir)
    assert layout.locations[0].path == "/sys/fs/cgroup/inner", why
    assert cgroups.locate("", "0::/\n", isdir) == (None, "no cgroup filesystem is mounted")
    layout, why = cgroups.locate(hybrid.splitlines()[0] + "\n" + hybrid.splitlines()[2], "4:memory:/\n0::/\n", isdir)
    assert layout is None and "v1 and v2" in why


def test_create_degrades_with_a_reason_and_leaves_nothing():
    """Real refusals: a name already taken, cgroups remounted read-only, an unprivileged caller."""
    pool = _make_pool(64 * MB, 16)
    try:
        again, why = PoolCgroup.create(64 * MB, 16, pool.name)
        assert again is None and "already exists" in why
        assert all(os.path.isdir(p) for p in pool.paths)     # the failed create removed nothing of ours
    finally:
        assert pool.close(), pool.last_error
    if not IS_ROOT:
        return
    name = f"spade-test-{os.getpid()}-refused"

    def read_only(report, wait):
        isolation.unshare(isolation.CLONE_NEWNS)
        isolation.mount(None, "/", None, isolation.MS_REC | isolation.MS_PRIVATE)
        for parent in {os.path.dirname(p) for p in pool.paths}:
            isolation.mount(parent, parent, None, isolation.MS_BIND)
            isolation.mount(None, parent, None, isolation.MS_REMOUNT | isolation.MS_BIND | isolation.MS_RDONLY)
        report(f"readonly {PoolCgroup.create(64 * MB, 16, name)[1]}")

    def unprivileged(report, wait):
        os.setresuid(TEST_UID, TEST_UID, TEST_UID)
        report(f"unprivileged {PoolCgroup.create(64 * MB, 16, name)[1]}")

    reasons = {}
    for body in (read_only, unprivileged):
        pid, lines, _ = _spawn(body)
        assert _wait(pid) == 0, lines()
        reasons.update(line.split(" ", 1) for line in lines())
    print(f"\nread-only: {reasons['readonly']}\nunprivileged: {reasons['unprivileged']}")
    assert "read-only" in reasons["readonly"] and "permission denied" in reasons["unprivileged"]
    assert not any(os.path.exists(os.path.join(os.path.dirname(p), name)) for p in pool.paths)


def test_v2_path_on_this_machine_s_unified_hierarchy():
    """Drives the cgroup v2 code on the real unified hierarchy (the hybrid one here: it lacks
    memory and pids, so creation must refuse with the reason and leave nothing)."""
    with open("/proc/self/mountinfo") as f:
        v2_only = "".join(line for line in f if " - cgroup2 " in line)
    with open("/proc/self/cgroup") as f:
        unified = "".join(line for line in f if line.startswith("0::"))
    layout, why = cgroups.locate(v2_only, unified)
    if layout is None:
        pytest.skip(f"no cgroup v2 hierarchy here: {why}")
    name = f"spade-test-{os.getpid()}-v2"
    pool, why = PoolCgroup._create_v2(layout, 64 * MB, 16, name)
    print(f"\nv2 on {layout.locations[0].path}: {pool.describe() if pool else why}")
    if pool is None:
        assert why and "\n" not in why
    else:
        assert pool.version == 2 and len(pool.paths) == 1 and pool.memory_bytes() == 0
        assert pool.close(), pool.last_error
    assert not os.path.exists(os.path.join(layout.locations[0].path, name))


def test_oom_kill_past_the_limit_and_oom_kills_rises(pool64):
    before = pool64.oom_kills()

    def allocate(report, wait):
        chunks = []
        for i in range(200):
            chunks.append(_touch(MB))
            report(f"mb {i + 1}")

    pid, lines, _ = _spawn(allocate, pool64)
    status = _wait(pid)
    reached = [line for line in lines() if line.startswith("mb ")]
    print(f"\nanon: killed after {len(reached)} MB of 200 touched; oom_kills {before} -> {pool64.oom_kills()}")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (status, lines()[-3:])
    assert len(reached) < 64
    assert pool64.oom_kills() >= before + 1
    assert pool64.pids() == []


def test_child_under_the_limit_lives_and_is_measured(pool64):
    def allocate(report, wait):
        block = _touch(20 * MB)
        report("ready")
        wait()
        del block

    pid, lines, go = _spawn(allocate, pool64)
    lines("ready")
    used, members, count = pool64.memory_bytes(), pool64.pids(), pool64.processes()
    go()
    status = _wait(pid)
    print(f"\n20 MB child: pool memory_bytes {used / MB:.1f} MB, processes {count}")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, lines()
    assert members == [pid] and count == 1
    assert 20 * MB <= used < 40 * MB
    assert pool64.oom_kills() == 0


def test_memfd_pages_count_against_the_pool(pool64):
    def fill(report, wait):
        fd = os.memfd_create("budget-test")
        chunk = b"\1" * MB
        for i in range(200):
            os.write(fd, chunk)
            report(f"mb {i + 1}")

    pid, lines, _ = _spawn(fill, pool64)
    status = _wait(pid)
    reached = [line for line in lines() if line.startswith("mb ")]
    print(f"\nmemfd: killed after {len(reached)} MB of 200 written; oom_kills {pool64.oom_kills()}")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (status, lines()[-3:])
    assert len(reached) < 64
    assert pool64.oom_kills() >= 1


def test_pids_max_stops_forks_inside_the_pool():
    pool = _make_pool(256 * MB, 5)
    try:
        def fork_ten(report, wait):
            for i in range(10):
                try:
                    child = os.fork()
                except OSError as err:
                    report(f"fork {i + 1} {type(err).__name__}")
                    continue
                if child == 0:
                    try:
                        signal.pause()
                    finally:
                        os._exit(0)
                report(f"fork {i + 1} ok")
            report("done")
            wait()

        pid, lines, _ = _spawn(fork_ten, pool)
        outcomes = [line.split()[2] for line in lines("done") if line.startswith("fork")]
        count = pool.processes()
        print(f"\npids.max 5: fork outcomes {outcomes}, pids.current {count}")
        assert outcomes == ["ok"] * 4 + ["BlockingIOError"] * 6
        assert count == 5 and len(pool.pids()) == 5
        assert pool.kill_all(5.0) and pool.pids() == []
        assert os.WTERMSIG(_wait(pid)) == signal.SIGKILL
        # pids.current drops only once the killed grandchildren are reaped (by init here).
        deadline, t0 = time.monotonic() + 5, time.monotonic()
        while pool.processes() and time.monotonic() < deadline:
            time.sleep(0.005)
        print(f"pids.current back to {pool.processes()} {1000 * (time.monotonic() - t0):.0f} ms after kill_all")
        assert pool.processes() == 0
    finally:
        assert pool.close(), pool.last_error


def test_close_kills_stragglers_and_leaves_nothing():
    pool = _make_pool(64 * MB, 16)
    paths = pool.paths

    def straggle(report, wait):
        grandchild = os.fork()
        if grandchild == 0:
            os.setsid()
            signal.pause()
            os._exit(0)
        report(f"grandchild {grandchild}")
        wait()

    pid, lines, _ = _spawn(straggle, pool)
    grandchild = int(lines("grandchild")[0].split()[1])
    assert sorted(pool.pids()) == sorted([pid, grandchild])
    t0 = time.monotonic()
    assert pool.close(), pool.last_error
    took = time.monotonic() - t0
    print(f"\nclose(): killed 2 members and removed {len(paths)} directories in {took * 1000:.0f} ms")
    assert not any(os.path.exists(p) for p in paths)
    assert os.WTERMSIG(_wait(pid)) == signal.SIGKILL
    deadline = time.monotonic() + 5
    while not _gone_or_zombie(grandchild) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone_or_zombie(grandchild)
    assert pool.close()  # idempotent
    with pytest.raises(ValueError):
        pool.memory_bytes()


def test_works_without_sys_and_proc_after_create(tmp_path):
    """A child hides /sys and /proc (tmpfs over both in its own mount namespace), like the
    host after pivot_root, then drives the pool it inherited: every access goes through fds."""
    if not IS_ROOT:
        pytest.skip("needs root to make a mount namespace")
    pool = _make_pool(64 * MB, 16)
    paths = pool.paths

    def blind(report, wait):
        isolation.unshare(isolation.CLONE_NEWNS)
        isolation.mount(None, "/", None, isolation.MS_REC | isolation.MS_PRIVATE)
        isolation.mount("tmpfs", "/sys", "tmpfs", 0, "size=64k")
        isolation.mount("tmpfs", "/proc", "tmpfs", 0, "size=64k")
        assert not os.path.exists(paths[0]) and not os.path.exists("/proc/self")
        member_r, member_w = os.pipe()
        member = os.fork()
        if member == 0:
            pool.join(os.getpid())
            keep = _touch(8 * MB)  # noqa: F841 - stays mapped while the member lives
            os.write(member_w, b"x")
            signal.pause()
            os._exit(0)
        os.read(member_r, 1)
        assert pool.pids() == [member], pool.pids()
        assert pool.processes() == 1 and pool.memory_bytes() >= 8 * MB and pool.oom_kills() == 0
        assert pool.describe().startswith(f"cgroup v{pool.version}")
        assert pool.close(), pool.last_error
        _, status = os.waitpid(member, 0)
        assert os.WTERMSIG(status) == signal.SIGKILL
        report("closed")

    pid, lines, _ = _spawn(blind)
    status = _wait(pid)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, lines()
    assert "closed" in lines()
    assert not any(os.path.exists(p) for p in paths)
    assert pool.close()  # the parent's copy: already removed by the child, nothing left to do


def test_every_access_after_create_passes_dir_fd(tmp_path, monkeypatch):
    """Path-based calls are refused after create(): only dir_fd-relative ones (or fds) get through."""
    pool = _make_pool(64 * MB, 16)
    pid, _, _ = _spawn(lambda report, wait: wait())
    calls = []

    def guard(real):
        def call(path, *args, dir_fd=None, **kwargs):
            calls.append(real.__name__)
            if dir_fd is None and not isinstance(path, int):
                raise AssertionError(f"{real.__name__}({path!r}) without dir_fd after create()")
            return real(path, *args, dir_fd=dir_fd, **kwargs) if dir_fd is not None else real(path, *args, **kwargs)
        return call

    def no_open(*args, **kwargs):
        raise AssertionError(f"open{args} after create()")

    monkeypatch.chdir(tmp_path)
    try:
        with monkeypatch.context() as patch:
            for name in ("open", "stat", "rmdir", "mkdir", "unlink", "scandir", "listdir"):
                patch.setattr(os, name, guard(getattr(os, name)))
            patch.setattr(builtins, "open", no_open)
            pool.join(pid)
            assert pool.pids() == [pid]
            pool.memory_bytes(), pool.oom_kills(), pool.processes(), pool.describe()
            assert pool.close(), pool.last_error
        assert "open" in calls and "rmdir" in calls
        assert os.WTERMSIG(_wait(pid)) == signal.SIGKILL
    finally:
        _reap(pid)
        pool.close()


# ---------------------------------------------------------------- usage
def test_rss_of_a_child_then_none_when_gone():
    def allocate(report, wait):
        block = _touch(50 * MB)
        report("ready")
        wait()
        del block

    pid, lines, go = _spawn(allocate)
    lines("ready")
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        rss, rss_fd = usage.rss_bytes(pid), usage.rss_bytes(pid, proc_fd)
        go()
        _wait(pid)
        print(f"\n50 MB child: rss {rss / MB:.1f} MB")
        assert rss >= 50 * MB and rss_fd >= 50 * MB
        assert usage.rss_bytes(pid) is None and usage.rss_bytes(pid, proc_fd) is None
    finally:
        os.close(proc_fd)


def test_tree_usage_counts_blocks_and_truncates(tmp_path):
    root = tmp_path / "tree"
    payload = os.urandom(64 * 1024)
    for d in range(10):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(10):
            (root / f"d{d}" / f"f{f}").write_bytes(payload)
    os.symlink("/", root / "escape")                 # never followed
    os.link(root / "d0" / "f0", root / "hardlink")   # one inode, counted once
    used, entries, truncated = usage.tree_usage(str(root), 10_000)
    print(f"\n100 x 64 KB: {used / 1024:.0f} KB in {entries} entries")
    assert entries == 100 + 10 + 2 and not truncated
    assert 100 * 64 * 1024 <= used < 100 * 64 * 1024 + 512 * 1024
    assert usage.tree_usage(str(root), 112) == (used, 112, False)
    used50, entries50, truncated50 = usage.tree_usage(str(root), 50)
    assert entries50 == 50 and truncated50 and used50 < used
    deep = tmp_path / "deep"
    os.makedirs(deep / "/".join(["d"] * 200))     # deeper than the fds the walk keeps open
    assert usage.tree_usage(str(deep), 10_000)[1:] == (200, False)


@needs_root
def test_sweep_owned_removes_only_the_uid_s_entries(tmp_path):
    shared, outside = tmp_path / "shared", tmp_path / "outside"
    shared.mkdir()
    outside.mkdir()
    (outside / "precious").write_text("x")
    os.chown(outside / "precious", TEST_UID, TEST_UID)

    def own(path):
        os.lchown(path, TEST_UID, TEST_UID)
        return str(path)

    (shared / "file").write_text("x")
    mine = [own(shared / "file")]
    os.mkfifo(shared / "fifo")
    mine.append(own(shared / "fifo"))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(shared / "sock"))
    sock.close()
    mine.append(own(shared / "sock"))
    os.symlink(outside, shared / "link")
    mine.append(own(shared / "link"))
    (shared / "mydir" / "sub").mkdir(parents=True)
    (shared / "mydir" / "sub" / "data").write_text("x")
    mine += [own(shared / "mydir" / "sub" / "data"), own(shared / "mydir" / "sub"), own(shared / "mydir")]
    deep = shared / "/".join(["d"] * 100)
    os.makedirs(deep)
    for level in range(1, 101):  # world-writable all the way down: the uid could have written there
        (shared / "/".join(["d"] * level)).chmod(0o1777)
    (deep / "leaf").write_text("x")
    mine.append(own(deep / "leaf"))
    (shared / "closed").mkdir(mode=0o755)  # root's, not writable by the uid: not searched
    (shared / "closed" / "planted").write_text("x")
    os.chown(shared / "closed" / "planted", TEST_UID, TEST_UID)
    (shared / "mixed").mkdir()
    own(shared / "mixed")
    (shared / "mixed" / "roots").write_text("keep")
    (shared / "rootfile").write_text("keep")
    os.symlink(outside, shared / "rootlink")

    removed = usage.sweep_owned([str(shared)], {TEST_UID})
    print(f"\nsweep_owned removed {len(removed)} entries")
    assert sorted(removed) == sorted(mine)
    assert not any(os.path.lexists(p) for p in mine)
    assert (outside / "precious").exists()                    # the symlink was not followed
    assert (shared / "mixed" / "roots").exists()              # someone else's file: kept, so is its dir
    assert (shared / "rootfile").exists() and (shared / "rootlink").is_symlink()
    assert (shared / "closed" / "planted").exists()  # the uid could not have put it there
    assert os.path.isdir(deep)                                # root's directories stay
    assert usage.sweep_owned([str(shared), str(tmp_path / "missing")], {TEST_UID}) == []


def test_budget_modules_stay_jax_and_numpy_free():
    code = ("import sys, spade_jax.sandbox.cgroups, spade_jax.sandbox.usage; "
            "print([m for m in ('jax', 'numpy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
