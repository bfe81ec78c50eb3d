"""The package's layout: no module or package imports another in a circle, packages import
downwards only, the related systems are imported only by the side-system registry, workers
import no JAX."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_import_cycle_in_the_package():
    out = subprocess.run([sys.executable, "tools/import_cycles.py"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no import cycles" in out.stdout and "no package-level cycles" in out.stdout
    assert "every import follows the layers" in out.stdout
    assert "spade_jax.related is imported only by spade_jax.selfplay.components" in out.stdout


def _check_package(root: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    """`tools/import_cycles.py` over a `spade_jax` package of `files` (path -> source) under `root`;
    every folder gets an empty `__init__.py`."""
    for name, source in {"__init__.py": "", **files}.items():
        path = root / "spade_jax" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(source)
    return subprocess.run([sys.executable, str(REPO / "tools/import_cycles.py"), "--root", str(root)],
                          capture_output=True, text=True)


def test_the_cycle_check_finds_a_cycle(tmp_path):
    out = _check_package(tmp_path, {"a/x.py": "from spade_jax.a import y\n",
                                    "a/y.py": "def f():\n    from spade_jax.a import x\n"})
    assert out.returncode == 1 and "spade_jax.a.x" in out.stdout and "spade_jax.a.y" in out.stdout


def test_the_layer_check_finds_a_package_cycle_an_upward_import_and_an_unplaced_package(tmp_path):
    out = _check_package(tmp_path, {"models/x.py": "def f():\n    from spade_jax.selfplay import y\n",
                                    "models/z.py": "", "selfplay/y.py": "from spade_jax.models import z\n",
                                    "extras/__init__.py": ""})
    assert out.returncode == 1
    assert "no import cycles among" in out.stdout  # x -> y -> z: no cycle between modules...
    assert "package cycle 1: 2 packages: spade_jax.models, spade_jax.selfplay" in out.stdout  # ...but between packages
    assert "layer crossed: spade_jax/models/x.py:2: spade_jax.models (core) imports spade_jax.selfplay (run)" in out.stdout
    assert "spade_jax.extras is in no layer" in out.stdout


def test_the_join_check_finds_a_related_system_imported_outside_the_registry(tmp_path):
    out = _check_package(tmp_path, {"related/calibration/x.py": "from spade_jax.envs import contract\n",
                                    "related/procedures/y.py": "from spade_jax.related.calibration import x\n",
                                    "envs/contract.py": "",
                                    "selfplay/components/z.py": "from spade_jax.related.procedures import y\n",
                                    "selfplay/loop.py": "def f():\n    from spade_jax.related.calibration.x import g\n",
                                    "related/trajectories/run.py": "from spade_jax.selfplay import loop\n"})
    assert out.returncode == 1
    assert ("joined outside spade_jax.selfplay.components: spade_jax/selfplay/loop.py:2: spade_jax.selfplay.loop "
            "imports spade_jax.related.calibration.x") in out.stdout
    assert out.stdout.count("joined outside") == 1  # the registry and the related systems themselves may
    assert ("layer crossed: spade_jax/related/trajectories/run.py:1: spade_jax.related (related) imports "
            "spade_jax.selfplay (run)") in out.stdout


def test_environment_packages_import_without_jax():
    code = ("import sys; import spade_jax.envs.library, spade_jax.sandbox.worker, spade_jax.sandbox.host_start, "
            "spade_jax.text; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'numpy', 'flax')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
