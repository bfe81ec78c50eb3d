"""Logical axis names -> device mesh `(data, fsdp, tensor)`.

Every parameter carries a tuple of logical axis names (``logical_axes`` metadata on
its ``nnx.Param``). A rule table maps each logical name to zero or more mesh axes.
A mesh axis is dropped for a dimension it does not divide, so one rule table serves
every model size (SmolLM2's 9 heads stay unsharded on a tensor axis of 2, say).

Activations are constrained with `constrain(x, logical_axes)` inside jitted code;
it is a no-op unless `activation_sharding(mesh, rules)` is active.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

Rules = tuple[tuple[str, tuple[str, ...]], ...]

# The default layout, for training and sampling alike: parameters fully sharded over fsdp,
# tensor-parallel over heads/mlp/vocab. Decode is memory-bound, so sampling reads the
# parameters where training left them instead of gathering them into another layout.
TRAIN_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("vocab", ("tensor",)),
    ("embed", ("fsdp",)),
    ("mlp", ("tensor",)),
    ("heads", ("tensor",)),
    ("kv_heads", ("tensor",)),
    ("experts", ("fsdp",)),  # expert parallelism over fsdp: see models/moe.py
    ("head_dim", ()),
    ("length", ()),
    ("cache_length", ()),
)

_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    "spade_activation_sharding", default=None
)


def make_mesh(shape: Sequence[int] = (1, 1, 1), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `(data, fsdp, tensor)` mesh; -1 in one position takes the remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    shape = list(shape)
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"mesh shape must have {len(MESH_AXES)} entries {MESH_AXES}, got {shape}")
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {shape}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if len(devices) % known:
            raise ValueError(f"mesh {shape} does not fit {len(devices)} devices")
        shape[shape.index(-1)] = len(devices) // known
    if int(np.prod(shape)) != len(devices):
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} devices, "
            f"but {len(devices)} are available"
        )
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_to_spec(
    logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Rules
) -> PartitionSpec:
    """PartitionSpec for an array; mesh axes that do not divide a dimension are dropped."""
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, size in zip(logical_axes, shape):
        axes = []
        for axis in table.get(name, ()) if name else ():
            if axis in used or mesh.shape[axis] == 1:
                continue
            if size % (mesh.shape[axis] * int(np.prod([mesh.shape[a] for a in axes] or [1]))):
                continue
            axes.append(axis)
        used.update(axes)
        spec.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
    return PartitionSpec(*spec)


def param_shardings(state: nnx.State, mesh: Mesh, rules: Rules) -> nnx.State:
    """NamedShardings for an (abstract or concrete) parameter state, from `logical_axes` metadata."""

    def one(var):
        axes = var.get_metadata().get("logical_axes") or (None,) * len(var.shape)
        return var.replace(NamedSharding(mesh, logical_to_spec(axes, var.shape, mesh, rules)))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """Enables `constrain` for code traced inside this context."""
    token = _ACTIVE.set((mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_sharding() -> tuple[Mesh, Rules] | None:
    """The `(mesh, rules)` of the enclosing `activation_sharding`, or None outside one."""
    return _ACTIVE.get()


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Sharding constraint on an activation by logical axis names (no-op without a mesh)."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    spec = logical_to_spec(logical_axes, x.shape, mesh, rules)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
