"""launch/*.sh: --help answers without side effects; own options read as --opt=value or --opt value.
tests/run.sh and .ci/run: which stack and which tests each runs.

Runs the scripts with bash in their dry-run modes, or with a fake python that records its
arguments, so nothing is installed and no job starts.
"""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
SCRIPTS = ["gpu.sh", "multiprocess_cpu.sh", "run_local.sh", "setup_env.sh", "tpu_pod.sh"]


def launch(script, *args, env=None, cwd=None):
    script = script if "/" in script else LAUNCH / script
    return subprocess.run(["bash", str(script), *args], cwd=cwd or REPO, env=env or os.environ,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def no_venv_env(tmp_path):
    """An environment in which reaching setup_env.sh fails (PYTHON=false) and a venv would show."""
    env = dict(os.environ, PYTHON="false", SPADE_VENV=str(tmp_path / "venv"))
    env.pop("SPADE_PYTHON", None)
    return env


@pytest.fixture
def fake_python(tmp_path):
    """A python that runs `-c` snippets for real and otherwise records its argv (one JSON line a call)."""
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "fakevenv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    record = ("import json, os, sys; open(os.environ['FAKE_LOG'], 'a').write(json.dumps("
              "{'argv': sys.argv[1:], 'process': os.environ.get('SPADE_PROCESS_ID'), "
              "'num': os.environ.get('SPADE_NUM_PROCESSES')}) + '\\n'); "
              "sys.exit(os.environ.get('FAKE_FAIL', '-') in sys.argv)")  # fails when an argument is FAKE_FAIL
    fake.write_text(f'#!/usr/bin/env bash\nif [[ "${{1:-}}" == -c ]]; then exec {sys.executable} "$@"; fi\n'
                    f'exec {sys.executable} -c "{record}" "$@"\n')
    fake.chmod(0o755)
    env = dict(os.environ, FAKE_LOG=str(log), SPADE_VENV=str(fake.parent.parent), SPADE_PYTHON=str(fake),
               PYTHON="true",  # passes setup_env.sh's version check whatever python runs the tests
               SPADE_LOG_DIR=str(tmp_path))

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return env, calls


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_does_nothing_else(script, flag, no_venv_env, tmp_path):
    proc = launch(script, flag, env=no_venv_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: bash launch/{script}"), proc.stdout
    assert "--help" in proc.stdout and proc.stderr == ""
    if script != "setup_env.sh":
        assert "goes to `python -m spade_jax.main`" in proc.stdout.replace("\n", " ")
    assert not (tmp_path / "venv").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script,args", [
    ("gpu.sh", ["--nodes", "2", "--help"]),
    ("tpu_pod.sh", ["--name", "x", "--help", "--zone=z"]),
    ("multiprocess_cpu.sh", ["2", "--config=configs/tiny.py", "--help"]),
    ("run_local.sh", ["--workdir", "/tmp/x", "--help"]),
    ("setup_env.sh", ["--test", "--help"]),
])
def test_help_among_other_options(script, args, no_venv_env, tmp_path):
    proc = launch(script, *args, env=no_venv_env)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr
    assert not (tmp_path / "venv").exists()


def test_help_documents_each_option_and_its_default():
    gpu = launch("gpu.sh", "--help").stdout
    for text in ("--nodes N", "default 1", "--node_rank R", "default 0", "--coordinator H:P", "--slurm", "--dry-run",
                 "SPADE_JAX_EXTRA"):
        assert text in gpu
    tpu = launch("tpu_pod.sh", "--help").stdout
    for text in ("--name NAME", "--zone ZONE", "--accelerator TYPE", "default tpu-ubuntu2204-base", "--project P",
                 "--spot", "--model_bucket URL", "--workdir DIR", "~/spade_runs/<name>", "--dry-run"):
        assert text in tpu
    mp = launch("multiprocess_cpu.sh", "--help").stdout
    for text in ("NUM_PROCESSES", "SPADE_DEVICES_PER_PROCESS", "(default 1)", "SPADE_LOG_DIR", "(default /tmp)"):
        assert text in mp
    assert "--workdir=workdirs/tiny" in launch("run_local.sh", "--help").stdout
    setup = launch("setup_env.sh", "--help").stdout
    for text in ("--test", "--stack S", "default latest", ".venv-pinned", "python3.12"):
        assert text in setup
    for script in ("gpu.sh", "tpu_pod.sh"):
        assert "--stack S" in launch(script, "--help").stdout


GPU_MAIN = ["--", "--config=configs/qwen3_0p6b.py", "--config.rl.lr", "1e-5", "--workdir=runs/q"]


def test_gpu_options_in_both_spellings():
    eq = launch("gpu.sh", "--dry-run", "--nodes=2", "--node_rank=1", "--coordinator=10.0.0.1:4321", *GPU_MAIN)
    sp = launch("gpu.sh", "--dry-run", "--nodes", "2", "--node_rank", "1", "--coordinator", "10.0.0.1:4321", *GPU_MAIN)
    assert eq.returncode == sp.returncode == 0, (eq.stderr, sp.stderr)
    assert eq.stdout == sp.stdout
    job = eq.stdout.splitlines()[-1]
    assert job.startswith("env SPADE_COORDINATOR=10.0.0.1:4321 SPADE_NUM_PROCESSES=2 SPADE_PROCESS_ID=1 ")
    assert job.endswith("-m spade_jax.main --config=configs/qwen3_0p6b.py --config.rl.lr 1e-5 --workdir=runs/q ")
    single = launch("gpu.sh", "--dry-run", *GPU_MAIN)
    assert single.stdout.splitlines()[-1].endswith("/.venv/bin/python -m spade_jax.main "
                                                   "--config=configs/qwen3_0p6b.py --config.rl.lr 1e-5 --workdir=runs/q ")
    slurm = launch("gpu.sh", "--slurm", "--dry-run", "--", "--help")  # after -- even --help is spade_jax.main's
    assert slurm.returncode == 0 and slurm.stdout.splitlines()[-1].startswith("env SPADE_DISTRIBUTED=auto ")
    assert slurm.stdout.splitlines()[-1].endswith("-m spade_jax.main --help ")


@pytest.mark.parametrize("args,message", [
    (["--nodes=2", "--dry-run"], "needs --coordinator"),
    (["--nodes", "2", "--dry-run"], "needs --coordinator"),
    (["--dry-run", "--coordinator"], "--coordinator needs a value"),
    (["--nodes", "--dry-run"], "--nodes needs a value"),
    (["--dry-run", "--config=x"], "unknown option --config=x"),
    (["--dry-run", "--nodes_rank", "1"], "unknown option --nodes_rank"),
])
def test_gpu_refusals(args, message):
    proc = launch("gpu.sh", *args)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""


TPU_MAIN = ["--", "--config=configs/qwen3_4b.py", "--config.rl.lr", "1e-5"]


def test_tpu_pod_options_in_both_spellings():
    opts = {"name": "spade-v4", "zone": "us-central2-b", "accelerator": "v4-32", "version": "v2-alpha",
            "project": "proj", "model_bucket": "gs://bucket/Qwen3-4B", "workdir": "gs://bucket/runs/x"}
    eq = launch("tpu_pod.sh", "--dry-run", "--spot", *(f"--{k}={v}" for k, v in opts.items()), *TPU_MAIN)
    sp = launch("tpu_pod.sh", "--dry-run", "--spot", *(a for k, v in opts.items() for a in (f"--{k}", v)), *TPU_MAIN)
    assert eq.returncode == sp.returncode == 0, (eq.stderr, sp.stderr)
    assert eq.stdout == sp.stdout
    lines = eq.stdout.splitlines()
    assert lines[0] == ("gcloud compute tpus tpu-vm create spade-v4 --zone=us-central2-b --project=proj "
                        "--accelerator-type=v4-32 --version=v2-alpha --spot ")
    assert "gs://bucket/Qwen3-4B/\\*" in lines[3]
    job = lines[4]
    assert "spade_jax.main\\ --config=configs/qwen3_4b.py\\ --config.rl.lr\\ 1e-5\\ --workdir=gs://bucket/runs/x" \
           "\\ --config.model.path=../model\\ " in job
    assert lines[-1].startswith("started on all workers of spade-v4")


def test_tpu_pod_defaults_and_forwarded_help():
    proc = launch("tpu_pod.sh", "--name", "p", "--zone", "z", "--accelerator", "v4-8", "--dry-run", "--", "--help")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "gcloud compute tpus tpu-vm create p --zone=z --accelerator-type=v4-8 --version=tpu-ubuntu2204-base "
    assert "spade_jax.main\\ --help\\ --workdir=../spade_runs/p\\ \\>" in lines[4]
    assert "model" not in lines[3]


@pytest.mark.parametrize("args,message", [
    (["--name", "p", "--zone", "z", "--dry-run"], "are required"),
    (["--name", "--zone=z", "--accelerator=v4-8", "--dry-run"], "--name needs a value"),
    (["--name=p", "--zone=z", "--accelerator"], "--accelerator needs a value"),
    (["--name=p", "--zone=z", "--accelerator=v4-8", "--dry-run", "--config=x"], "unknown option --config=x"),
    (["--name=p", "--zone=z", "--accelerator=v4-8", "--dry-run", "--spot=1"], "unknown option --spot=1"),
])
def test_tpu_pod_refusals(args, message):
    proc = launch("tpu_pod.sh", *args)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""


def test_multiprocess_forwards_flags_to_every_process(fake_python):
    env, calls = fake_python
    flags = ["--config=configs/tiny.py:runlocal", "--workdir", "/tmp/mp", "--config.rl.lr=1e-5"]
    proc = launch("multiprocess_cpu.sh", "2", *flags, env=env)
    assert proc.returncode == 0, proc.stderr
    got = sorted(calls(), key=lambda c: c["process"])
    assert [(c["process"], c["num"], c["argv"]) for c in got] == [
        ("0", "2", ["-m", "spade_jax.main", *flags]), ("1", "2", ["-m", "spade_jax.main", *flags])]


@pytest.mark.parametrize("num", [[], ["0"], ["two"], ["--config=configs/tiny.py"]])
def test_multiprocess_needs_a_process_count(num, fake_python):
    env, calls = fake_python
    proc = launch("multiprocess_cpu.sh", *num, env=env)
    assert proc.returncode == 2 and "NUM_PROCESSES" in proc.stderr
    assert calls() == []


@pytest.mark.parametrize("args,workdir", [
    ([], ["--workdir=workdirs/tiny"]),
    (["--workdir=/tmp/a"], []),
    (["--workdir", "/tmp/a"], []),
])
def test_run_local_forwards_flags_and_defaults_the_workdir(args, workdir, fake_python):
    env, calls = fake_python  # setup_env.sh's pip installs go to the fake python too
    flags = ["--config=configs/tiny.py:runlocal", *args, "--config.rl.lr", "1e-5"]
    proc = launch("run_local.sh", *flags, env=env)
    assert proc.returncode == 0, proc.stderr
    assert calls()[-1]["argv"] == ["-m", "spade_jax.main", *flags, *workdir]
    assert all(c["argv"][:2] == ["-m", "pip"] for c in calls()[:-1])


def pinned_jax(stack: str) -> str:
    name = "requirements-pinned.txt" if stack == "pinned" else "requirements.txt"
    [version] = [line[len("jax=="):] for line in (REPO / name).read_text().splitlines() if line.startswith("jax==")]
    return version


def test_the_latest_stack_pins_the_same_packages_and_a_newer_jax():
    def names(path):
        lines = (REPO / path).read_text().splitlines()
        return {line.split("==")[0].lower() for line in lines if line and not line.startswith(("#", "-r"))}
    moved = {"gymnax"}  # declares jax<0.12: --no-deps in requirements-nodeps.txt, its deps pinned instead
    assert names("requirements.txt") == names("requirements-pinned.txt") - moved | {"gymnasium", "seaborn"}
    assert names("requirements-nodeps.txt") == names("requirements-nodeps-pinned.txt") | moved
    assert names("requirements-test.txt") == names("requirements-test-pinned.txt")
    as_tuple = lambda v: tuple(int(part) for part in v.split("."))  # noqa: E731
    assert as_tuple(pinned_jax("latest")) > as_tuple(pinned_jax("pinned"))


@pytest.mark.parametrize("stack,suffix", [("pinned", "-pinned"), ("latest", "")])
def test_setup_env_installs_the_stacks_files_once(stack, suffix, fake_python):
    env, calls = fake_python
    for _ in range(2):  # the second run finds both stamps current and installs nothing
        proc = launch("setup_env.sh", "--test", "--stack", stack, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == env["SPADE_PYTHON"]
    installed = [c["argv"][c["argv"].index("install"):] for c in calls()]
    r = lambda name: str(REPO / name)  # noqa: E731
    assert [args[-2:] for args in installed] == [
        ["-r", r(f"requirements{suffix}.txt")], ["-r", r(f"requirements-nodeps{suffix}.txt")], ["-e", str(REPO)],
        ["-r", r(f"requirements-test{suffix}.txt")]]
    assert ["--no-deps" in args for args in installed] == [False, True, True, False]


@pytest.mark.parametrize("args,code,message", [
    (["--stack=newest"], 2, "--stack must be pinned or latest"),
    (["--stack"], 2, "--stack needs a value"),
    (["--test"], 1, "latest stack needs Python >= 3.12 (found: no false)"),
    (["--test"], 1, "or use the compatibility stack on Python >= 3.11: --stack=pinned"),
    (["--stack=pinned"], 1, "pinned stack needs Python >= 3.11 (found: no false)"),
])
def test_setup_env_refusals(args, code, message, no_venv_env, tmp_path):
    proc = launch("setup_env.sh", *args, env=no_venv_env)
    assert proc.returncode == code and message in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("stack", ["pinned", "latest"])
def test_gpu_installs_the_cuda_jax_of_its_stack(stack):
    proc = launch("gpu.sh", "--dry-run", f"--stack={stack}", *GPU_MAIN)
    assert proc.returncode == 0, proc.stderr
    venv = ".venv-pinned" if stack == "pinned" else ".venv"
    setup, job = proc.stdout.splitlines()
    assert setup == (f"bash {LAUNCH}/setup_env.sh --stack={stack} && {REPO}/{venv}/bin/python -m pip install "
                     f"'jax[cuda13]=={pinned_jax(stack)}'")
    assert job.startswith(f"{REPO}/{venv}/bin/python -m spade_jax.main ")


@pytest.mark.parametrize("stack,python,suffix", [("pinned", "python3.11", "-pinned"), ("latest", "python3.12", "")])
def test_tpu_pod_installs_the_tpu_jax_of_its_stack(stack, python, suffix):
    proc = launch("tpu_pod.sh", "--name=p", "--zone=z", "--accelerator=v4-8", "--dry-run", "--stack", stack)
    assert proc.returncode == 0, proc.stderr
    setup = proc.stdout.splitlines()[3].replace("\\", "")
    # The stack's python (TPU images ship 3.10) is installed with its venv module before the venv is made.
    guard = (f"{{ {python} -c 'import ensurepip' 2>/dev/null || {{ sudo add-apt-repository -y ppa:deadsnakes/ppa "
             f"&& sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {python}-venv; }}; }}")
    assert guard in setup and setup.index(guard) < setup.index(f"&& {python} -m venv .venv ")
    remote = next(a for a in shlex.split(proc.stdout.splitlines()[3]) if a.startswith("--command="))
    assert subprocess.run(["bash", "-n", "-c", remote.removeprefix("--command=")]).returncode == 0
    for text in (f"install -q -r requirements{suffix}.txt 'jax[tpu]=={pinned_jax(stack)}'",
                 f"--no-deps -r requirements-nodeps{suffix}.txt "):
        assert text in setup


@pytest.mark.parametrize("script,args", [("gpu.sh", []), ("tpu_pod.sh", ["--name=p", "--zone=z", "--accelerator=v4-8"])])
def test_launchers_refuse_an_unknown_stack(script, args):
    proc = launch(script, *args, "--dry-run", "--stack=newest")
    assert proc.returncode == 2 and "--stack must be pinned or latest" in proc.stderr and proc.stdout == ""


def compat_subset() -> list[str]:
    """tests/run.sh's COMPAT list."""
    text = (REPO / "tests" / "run.sh").read_text()
    return text.split("COMPAT=(", 1)[1].split(")", 1)[0].split()


def test_the_compat_subset_names_existing_tests():
    for node in compat_subset():
        path, _, name = node.partition("::")
        assert (REPO / path).is_file(), node
        assert not name or f"def {name}(" in (REPO / path).read_text(), node


@pytest.mark.parametrize("fail", ["-", "not serial", "tests/rl/test_losses.py"])
def test_ci_runs_the_default_suite_then_the_pinned_compat_subset_and_fails_if_either_does(fail, fake_python):
    env, calls = fake_python
    proc = launch(str(REPO / ".ci" / "run"), env=dict(env, FAKE_FAIL=fail))
    assert proc.returncode == (fail != "-"), proc.stderr
    runs = [c["argv"][2:] for c in calls() if c["argv"][:2] == ["-m", "pytest"]]
    markers = [run[run.index("-m") + 1] if "-m" in run else None for run in runs]
    assert markers == ["not serial", "serial", None]  # the whole suite on the default stack, then the subset
    assert runs[-1][-len(compat_subset()):] == compat_subset()
    installs = [arg for c in calls() if c["argv"][:2] == ["-m", "pip"] for arg in c["argv"] if arg.endswith(".txt")]
    assert any(arg.endswith("/requirements.txt") for arg in installs)
    assert any(arg.endswith("/requirements-pinned.txt") for arg in installs)
