"""The rollout engine's paged KV cache: a page pool per layer, pages handed to rows as they grow.

`PageTable` is the host side: which pages each row holds, the free list, and the
`(rows, pages)` table a program reads. A row takes pages as its conversation grows and
gives them all back when it is released; page 0 is never handed out (the trash page of
`paged_attention`). When the free list runs dry the pool grows by whole pages (`grow_to`),
never by resizing rows.

`forward_pages` is the device side: a layer stack over some rows that writes the new
tokens' keys/values into the rows' pages (only the new slots) and attends through the page
table, either over the row's history and the new tokens at once (`with_history`: an append
onto a history, or a decode step) or, for rows that hold nothing yet, causally among the
new tokens only (a plain prefill, no pages read).

`rows_from_pages` and `new_slots_to_pages` serve a decode chunk on the XLA path: the chunk's
rows are gathered once into contiguous per-row caches, decoded there as the contiguous engine
decodes, and only the slots the chunk wrote go back to the pages. A gather per decode step
copies every row's whole history once more per token: 2-7x slower decode on XLA:CPU
(measured on a 4-layer model, 16 rows of ~400 tokens, 64 steps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from spade_jax.models.sharding import constrain, logical_to_spec
from spade_jax.models.transformer import (
    attention_inputs, block_output, causal_self_attention, embed_lookup, rms_norm, rope_inverse_frequencies,
)
from spade_jax.sampling.paged_attention import (
    TRASH_PAGE, gather_pages, init_pool, paged_attention, pool_axes, write_pages,
)


def pages_for(slots: int, page_size: int) -> int:
    return -(-int(slots) // page_size)


class PageTable:
    """Pages of a pool of `num_pages` (page 0 reserved) handed to `rows` rows."""

    def __init__(self, rows: int, page_size: int, num_pages: int):
        if page_size < 1 or num_pages < 1:
            raise ValueError(f"page_size and num_pages must be >= 1, got {page_size}, {num_pages}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.pages: list[list[int]] = [[] for _ in range(rows)]
        self._free = list(range(num_pages - 1, TRASH_PAGE, -1))  # popped from the end: lowest first

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def missing(self, row: int, slots: int) -> int:
        """Pages `row` still needs to hold `slots` slots."""
        return max(0, pages_for(slots, self.page_size) - len(self.pages[row]))

    def reserve(self, row: int, slots: int) -> None:
        """Gives `row` pages until it holds `slots` slots; the caller grew the pool if needed."""
        need = self.missing(row, slots)
        if need > len(self._free):
            raise RuntimeError(f"row {row} needs {need} pages, {len(self._free)} are free")
        self.pages[row] += [self._free.pop() for _ in range(need)]

    def release(self, row: int) -> None:
        """Returns the row's pages to the free list."""
        self._free += reversed(self.pages[row])
        self.pages[row] = []

    def grow_to(self, num_pages: int) -> None:
        """The pool now has `num_pages` pages: the new ones are free."""
        self._free = list(range(num_pages - 1, self.num_pages - 1, -1)) + self._free
        self.num_pages = num_pages

    def table(self, rows, width: int) -> np.ndarray:
        """int32 `(len(rows), width)`: each row's pages, then the trash page (a row index < 0: all trash)."""
        table = np.full((len(rows), width), TRASH_PAGE, np.int32)
        for i, row in enumerate(rows):
            if row >= 0:
                pages = self.pages[row][:width]
                table[i, : len(pages)] = pages
        return table


def init_pools(config, num_pages: int, page_size: int, implementation: str):
    """Zeroed per-layer pools in `implementation`'s layout (`paged_attention.init_pool`)."""
    return [init_pool(num_pages, page_size, config.num_kv_heads, config.head_dim, jnp.dtype(config.dtype),
                      implementation) for _ in range(config.num_layers)]


def grow_pool(pool, *, num_pages: int):
    """One layer's pool with `num_pages` pages: the old ones, then zeros."""
    return jax.tree.map(lambda x: jnp.pad(x, [(0, num_pages - x.shape[0])] + [(0, 0)] * (x.ndim - 1)), pool)


