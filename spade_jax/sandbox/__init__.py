"""Sandbox: runs untrusted environment programs (written by the designer model) in jailed processes.

The chain, from the trusted side inwards:

* trainer: holds a ``SandboxPool`` (``pool.py``), the client. It never runs environment
  code and talks in frames (``protocol.py``) to
* the host, a JAX-free supervisor process. Its start-up (``host_start.py``) decides the
  isolation plan (``isolation.py``) and enters namespaces and a private root; its event
  loop (``host.py``) keeps the pool's memory and process budget (a cgroup, ``cgroups.py``,
  else its own measurements, ``usage.py``), enforces deadlines, and checks every message
  workers send (``validate.py``; ``spade_jax/text.py``) before anything goes back. It forks
* the zygote (``zygote.py``), a clean preloaded template that never sees a config or a
  request, which forks
* one worker per episode (``worker.py``), which runs the program it was sent (and nothing
  else reaches it) inside the jail: init of its own PID namespace, its own mount, network
  and IPC namespaces, a size-limited scratch tmpfs, rlimits, its own uid (or no
  capabilities), Landlock (``landlock.py``), then a seccomp filter (``seccomp.py``).

Each layer is applied where the kernel grants it; ``IsolationReport`` says which are in
force (``isolation="strict"`` refuses to start without all of them). On top: ``policy.py``
(the import policy, checked statically before a program is sent and enforced by workers) and
``play.py`` (a command line that plays one program). Which programs are worth running is
admission's question (`spade_jax.admission`, a package above this one). Standard library (+
numpy in workers) only.
"""

from spade_jax.sandbox.isolation import IsolationUnavailable
from spade_jax.sandbox.pool import SandboxError, SandboxPool
from spade_jax.sandbox.records import EpisodeSpec, IsolationReport, SandboxConfig, SolutionResult, StepResult

__all__ = ["EpisodeSpec", "IsolationReport", "IsolationUnavailable", "SandboxConfig", "SandboxError",
           "SandboxPool", "SolutionResult", "StepResult"]
