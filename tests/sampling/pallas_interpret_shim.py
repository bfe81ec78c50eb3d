"""Test-only shim: lets JAX's Pallas TPU interpreter run the ragged paged attention kernel.

JAX's ragged paged attention kernel reshapes a VMEM ref (`kv_ref = copy.wait().reshape(...)`)
and, for packed dtypes such as bf16, bitcasts it (`ref.bitcast(jnp.uint32)`) before strided
loads. The TPU interpreter (`pltpu.force_tpu_interpret_mode()`) turns every load into a host
callback, `interpret_pallas_call.get`, whose `interpret_utils.to_range` assumes that every ref
transform is an `NDIndexer`, so these loads fail with "'ReshapeTransform' object has no attribute
'indices'". Inside `patched_tpu_interpreter()`:

- a load whose transforms include a `ReshapeTransform` or `BitcastTransform` reads the range named
  by the indexers before the first of them through the original `get` (bounds checks, race
  detection, uninitialised memory unchanged), then applies the remaining transforms to that array
  in numpy, in order: reshape, bitcast (the TPU layout of `jax._src.state.utils.bitcast`: a
  bitwidth change packs or unpacks the second-minor axis) and indexing;
- a masked store (`pltpu.store(ref, x, mask=...)`, the interpreter's masked `swap`) is done as a
  read through the original `get` and an unmasked `swap` of `where(mask, x, old)`, returning what
  the masked swap returns. The interpreter's own masked path (`SharedMemory.swap_buffer_content`)
  marks `mask[in_bounds_shape[i]:]` out of bounds for every axis `i`, always slicing axis 0, so a
  fully in-bounds store of shape (8, 2, 128), the kernel's accumulator, is rejected as out of
  bounds. Out-of-bounds masked stores are not supported by this path;
- stores and swaps through reshaped or bitcast refs raise `NotImplementedError` (the kernel has none).

Everything else, the kernel's arithmetic included, is interpreted unchanged. The callbacks are
looked up when a kernel is traced: a kernel compiled in interpret mode before entering keeps the
original ones, and executables compiled inside keep the shim's after exit (they only add the cases
above). `ShimUnavailable` is raised on entry when the installed JAX's interpreter is not laid out
as this shim expects (written against jax 0.10.2 and 0.12.0).
"""

from __future__ import annotations

import contextlib
import inspect

import jax
import numpy as np


class ShimUnavailable(RuntimeError):
    """The installed JAX's TPU interpreter does not have the internals the shim wraps."""


def _internals():
    """(interpreter module, its utils, NDIndexer, ReshapeTransform, BitcastTransform), or raise."""
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
        from jax._src.pallas.mosaic.interpret import utils as interpret_utils
        from jax._src.state.indexing import NDIndexer
        from jax._src.state.types import BitcastTransform, ReshapeTransform
    except ImportError as error:
        raise ShimUnavailable(f"jax {jax.__version__}: no TPU interpreter internals ({error})") from error
    head = ["token", "device_id", "local_core_id", "memory_space", "buffer_id", "transforms"]
    for name, args in (("get", head), ("store", head), ("swap", head + ["val", "mask"])):
        function = getattr(ipc, name, None)
        if not callable(function) or list(inspect.signature(function).parameters)[:len(args)] != args:
            raise ShimUnavailable(f"jax {jax.__version__}: interpret_pallas_call.{name} is not the callback "
                                  f"({', '.join(args)}, ...) this shim wraps")
    try:
        source = inspect.getsource(ipc)
    except OSError as error:
        raise ShimUnavailable(f"jax {jax.__version__}: no source for {ipc.__name__}") from error
    if not all(f"functools.partial({name}, source_info" in source for name in ("get", "swap")) or not callable(
            getattr(interpret_utils, "to_range", None)):
        raise ShimUnavailable(f"jax {jax.__version__}: the interpreter no longer loads and stores through "
                              "interpret_pallas_call.get/swap and utils.to_range")
    return ipc, interpret_utils, NDIndexer, ReshapeTransform, BitcastTransform


def _bitcast(x: np.ndarray, dtype) -> np.ndarray:
    """`jax._src.state.utils.bitcast` in numpy: a bitwidth change packs/unpacks the second-minor axis."""
    dtype = np.dtype(dtype)
    src, dst = x.dtype.itemsize, dtype.itemsize
    x = np.ascontiguousarray(x)
    if src == dst:
        return x.view(dtype)
    *lead, m, n = x.shape
    if src < dst:
        ratio = dst // src
        packed = np.ascontiguousarray(x.reshape(*lead, m // ratio, ratio, n).swapaxes(-1, -2))
        return packed.view(dtype)[..., 0]
    ratio = src // dst
    return x.view(dtype).reshape(*lead, m, n, ratio).swapaxes(-1, -2).reshape(*lead, m * ratio, n)


def _wrappers(get, store, swap, internals):
    """The shim's `(get, store, swap)` over the interpreter's own three callbacks."""
    _, interpret_utils, NDIndexer, ReshapeTransform, BitcastTransform = internals

    def first_view(transforms) -> int | None:
        views = (ReshapeTransform, BitcastTransform)
        return next((i for i, t in enumerate(transforms) if isinstance(t, views)), None)

    def refuse_views(name, transforms):
        if first_view(tuple(transforms)) is not None:
            raise NotImplementedError(f"pallas_interpret_shim: {name} through a reshaped or bitcast ref")

    def shim_get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs):
        transforms = tuple(transforms)
        split = first_view(transforms)
        if split is None:
            return get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs)
        token, value = get(token, device_id, local_core_id, memory_space, buffer_id, transforms[:split],
                           *args, **kwargs)
        value = np.asarray(value)
        for transform in jax.tree.map(int, transforms[split:]):
            if isinstance(transform, ReshapeTransform):
                value = value.reshape(transform.shape)
            elif isinstance(transform, BitcastTransform):
                value = _bitcast(value, transform.dtype)
            elif isinstance(transform, NDIndexer):
                value = value[interpret_utils.to_range((transform,))]
            else:
                raise NotImplementedError(f"pallas_interpret_shim: cannot read through {transform!r}")
        return token, value

    def shim_store(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs):
        refuse_views("store", transforms)
        return store(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs)

    def shim_swap(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, mask, **kwargs):
        refuse_views("swap", transforms)
        where = (device_id, local_core_id, memory_space, buffer_id, transforms)
        if mask is None:
            return swap(token, *where, val, mask, **kwargs)
        token, old = get(token, *where, **kwargs)
        mask, val, old = np.asarray(mask), np.asarray(val), np.asarray(old)
        token, _ = swap(token, *where, np.where(mask, val, old), None, **kwargs)
        return token, np.where(mask, old, val)

    return shim_get, shim_store, shim_swap


@contextlib.contextmanager
def patched_tpu_interpreter():
    """Within: the TPU interpreter reads through reshaped/bitcast refs and does masked stores as
    read-modify-write (see the module docstring); its callbacks are restored on exit."""
    internals = _internals()
    ipc = internals[0]
    names = ("get", "store", "swap")
    original = [getattr(ipc, name) for name in names]
    shims = _wrappers(*original, internals)
    if all(hasattr(function, "__wrapped__") for function in original):  # DMAs call the undecorated ones
        for shim, undecorated in zip(shims, _wrappers(*(f.__wrapped__ for f in original), internals)):
            shim.__wrapped__ = undecorated
    for name, shim in zip(names, shims):
        setattr(ipc, name, shim)
    try:
        yield
    finally:
        for name, function in zip(names, original):
            setattr(ipc, name, function)