def _each_array(fn, pool):
    """`fn(array, logical_axes)` over a pool's arrays, keeping its structure."""
    axes = pool_axes(pool)
    return tuple(map(fn, pool, axes)) if isinstance(pool, tuple) else fn(pool, axes)


def pool_shardings(config, num_pages: int, page_size: int, implementation: str, mesh, rules) -> list:
    """Per-layer shardings of `init_pools`' pools: kv heads as the model shards them, pages whole."""
    pool = jax.eval_shape(lambda: init_pools(config, num_pages, page_size, implementation)[0])
    one = _each_array(lambda x, axes: NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh, rules)), pool)
    return [one] * config.num_layers


def forward_pages(model, tokens_BT, starts_B, lengths_B, page_table_BM, pools, *, with_history: bool,
                  implementation: str = "auto"):
    """Token t of row b, for t < lengths_B[b], is the row's slot `starts_B[b] + t` (its position).

    Writes the keys/values of those tokens into the rows' pages (the rest to the trash page) and
    returns the final-normed hidden states `(B, T, D)` and the updated pools. With history a
    token attends to its row's slots up to its own, through `page_table_BM`; without, the rows
    hold nothing before `starts_B` (all 0) and the tokens attend causally among themselves.
    """
    cfg = model.config
    dt = jnp.dtype(cfg.dtype)
    B, T = tokens_BT.shape
    t_T = jnp.arange(T, dtype=jnp.int32)
    positions_BT = starts_B[:, None] + t_T[None, :]
    causal_BTT = jnp.broadcast_to(t_T[:, None] >= t_T[None, :], (B, T, T))
    inv_freq = rope_inverse_frequencies(cfg)
    x_BTD = embed_lookup(model.embed_VD[...], tokens_BT).astype(dt)
    new_pools = []
    for layer, pool in zip(model.layers, pools):
        w = layer.weights()
        h_BTD = rms_norm(x_BTD, w["attn_norm"], cfg.rms_norm_eps)
        q_BTNH, k_BTKH, v_BTKH = attention_inputs(h_BTD, w["attn"], cfg, positions_BT, inv_freq)
        q_BTNH = constrain(q_BTNH, ("batch", "length", "heads", None))
        pool = _each_array(constrain, write_pages(pool, k_BTKH, v_BTKH, page_table_BM, starts_B, lengths_B))
        if with_history:
            out_BTNH = paged_attention(q_BTNH, pool, page_table_BM, starts_B + T, implementation=implementation)
        else:
            out_BTNH = causal_self_attention(q_BTNH, k_BTKH.astype(dt), v_BTKH.astype(dt), causal_BTT)
        x_BTD, _ = block_output(x_BTD, out_BTNH, w, cfg)
        new_pools.append(pool)
    return rms_norm(x_BTD, model.final_norm_D[...], cfg.rms_norm_eps), new_pools


def rows_from_pages(pools, page_table_BM) -> list:
    """Per-layer contiguous `(k_BKHL, v_BKLH)` caches of the table's rows (`Transformer.extend_rows`' layout)."""
    return [gather_pages(pool, page_table_BM) for pool in pools]


def new_slots_to_pages(pools, rows_kv, page_table_BM, starts_B, counts_B, width: int) -> list:
    """Writes slots `[starts_B[b], starts_B[b] + counts_B[b])` (counts at most `width`) of the
    contiguous caches `rows_kv` back into the rows' pages. Returns the pools."""
    new_pools = []
    for pool, (k_BKHL, v_BKLH) in zip(pools, rows_kv):
        slots_BN = jnp.minimum(starts_B[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :], k_BKHL.shape[-1] - 1)
        k_BKHN = jnp.take_along_axis(k_BKHL, slots_BN[:, None, None, :], axis=3)
        v_BKNH = jnp.take_along_axis(v_BKLH, slots_BN[:, None, :, None], axis=2)
        pool = write_pages(pool, k_BKHN.transpose(0, 3, 1, 2), v_BKNH.transpose(0, 2, 1, 3), page_table_BM, starts_B,
                           counts_B)
        new_pools.append(_each_array(constrain, pool))
    return new_pools
