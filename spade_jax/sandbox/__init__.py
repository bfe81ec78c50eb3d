"""Sandbox: runs untrusted environment programs in isolated worker processes.

Generated code never runs in the trainer process nor in any process that imported JAX:
``SandboxPool`` starts a JAX-free host process (``host.py``) that forks one jailed worker
per episode (``isolation.py``, ``worker.py``) and checks everything the workers report
(``validate.py``). ``admission.py`` runs the staged admission of new programs on top.
Standard library (+ numpy in workers) only.
"""

from spade_jax.sandbox.isolation import IsolationUnavailable
from spade_jax.sandbox.pool import SandboxError, SandboxPool
from spade_jax.sandbox.records import EpisodeSpec, IsolationReport, SandboxConfig, SolutionResult, StepResult

__all__ = ["EpisodeSpec", "IsolationReport", "IsolationUnavailable", "SandboxConfig", "SandboxError",
           "SandboxPool", "SolutionResult", "StepResult"]
