"""The rollout engine's paged KV cache: a page pool per layer, pages handed to rows as they grow.

The pool is per shard: its page axis is split over the batch mesh axes as the rows are
(`paged_attention.PAGES`), each batch shard holding `pages_per_shard` pages for its own rows,
so a device stores only its rows' pages. Row r of `rows` lives on shard
`r // (rows / shards)` (where a batch of `rows` rows sharded over the batch axes puts it).

`PageTable` is the host side: which pages each row holds (LOCAL indices, within its shard's
block), a free list per shard, and the `(rows, pages)` table a program reads. A row takes
pages of its shard as its conversation grows and gives them all back when it is released;
local page 0 is never handed out (each shard's trash page of `paged_attention`). When a
shard's free list runs dry the pool grows by whole pages, every shard's block alike
(`grow_to`, `grow_pool`: local indices stay valid), never by resizing rows. A program's batch
puts each row in its shard's segment (`PageTable.batch`), so the rows and pages a device
holds are the same rows.

`forward_pages` is the device side: a layer stack over some rows that writes the new
tokens' keys/values into the rows' pages (only the new slots) and attends through the page
table, either over the row's history and the new tokens at once (`with_history`: an append
onto a history, or a decode step) or, for rows that hold nothing yet, causally among the
new tokens only (a plain prefill, no pages read).

Every read and write of pages runs per shard (`paged_attention`'s `shard_map`), so a program
moves no page between devices. `rows_from_pages` and `new_slots_to_pages` serve a decode
chunk on the XLA path: the chunk's rows are gathered once into contiguous per-row caches,
decoded there as the contiguous engine decodes, and only the slots the chunk wrote go back
to the pages. A gather per decode step copies every row's whole history once more per
token: 2-7x slower decode on XLA:CPU (measured on a 4-layer model, 16 rows of ~400 tokens,
64 steps).
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
    """Pages of a pool of `num_pages` (`shards` blocks, local page 0 of each reserved) handed to
    `rows` rows, row r from block `r // (rows / shards)`."""

    def __init__(self, rows: int, page_size: int, num_pages: int, shards: int = 1):
        if page_size < 1 or num_pages < shards or shards < 1:
            raise ValueError(f"page_size and num_pages / shards must be >= 1, got {page_size}, {num_pages} / {shards}")
        if rows % shards or num_pages % shards:
            raise ValueError(f"{rows} rows and {num_pages} pages must split evenly over {shards} shards")
        self.page_size = page_size
        self.shards = shards
        self.rows_per_shard = rows // shards
        self.pages_per_shard = num_pages // shards
        self.pages: list[list[int]] = [[] for _ in range(rows)]
        self._free = [list(range(self.pages_per_shard - 1, TRASH_PAGE, -1)) for _ in range(shards)]  # lowest last

    @property
    def num_pages(self) -> int:
        return self.shards * self.pages_per_shard

    @property
    def free_pages(self) -> int:
        return sum(map(len, self._free))

    def free_S(self) -> np.ndarray:
        """Free pages per shard."""
        return np.asarray(list(map(len, self._free)))

    def home(self, row: int) -> int:
        """The shard that holds the row (and its pages)."""
        return row // self.rows_per_shard

    def missing(self, row: int, slots: int) -> int:
        """Pages `row` still needs to hold `slots` slots."""
        return max(0, pages_for(slots, self.page_size) - len(self.pages[row]))

    def reserve(self, row: int, slots: int) -> None:
        """Gives `row` pages of its shard until it holds `slots` slots; the caller grew the pool if needed."""
        need, free = self.missing(row, slots), self._free[self.home(row)]
        if need > len(free):
            raise RuntimeError(f"row {row} needs {need} pages, {len(free)} are free on its shard")
        self.pages[row] += [free.pop() for _ in range(need)]

    def release(self, row: int) -> None:
        """Returns the row's pages to its shard's free list."""
        self._free[self.home(row)] += reversed(self.pages[row])
        self.pages[row] = []

    def grown_size(self, missing_S) -> int:
        """The pool's pages once every shard can hand out `missing_S[s]` more pages: each block
        doubled (past its trash page) until it can; the current size when it already can."""
        per_shard, free_S = self.pages_per_shard, self.free_S()
        while (per_shard - self.pages_per_shard + free_S < np.asarray(missing_S)).any():
            per_shard = 1 + 2 * (per_shard - 1)
        return self.shards * per_shard

    def grow_to(self, num_pages: int) -> None:
        """The pool now has `num_pages` pages, each shard's block grown alike: the new ones are free."""
        if num_pages % self.shards:
            raise ValueError(f"{num_pages} pages do not split over {self.shards} shards")
        per_shard = num_pages // self.shards
        self._free = [list(range(per_shard - 1, self.pages_per_shard - 1, -1)) + free for free in self._free]
        self.pages_per_shard = per_shard

    def batch(self, rows, per_shard: int) -> np.ndarray:
        """`rows` laid out in a batch of `shards * per_shard` entries, each in its shard's segment
        (in the given order), -1 padding the rest: the batch's rows sit where their pages are."""
        rows_SB = np.full((self.shards, per_shard), -1, np.int64)
        filled_S = np.zeros(self.shards, np.int64)
        for row in rows:
            shard = self.home(row)
            rows_SB[shard, filled_S[shard]] = row
            filled_S[shard] += 1
        return rows_SB.reshape(-1)

    def rows_per_segment(self, rows) -> int:
        """The most of `rows` any one shard holds: the segment a batch of them needs."""
        return int(np.bincount([self.home(r) for r in rows], minlength=self.shards).max()) if len(rows) else 0

    def table(self, rows, width: int) -> np.ndarray:
        """int32 `(len(rows), width)`: each row's local pages, then the trash page (a row index < 0: all trash)."""
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


def grow_pool(pool, *, num_pages: int, shards: int = 1):
    """One layer's pool with `num_pages` pages: each of the `shards` blocks its old pages, then zeros
    (a page keeps its local index)."""
    def grow(x_P_):
        x_SP_ = x_P_.reshape(shards, -1, *x_P_.shape[1:])
        pad = [(0, 0), (0, num_pages // shards - x_SP_.shape[1])] + [(0, 0)] * (x_P_.ndim - 1)
        return jnp.pad(x_SP_, pad).reshape(num_pages, *x_P_.shape[1:])

    return jax.tree.map(grow, pool)


def _each_array(fn, pool):
    """`fn(array, logical_axes)` over a pool's arrays, keeping its structure."""
    axes = pool_axes(pool)
    return tuple(map(fn, pool, axes)) if isinstance(pool, tuple) else fn(pool, axes)


def pool_shardings(config, num_pages: int, page_size: int, implementation: str, mesh, rules) -> list:
    """Per-layer shardings of `init_pools`' pools: pages split over the batch axes (a block per
    shard), kv heads as the model shards them."""
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
    """Per-layer contiguous `(k_BKHL, v_BKLH)` caches of the table's rows (`Transformer.extend_rows`' layout),
    each shard's rows gathered from its own pages."""
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
