"""Attention over a paged KV cache: rows read their keys/values through a page table.

A layer's pool comes in one of two layouts (`init_pool`), one per implementation of
`paged_attention`:

- "kernel": `kv_pages_PSCH`, `(pages, page_size, 2 * kv_heads, head_dim)`, keys and values
  of kv head k interleaved at combined heads `2k` and `2k + 1`: the layout of JAX's ragged
  paged attention TPU kernel (`jax.experimental.pallas.ops.tpu.ragged_paged_attention`),
  used on TPU when the installed JAX has it. Queries are flattened to the kernel's ragged
  layout (`cu_q_lens`), every row with `T` queries.
- "xla": a pair `(k_pages_PKHS, v_pages_PKSH)`, each page in the `KVCache` layout. The row's
  pages are gathered straight into the `(rows, kv_heads, head_dim, slots)` views
  `transformer.attention` multiplies (one gather; from the kernel layout it would also
  transpose every page), under a causal mask that stops at the row's length.
  Works on every backend; it also reads the kernel layout (for tests).

Queries are right-aligned: query t of row b sits at slot `ends_B[b] - T + t` and sees
the slots up to its own. Page 0 of a pool is the trash page: page-table padding points
at it and writes that belong nowhere go to it, so it is never read unmasked.

Per-shard pools: under a mesh the page axis is split over the batch axes like the rows
(`PAGES`), so each batch shard holds a block of pages for its own rows and a device stores
only those. Page tables then hold LOCAL indices (within the row's shard's block, local page
0 its trash page), and every read and write of pages runs per shard inside `jax.shard_map`
(`_per_shard`: rows and pages split alike, heads as the model splits them). A pool whose page
axis is whole (one batch shard, or a page count the batch axes do not divide) is read with
indices into the whole pool: on the XLA path as XLA partitions it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from spade_jax.models.sharding import active_sharding, logical_to_spec
from spade_jax.models.transformer import attention

try:
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention
except ImportError:  # a JAX without the kernel: the XLA path only
    ragged_paged_attention = None

TRASH_PAGE = 0
PAGES = "batch"  # the page axis's logical name: split over the batch axes, as the rows are
IMPLEMENTATIONS = ("auto", "xla", "kernel")


def kernel_available() -> bool:
    """The ragged paged attention kernel is installed and the default backend is a TPU."""
    return ragged_paged_attention is not None and jax.default_backend() == "tpu"


def resolve(implementation: str) -> str:
    """"xla" or "kernel" for `implementation` ("auto": the kernel where `kernel_available`)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown paged attention implementation {implementation!r}; choose one of {IMPLEMENTATIONS}")
    if implementation == "auto":
        return "kernel" if kernel_available() else "xla"
    if implementation == "kernel" and ragged_paged_attention is None:
        raise ValueError("this JAX has no ragged_paged_attention kernel")
    return implementation


def init_pool(num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype, implementation: str):
    """A zeroed pool of one layer in `implementation`'s layout (see the module docstring)."""
    P, S, K, H = num_pages, page_size, kv_heads, head_dim
    if resolve(implementation) == "kernel":
        return jnp.zeros((P, S, 2 * K, H), dtype)
    return jnp.zeros((P, K, H, S), dtype), jnp.zeros((P, K, S, H), dtype)


def pool_axes(pool):
    """Logical axes of a pool's arrays (pages split like the rows, kv heads like the model's), in
    its pytree structure."""
    if isinstance(pool, tuple):
        return (PAGES, "kv_heads", "head_dim", None), (PAGES, "kv_heads", None, "head_dim")
    return PAGES, None, "kv_heads", "head_dim"


def _pages_split(pool, rows_B) -> bool:
    """Whether the active sharding splits the pool's page axis (then the rows must be split alike:
    a shard's tables index its own block of pages)."""
    active = active_sharding()
    if active is None:
        return False
    mesh, rules = active
    pages = logical_to_spec((PAGES,), jax.tree.leaves(pool)[0].shape[:1], mesh, rules)[0]
    if pages is None:
        return False
    rows = logical_to_spec(("batch",), rows_B.shape[:1], mesh, rules)[0]
    if rows != pages:
        raise ValueError(f"pool pages split over {pages} but its {rows_B.shape[0]} rows over {rows}")
    return True


def _per_shard(fn, args, axes, out_axes):
    """`fn(*args)` inside `jax.shard_map` over the active mesh, each array split by its logical
    `axes` (and the outputs by `out_axes`): rows and pages over the batch axes, heads over tensor."""
    mesh, rules = active_sharding()
    spec = lambda x, names: logical_to_spec(names, x.shape, mesh, rules)  # noqa: E731
    return jax.shard_map(fn, mesh=mesh, in_specs=jax.tree.map(spec, args, axes),
                         out_specs=jax.tree.map(spec, jax.eval_shape(fn, *args), out_axes),
                         check_vma=False)(*args)


