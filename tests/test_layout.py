"""The package's layout: no module or package imports another in a circle, packages import
downwards only, workers import no JAX."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_no_import_cycle_in_the_package():
    out = subprocess.run([sys.executable, "tools/import_cycles.py"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no import cycles" in out.stdout and "no package-level cycles" in out.stdout
    assert "every import follows the layers" in out.stdout


def test_the_cycle_check_finds_a_cycle(tmp_path):
    package = tmp_path / "spade_jax"
    (package / "a").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a" / "__init__.py").write_text("")
    (package / "a" / "x.py").write_text("from spade_jax.a import y\n")
    (package / "a" / "y.py").write_text("def f():\n    from spade_jax.a import x\n")
    out = subprocess.run([sys.executable, str(REPO / "tools/import_cycles.py"), "--root", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "spade_jax.a.x" in out.stdout and "spade_jax.a.y" in out.stdout


def test_the_layer_check_finds_a_package_cycle_an_upward_import_and_an_unplaced_package(tmp_path):
    package = tmp_path / "spade_jax"
    for sub in ("models", "selfplay", "extras"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "models" / "x.py").write_text("def f():\n    from spade_jax.selfplay import y\n")
    (package / "models" / "z.py").write_text("")
    (package / "selfplay" / "y.py").write_text("from spade_jax.models import z\n")
    out = subprocess.run([sys.executable, str(REPO / "tools/import_cycles.py"), "--root", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "no import cycles among" in out.stdout  # x -> y -> z: no cycle between modules...
    assert "package cycle 1: 2 packages: spade_jax.models, spade_jax.selfplay" in out.stdout  # ...but between packages
    assert "layer crossed: spade_jax/models/x.py:2: spade_jax.models (core) imports spade_jax.selfplay (run)" in out.stdout
    assert "spade_jax.extras is in no layer" in out.stdout


def test_environment_packages_import_without_jax():
    code = ("import sys; import spade_jax.envs.library, spade_jax.sandbox.worker, spade_jax.sandbox.host_start; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'numpy', 'flax')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
