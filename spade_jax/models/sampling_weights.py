"""The weights the samplers read: the master parameters, or a copy of them in a narrower dtype.

Every decode step reads every weight, so decoding is bound by the bytes it reads. With float32
masters a step reads 4 bytes per parameter (and casts them to the compute dtype at use); a
bfloat16 copy, cast once after each update (`SamplingWeights.refresh`), halves that; the
trainer frees it while it updates (`release`), so it costs memory only while sampling. Only the
matrices (ndim >= 2) are cast: the model casts them to its compute dtype at use anyway, so with a
bfloat16 compute dtype the copy leaves the sampler's arithmetic unchanged. The 1-D norm scales,
which the model reads in float32, keep the masters' precision. The copy is sharded like the
masters. "auto" is bfloat16 on GPU and TPU and the masters themselves on CPU, where XLA:CPU's
bfloat16 attention was measured 10x slower.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from spade_jax.models.policy import Policy

SAMPLING_DTYPES = ("auto", "float32", "bfloat16")
_NARROW_ON = ("gpu", "tpu")


def resolve_sampling_dtype(name: str, platform: str | None = None) -> jnp.dtype | None:
    """The dtype `name` ("auto", "float32" or "bfloat16") means on `platform` (default: JAX's
    default backend); None for the masters as they are ("auto" on CPU)."""
    if name not in SAMPLING_DTYPES:
        raise ValueError(f"sampling dtype must be one of {SAMPLING_DTYPES}, got {name!r}")
    if name == "auto":
        platform = platform or jax.default_backend()
        return jnp.dtype(jnp.bfloat16) if platform in _NARROW_ON else None
    return jnp.dtype(name)


def _casts(leaf, dtype) -> bool:
    return (dtype is not None and leaf.ndim >= 2 and jnp.issubdtype(leaf.dtype, jnp.floating)
            and leaf.dtype != dtype)


class SamplingWeights:
    """The `Policy` samplers use (`policy`): `masters` itself when `dtype` is None or no weight
    needs a cast, else a policy over a cast copy of its weights, which `refresh` recasts in place
    after the masters change (the copy's model object stays the same, so holders of `policy` see
    the new weights) and `release` frees while nothing samples.
    """

    def __init__(self, masters: Policy, dtype: str | None = "auto"):
        self.masters = masters
        self.dtype = None if dtype is None else resolve_sampling_dtype(dtype, masters.mesh.devices.flat[0].platform)
        graphdef, state = nnx.split(masters.model)
        if not any(_casts(leaf, self.dtype) for leaf in jax.tree.leaves(state)):
            self.policy = masters
            return
        shardings = jax.tree.map(lambda leaf: leaf.sharding, state)
        dtype = self.dtype  # not `self`: no reference cycle keeps the masters alive once this object goes
        # Every leaf is a new buffer (cast or copied), so the update donating the masters' buffers
        # never deletes one the copy holds.
        self._cast = jax.jit(
            lambda tree: jax.tree.map(lambda x: x.astype(dtype) if _casts(x, dtype) else jnp.copy(x), tree),
            out_shardings=shardings)
        self.policy = dataclasses.replace(masters, model=nnx.merge(graphdef, self._cast(state)))

    @property
    def is_copy(self) -> bool:
        return self.policy is not self.masters

    def release(self) -> None:
        """Frees the copy's buffers until the next `refresh` (nothing may sample in between)."""
        if self.is_copy:
            for leaf in jax.tree.leaves(nnx.state(self.policy.model)):
                leaf.delete()

    def refresh(self) -> None:
        """Recasts the copy from the masters' current weights (nothing to do without a copy)."""
        if self.is_copy:
            nnx.update(self.policy.model, self._cast(nnx.state(self.masters.model)))