def combine_kv(k_BTKH, v_BTKH):
    """`(B, T, 2K, H)`: keys and values interleaved per kv head, the kernel layout's combined heads."""
    B, T, K, H = k_BTKH.shape
    return jnp.stack([k_BTKH, v_BTKH], axis=3).reshape(B, T, 2 * K, H)


def write_pages(pool, k_BTKH, v_BTKH, page_table_BM, starts_B, lengths_B):
    """Writes token t of row b to slot `starts_B[b] + t` of the row's pages, for t < lengths_B[b];
    the rest goes to the trash page (per shard where the pages are split). Returns the pool."""
    args = (pool, k_BTKH, v_BTKH, page_table_BM, starts_B, lengths_B)
    if not _pages_split(pool, page_table_BM):
        return _write_local(*args)
    kv = ("batch", None, "kv_heads", None)
    return _per_shard(_write_local, args, (pool_axes(pool), kv, kv, ("batch", None), ("batch",), ("batch",)),
                      pool_axes(pool))


def _write_local(pool, k_BTKH, v_BTKH, page_table_BM, starts_B, lengths_B):
    S = pool[0].shape[-1] if isinstance(pool, tuple) else pool.shape[1]
    T = k_BTKH.shape[1]
    slots_BT = starts_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    real_BT = jnp.arange(T)[None, :] < lengths_B[:, None]
    column_BT = jnp.minimum(slots_BT // S, page_table_BM.shape[1] - 1)
    pages_BT = jnp.where(real_BT, jnp.take_along_axis(page_table_BM, column_BT, axis=1), TRASH_PAGE)
    offsets_BT = slots_BT % S
    if isinstance(pool, tuple):
        k_PKHS, v_PKSH = pool
        return (k_PKHS.at[pages_BT, :, :, offsets_BT].set(k_BTKH.astype(k_PKHS.dtype)),
                v_PKSH.at[pages_BT, :, offsets_BT, :].set(v_BTKH.astype(v_PKSH.dtype)))
    return pool.at[pages_BT, offsets_BT].set(combine_kv(k_BTKH, v_BTKH).astype(pool.dtype))


def _gather(pages_P_, page_table_BM, row_dims: tuple[int, int]):
    """`pages_P_[page_table_BM]` with the table's two dims placed at `row_dims` of the output."""
    shape = pages_P_.shape
    offset_dims = tuple(d for d in range(len(shape) + 1) if d not in row_dims)
    numbers = lax.GatherDimensionNumbers(offset_dims=offset_dims, collapsed_slice_dims=(0,), start_index_map=(0,))
    return lax.gather(pages_P_, page_table_BM[..., None], numbers, (1, *shape[1:]), mode="clip")


def gather_pages(pool, page_table_BM):
    """Row views `(k_BKHL, v_BKLH)` of the pool, L = pages per row * page size (the `KVCache` layout),
    gathered per shard where the pages are split."""
    if not _pages_split(pool, page_table_BM):
        return _gather_local(pool, page_table_BM)
    rows = ("batch", "kv_heads", None, None)
    return _per_shard(_gather_local, (pool, page_table_BM), (pool_axes(pool), ("batch", None)), (rows, rows))


def _gather_local(pool, page_table_BM):
    B, M = page_table_BM.shape
    if isinstance(pool, tuple):
        k_PKHS, v_PKSH = pool
        _, K, H, S = k_PKHS.shape
        k_BKHL = _gather(k_PKHS, page_table_BM, (0, 3)).reshape(B, K, H, M * S)  # (B, K, H, M, S)
        v_BKLH = _gather(v_PKSH, page_table_BM, (0, 2)).reshape(B, K, M * S, H)  # (B, K, M, S, H)
        return k_BKHL, v_BKLH
    _, S, C, H = pool.shape
    kv_BLCH = pool[page_table_BM].reshape(B, M * S, C, H)
    return kv_BLCH[:, :, 0::2].transpose(0, 2, 3, 1), kv_BLCH[:, :, 1::2].transpose(0, 2, 1, 3)


def paged_attention(q_BTNH, pool, page_table_BM, ends_B, *, implementation: str = "auto", interpret: bool = False):
    """Causal attention of right-aligned queries over their rows' pages (see the module docstring).

    `interpret` runs the kernel in Pallas' TPU interpret mode (for tests off TPU). Off a TPU
    backend (interpreted, or compiled ahead of time for TPU from a CPU host) the kernel gets
    fixed block sizes: the tuned ones are looked up by the local TPU's version.
    """
    args = (q_BTNH, pool, page_table_BM, ends_B)
    if resolve(implementation) == "kernel":
        return _kernel_attention(*args, interpret=interpret)
    if not _pages_split(pool, page_table_BM):
        return _xla_attention(*args)
    q_axes, kv_axes = ("batch", None, "heads", None), pool_axes(pool)
    mesh, rules = active_sharding()
    if logical_to_spec(q_axes, q_BTNH.shape, mesh, rules)[2] != _kv_heads_spec(pool):
        q_axes, kv_axes = _heads_whole(q_axes), _heads_whole(kv_axes)  # a device needs its queries' kv heads
    return _per_shard(_xla_attention, args, (q_axes, kv_axes, ("batch", None), ("batch",)), q_axes)


def _kv_heads_spec(pool):
    """The mesh axes the pool's kv heads are split over under the active sharding."""
    mesh, rules = active_sharding()
    x, axes = (pool[0], pool_axes(pool)[0]) if isinstance(pool, tuple) else (pool, pool_axes(pool))
    return logical_to_spec(axes, x.shape, mesh, rules)[axes.index("kv_heads")]


def _heads_whole(axes):
    """Logical `axes` (or a tuple of them, a pool's) with the head axes left unsplit."""
    if isinstance(axes[0], tuple):
        return tuple(map(_heads_whole, axes))
    return tuple(None if name in ("heads", "kv_heads") else name for name in axes)


def _xla_attention(q_BTNH, pool, page_table_BM, ends_B):
    """The XLA path on local (or unsplit) arrays: the rows' pages gathered, then `attention`."""
    B, T = q_BTNH.shape[:2]
    k_BKHL, v_BKLH = _gather_local(pool, page_table_BM)
    L = k_BKHL.shape[-1]
    positions_BT = ends_B[:, None] - T + jnp.arange(T, dtype=jnp.int32)[None, :]
    mask_BTL = positions_BT[:, :, None] >= jnp.arange(L, dtype=jnp.int32)[None, None, :]
    dt = q_BTNH.dtype
    return attention(q_BTNH, k_BKHL.astype(dt), v_BKLH.astype(dt), mask_BTL)


def _kernel_attention(q_BTNH, kv_pages_PSCH, page_table_BM, ends_B, *, interpret: bool):
    """The kernel over every row; under a multi-device `activation_sharding`, inside `shard_map`
    (Mosaic kernels are not partitioned automatically): rows split like the batch, heads like the
    model's, each device reading its own rows' pages from its block of the pool (local indices)
    or, where the page axis is whole, from its copy of the pool."""
    active = active_sharding()
    args = (q_BTNH, kv_pages_PSCH, page_table_BM, ends_B)
    local = functools.partial(_local_kernel_attention, interpret=interpret)
    if active is None or active[0].size == 1:
        return local(*args)
    mesh, rules = active
    q_axes, kv_axes = ("batch", None, "heads", None), pool_axes(kv_pages_PSCH)
    q_spec = logical_to_spec(q_axes, q_BTNH.shape, mesh, rules)
    pool_spec = logical_to_spec(kv_axes, kv_pages_PSCH.shape, mesh, rules)
    if pool_spec[0] not in (None, q_spec[0]) or pool_spec[1] is not None or pool_spec[3] is not None \
            or q_spec[3] is not None:
        raise ValueError(f"paged attention kernel: pool sharded {pool_spec}, queries {q_spec}; only heads, and "
                         "pages like the rows, may be split")
    if q_spec[2] != pool_spec[2]:  # each device must hold the kv heads of its query heads
        raise ValueError(f"paged attention kernel: query heads split over {q_spec[2]} but kv heads over "
                         f"{pool_spec[2]}; choose a tensor axis that divides both")
    return _per_shard(local, args, (q_axes, kv_axes, ("batch", None), ("batch",)), q_axes)


def _local_kernel_attention(q_BTNH, kv_pages_PSCH, page_table_BM, ends_B, *, interpret: bool):
    B, T, N, H = q_BTNH.shape
    cu_q_lens_B1 = jnp.arange(B + 1, dtype=jnp.int32) * T
    blocks = {}
    if interpret or jax.default_backend() != "tpu":
        S, M = kv_pages_PSCH.shape[1], page_table_BM.shape[1]
        blocks = dict(num_kv_pages_per_block=max(1, min(M, 512 // S)), num_queries_per_block=8)
    call = lambda: ragged_paged_attention(  # noqa: E731
        q_BTNH.reshape(B * T, N, H).astype(kv_pages_PSCH.dtype), kv_pages_PSCH, ends_B.astype(jnp.int32),
        page_table_BM.astype(jnp.int32), cu_q_lens_B1, jnp.asarray([B], jnp.int32), sm_scale=1 / math.sqrt(H),
        **blocks,
    )
    if interpret:
        from jax.experimental.pallas import tpu as pltpu

        with pltpu.force_tpu_interpret_mode():
            out_QNH = call()
    else:
        out_QNH = call()
    return out_QNH.reshape(B, T, N, H).astype(q_BTNH.dtype)
