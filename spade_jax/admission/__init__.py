"""Admission: whether a program the designer wrote may enter the pool.

``stages.py`` runs the eight stages (parse, load, contract, determinism, not_trivial,
feasibility, blind, novelty; `admit` for one program, `admit_batch` for many at once);
``probes.py`` draws the actions they play; ``similarity.py`` finds near-duplicates for the
novelty stage; ``python -m spade_jax.admission FILE`` admits one program from the command line.

Admission judges programs; isolation (`spade_jax.sandbox`) runs them. Every play goes through a
`SandboxPool`, and the parse stage applies the sandbox's import policy (`sandbox.policy`, which
workers enforce at run time too); the sandbox imports nothing of this package.
"""

from spade_jax.admission.stages import (NOVELTY_MODES, STAGES, AdmissionConfig, AdmissionReport, admit, admit_batch,
                                        blind_verdict)

__all__ = ["NOVELTY_MODES", "STAGES", "AdmissionConfig", "AdmissionReport", "admit", "admit_batch", "blind_verdict"]
