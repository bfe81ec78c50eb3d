"""The seed library and the sandbox examples pass every admission stage whatever the admission's seeds.

Not among the serial tests (`tests/admission/test_sandbox_admission.py`): it bounds no wall clock, so it
runs with the default sandbox timeouts beside the other tests.
"""

from pathlib import Path

from spade_jax.admission import AdmissionConfig, admit_batch
from spade_jax.envs import library
from spade_jax.sandbox import SandboxConfig, SandboxPool

EXAMPLES = Path(__file__).parents[1] / "sandbox_examples"


def test_seed_library_and_examples_pass_every_stage_under_several_admission_seeds():
    names = [env.name for env in library.SEED_ENVS]
    texts = [library.load_source(n) for n in names]
    texts += [(EXAMPLES / f).read_text() for f in ("boxed_game.py", "tool_env.py")]
    names += ["boxed_game", "tool_env"]
    copies = 3  # each copy is probed with its own seeds and actions (so the batch holds duplicates)
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        reports = admit_batch(texts * copies, AdmissionConfig(batch_novelty=False), pool=pool)
    seed = reports[0].details["admission_seed"]
    failures = [(name, r.stage, r.reason) for name, r in zip(names * copies, reports) if not r.admitted]
    assert not failures, f"admission seed {seed}: {failures}"
    contract_seeds = {tuple(r.details["probe_seeds"]["contract"]) for r in reports}
    assert len(contract_seeds) == len(reports)
