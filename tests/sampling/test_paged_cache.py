"""The rollout engine's paged KV cache: the same replies as the contiguous cache, pages handed
out, freed and reused (per batch shard, each shard's block of the pool on its own devices),
compaction, and the paged attention paths against each other."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import random_policy
from spade_jax.models.sharding import TRAIN_RULES, activation_sharding, make_mesh
from spade_jax.sampling import paged_attention as pa
from spade_jax.sampling.engine import MAX_APPEND_TOKENS, RowEngine, generate_on_rows
from spade_jax.sampling.paged_cache import PageTable, grow_pool
from tests.sampling.pallas_interpret_shim import ShimUnavailable, patched_tpu_interpreter
from tests.sampling.test_rollout_engine import SMALL, STOP, _check_against_full_forward, _policy, _run


def _turns(policy, kv_cache: str, *, page_size: int = 16, temperature: float = 0.0, **kwargs):
    """Three turns on four rows (appends longer than one pass among them); every reply, in order."""
    rng = np.random.default_rng(0)
    engine = RowEngine(policy, 4, max_new_tokens=12, temperature=temperature, stop_token_ids=[STOP],
                       kv_cache=kv_cache, page_size=page_size, **kwargs)
    conversations = [rng.integers(4, 128, n).tolist() for n in (5, 40, 90, 150)]
    replies = []
    for turn in range(3):
        for row, tokens in enumerate(conversations):
            engine.submit(row, tokens, stream=row, turn=turn)
        done = _run(engine)
        for row in range(4):
            replies.append((list(conversations[row]), done[row]))
            conversations[row] = conversations[row] + done[row].tokens.tolist() + rng.integers(
                4, 128, [3, MAX_APPEND_TOKENS + 7, 20, 1][(row + turn) % 4]).tolist()
    return engine, replies


def _same_replies(a, b, logprob_tol=1e-4):
    assert len(a) == len(b)
    for (_, x), (_, y) in zip(a, b):
        assert x.tokens.tolist() == y.tokens.tolist() and x.stopped == y.stopped
        assert np.abs(x.logprobs - y.logprobs).max() <= logprob_tol


@pytest.mark.parametrize("devices", [1, 8])
def test_paged_turns_equal_the_contiguous_cache_and_a_full_prefill(devices):
    policy = _policy(devices)
    _, contiguous = _turns(policy, "contiguous")
    engine, paged = _turns(policy, "paged")
    _same_replies(contiguous, paged)
    for conversation, reply in paged[-4:]:
        _check_against_full_forward(policy, conversation, reply)
    assert engine.stats.compiled["decode_paged"] >= 1 and "decode" not in engine.stats.compiled


def test_sampled_replies_do_not_depend_on_the_cache():
    policy = _policy(1)
    _same_replies(_turns(policy, "contiguous", temperature=1.0)[1], _turns(policy, "paged", temperature=1.0)[1])


def test_page_table_hands_out_frees_and_reuses_pages():
    table = PageTable(rows=3, page_size=4, num_pages=6)
    assert table.free_pages == 5  # page 0 is the trash page
    table.reserve(0, 5)
    table.reserve(1, 4)
    assert table.pages == [[1, 2], [3], []] and table.missing(1, 9) == 2
    table.reserve(1, 9)
    assert table.pages[1] == [3, 4, 5] and table.free_pages == 0
    with pytest.raises(RuntimeError, match="needs 1 pages"):
        table.reserve(2, 1)
    table.release(0)
    table.reserve(2, 8)
    assert table.pages[2] == [1, 2] and table.pages[0] == []
    table.grow_to(8)
    table.reserve(0, 3)
    assert table.pages[0] == [6] and table.free_pages == 1
    np.testing.assert_array_equal(table.table([2, -1, 1], 4), [[1, 2, 0, 0], [0, 0, 0, 0], [3, 4, 5, 0]])


def test_page_table_keeps_each_shards_pages_in_its_own_block():
    """Two shards of 3 pages (local 0 each one's trash page), rows 0-1 on shard 0 and 2-3 on
    shard 1: a row takes local pages of its shard only, a full shard grows every block alike."""
    table = PageTable(rows=4, page_size=4, num_pages=6, shards=2)
    assert [table.home(r) for r in range(4)] == [0, 0, 1, 1] and table.free_S().tolist() == [2, 2]
    table.reserve(0, 5)
    table.reserve(2, 4)
    assert table.pages == [[1, 2], [], [1], []] and table.free_S().tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="needs 1 pages, 0 are free on its shard"):
        table.reserve(1, 1)  # shard 1's free page is not shard 0's
    assert table.grown_size([1, 0]) == 10 and table.grown_size([0, 1]) == 6  # 3 -> 5 pages a block
    table.grow_to(10)
    assert table.pages_per_shard == 5 and table.free_S().tolist() == [2, 3]
    table.reserve(1, 1)
    table.reserve(3, 12)
    assert table.pages == [[1, 2], [3], [1], [2, 3, 4]] and table.free_S().tolist() == [1, 0]
    table.release(0)
    table.reserve(1, 8)
    assert table.pages[1] == [3, 1] and table.free_S().tolist() == [2, 0] and table.free_pages == 2
    np.testing.assert_array_equal(table.table([3, -1, 1, 2], 3), [[2, 3, 4], [0, 0, 0], [3, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(table.batch([1, 2, 3], 2), [1, -1, 2, 3])
    np.testing.assert_array_equal(table.batch([3], 1), [-1, 3])
    assert table.rows_per_segment([1, 2, 3]) == 2 and table.rows_per_segment([0, 1]) == 2
    with pytest.raises(ValueError, match="split evenly"):
        PageTable(rows=3, page_size=4, num_pages=6, shards=2)


def test_grow_pool_grows_every_shards_block_in_place():
    pool_P1 = jnp.arange(6, dtype=jnp.float32)[:, None]  # page p holds p
    grown_P1 = grow_pool((pool_P1, pool_P1 + 10), num_pages=10, shards=2)
    np.testing.assert_array_equal(grown_P1[0][:, 0], [0, 1, 2, 0, 0, 3, 4, 5, 0, 0])
    np.testing.assert_array_equal(grown_P1[1][:5, 0], [10, 11, 12, 0, 0])


def _shard_turns(policy, kv_cache: str):
    """Two turns on eight rows, replies of 1 to 16 tokens, a third of the rows idle in turn 2 and
    appends longer than a pass onto the others' histories (the pool grows): every reply, in order
    of finishing."""
    rng = np.random.default_rng(4)
    engine = RowEngine(policy, 8, max_new_tokens=16, temperature=0.0, stop_token_ids=[STOP], kv_cache=kv_cache,
                       page_size=16, cache_tokens=8 * 16)
    conversations = [rng.integers(4, 128, n).tolist() for n in (3, 90, 17, 30, 150, 41, 9, 70)]
    replies = []
    for turn in range(2):
        for row, tokens in enumerate(conversations):
            if turn == 0 or row % 3:
                engine.submit(row, tokens, stream=row, turn=turn, limit=1 + (5 * row + 3 * turn) % 16)
        done = _run(engine, exit_after=2)
        for row in sorted(done):
            replies.append((list(conversations[row]), done[row]))
            conversations[row] = conversations[row] + done[row].tokens.tolist() + rng.integers(4, 128, 150).tolist()
    return engine, replies


@pytest.mark.parametrize("shape", [(4, 1, 2), (2, 1, 4)])
def test_paged_engine_on_batch_shards_keeps_each_shards_pages_on_its_devices(shape):
    """On an 8-device mesh with several batch shards (on (2, 1, 4) the query heads split over tensor
    but the 2 kv heads do not: the XLA path keeps heads whole per shard) the paged engine gives the
    contiguous engine's replies, and every pool array splits its page axis over the batch axes:
    a device holds `pages_per_shard` pages, its rows' shard's block, not the whole pool."""
    policy = random_policy(SMALL, None, seed=7, mesh=make_mesh(shape))
    _, contiguous = _shard_turns(policy, "contiguous")
    engine, paged = _shard_turns(policy, "paged")
    _same_replies(contiguous, paged)
    pages = engine._pages
    assert pages.shards == shape[0] and engine.stats.compiled["grow_pool"] >= 1
    for row, held in enumerate(pages.pages):
        assert 0 not in held and max(held) < pages.pages_per_shard and pages.home(row) == row // (8 // shape[0])
    for x in jax.tree.leaves(engine._cache):
        assert x.shape[0] == pages.num_pages and x.sharding.spec[0] == "data"
        assert {shard.data.shape[0] for shard in x.addressable_shards} == {pages.pages_per_shard}
        assert {shard.index[0].start for shard in x.addressable_shards} == set(
            range(0, pages.num_pages, pages.pages_per_shard))
    engine.close()


def test_rows_grow_across_pages_and_released_pages_are_reused():
    policy = _policy(1)
    engine, replies = _turns(policy, "paged", page_size=16, cache_tokens=4 * 16)
    pages = engine._pages
    for row in range(4):  # each row holds the pages its conversation and reply filled
        assert len(pages.pages[row]) * 16 >= engine.lengths[row] > (len(pages.pages[row]) - 2) * 16
    assert engine.stats.pool_pages > 1 + 4 and engine.stats.resize_s > 0  # grew from 4 pages
    held = sorted(p for row in pages.pages for p in row)
    assert len(set(held)) == len(held) and 0 not in held
    grown = pages.num_pages
    engine.release(3)
    engine.release(2)
    freed = pages.free_pages
    rng = np.random.default_rng(5)
    fresh = rng.integers(4, 128, 100).tolist()
    engine.submit(2, fresh, stream=20, turn=0)
    reply = _run(engine)[2]
    _check_against_full_forward(policy, fresh, reply)
    assert pages.num_pages == grown and pages.free_pages == freed - len(pages.pages[2])


def test_compaction_keeps_replies_and_skips_finished_rows():
    """Eight prompts with reply limits from 1 to 24 decoded in one chunk (exit after all): the
    paged engine shrinks its decode batch as rows finish, with the contiguous engine's replies."""
    policy = _policy(1)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(4, 128, n).tolist() for n in (3, 9, 17, 30, 33, 41, 64, 70)]
    limits = [1, 2, 3, 4, 24, 24, 24, 24]
    kwargs = dict(max_new_tokens=24, temperature=0.0, stop_token_ids=[], rows=8, refill_fraction=1.0, limits=limits)
    contiguous = generate_on_rows(policy, prompts, **kwargs)
    paged = generate_on_rows(policy, prompts, kv_cache="paged", page_size=16, **kwargs)
    np.testing.assert_array_equal(paged.tokens, contiguous.tokens)
    np.testing.assert_allclose(paged.logprobs, contiguous.logprobs, atol=1e-4)
    np.testing.assert_array_equal(paged.lengths, limits)
    engine = RowEngine(policy, 8, max_new_tokens=24, temperature=0.0, stop_token_ids=[], kv_cache="paged",
                       page_size=16)
    for row, (prompt, limit) in enumerate(zip(prompts, limits)):
        engine.submit(row, prompt, stream=row, turn=0, limit=limit)
    replies = engine.step(exit_after=8)
    assert sorted(r.row for r in replies) == list(range(8))
    assert engine.stats.chunks == 2  # 8 rows, then the 4 still decoding once the short ones finished
    assert engine.stats.decode_steps == 24


# ---------------------------------------------------------------------------- attention paths

def _ragged_case(seed=0, page_size=4, kv_heads=2, heads=4, head_dim=128, dtype=jnp.float32):
    """Rows mixing decode (1 query) and prefill (several) over ragged lengths, GQA heads, pages
    handed out in scrambled order."""
    rng = np.random.default_rng(seed)
    q_lens = np.array([1, 5, 3, 1, 4], np.int32)
    kv_lens = np.array([9, 5, 14, 1, 12], np.int32)
    max_pages = 4
    pages = rng.permutation(np.arange(1, 1 + len(q_lens) * max_pages))
    table_BM = pages.reshape(len(q_lens), max_pages).astype(np.int32)
    kv_PSCH = rng.normal(size=(1 + table_BM.size, page_size, 2 * kv_heads, head_dim)).astype(np.float32)
    T = int(q_lens.max())
    q_BTNH = rng.normal(size=(len(q_lens), T, heads, head_dim)).astype(np.float32)
    return (jnp.asarray(q_BTNH, dtype), jnp.asarray(kv_PSCH, dtype), jnp.asarray(table_BM), jnp.asarray(kv_lens),
            q_lens)


def test_xla_path_equals_the_kernels_reference_on_ragged_mixed_queries():
    """The right-aligned batch of `paged_attention` against the kernel package's own reference
    (flat ragged queries, `cu_q_lens`): the pool layout and length conventions agree."""
    ref = pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention").ref_ragged_paged_attention
    q_BTNH, kv_PSCH, table_BM, kv_lens_B, q_lens = _ragged_case()
    B, T, N, H = q_BTNH.shape
    ours_BTNH = pa.paged_attention(q_BTNH, kv_PSCH, table_BM, kv_lens_B, implementation="xla")
    flat_QNH = jnp.concatenate([q_BTNH[b, T - q_lens[b]:] for b in range(B)])
    cu_q_lens = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    theirs_QNH = ref(flat_QNH, kv_PSCH, kv_lens_B, table_BM, cu_q_lens, jnp.asarray([B], jnp.int32),
                     sm_scale=H ** -0.5)
    ours_QNH = jnp.concatenate([ours_BTNH[b, T - q_lens[b]:] for b in range(B)])
    np.testing.assert_allclose(np.asarray(ours_QNH), np.asarray(theirs_QNH), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["xla", "kernel"])
def test_written_pages_read_back_as_rows(layout, monkeypatch):
    monkeypatch.setattr(pa, "ragged_paged_attention", pa.ragged_paged_attention or (lambda *a, **k: None))
    rng = np.random.default_rng(2)
    pool = pa.init_pool(6, 4, 2, 8, jnp.float32, layout)
    table_BM = jnp.asarray([[3, 1, 0], [2, 5, 4]], jnp.int32)
    k_BTKH, v_BTKH = (jnp.asarray(rng.normal(size=(2, 7, 2, 8)), jnp.float32) for _ in range(2))
    starts_B, lengths_B = jnp.asarray([2, 5]), jnp.asarray([6, 7])  # row 0's 7th token is padding
    pool = pa.write_pages(pool, k_BTKH, v_BTKH, table_BM, starts_B, lengths_B)
    k_BKHL, v_BKLH = pa.gather_pages(pool, table_BM)
    for b in range(2):
        s, n = int(starts_B[b]), int(lengths_B[b])
        np.testing.assert_array_equal(k_BKHL[b, :, :, s:s + n], k_BTKH[b, :n].transpose(1, 2, 0))
        np.testing.assert_array_equal(v_BKLH[b, :, s:s + n], v_BTKH[b, :n].transpose(1, 0, 2))
        assert not np.asarray(k_BKHL[b, :, :, :s]).any() and not np.asarray(v_BKLH[b, :, :s]).any()
    trash_k_KH = pool[0][0, :, :, 0] if layout == "xla" else pool[0, 0, 0::2]
    np.testing.assert_array_equal(trash_k_KH, k_BTKH[0, 6])  # the padding went to the trash page


@pytest.mark.parametrize("dtype, atol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_kernel_in_interpret_mode_equals_the_xla_path(dtype, atol):
    """The Pallas TPU kernel, run by JAX's TPU interpreter on CPU, against the XLA path and the
    kernel package's reference, on the real (right-aligned) queries. The interpreter cannot read
    through the reshaped (for bf16 also bitcast) refs the kernel loads from, and wrongly rejects
    the masked stores to its (8, 2, 128) accumulator as out of bounds, so `pallas_interpret_shim`
    adds those reads and does masked stores as read-modify-write; the kernel's arithmetic is
    otherwise interpreted unchanged. Measured max |kernel - xla| and |kernel - reference| (jax
    0.10.2 and 0.12): under 6e-7 in f32, 0.0078 (one bf16 ulp in [1, 2)) in bf16."""
    kernel_module = pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")
    q_BTNH, kv_PSCH, table_BM, kv_lens_B, q_lens = _ragged_case(dtype=dtype)
    B, T, N, H = q_BTNH.shape
    try:
        with patched_tpu_interpreter():
            kernel_BTNH = pa.paged_attention(q_BTNH, kv_PSCH, table_BM, kv_lens_B, implementation="kernel",
                                             interpret=True)
    except ShimUnavailable as error:
        pytest.skip(f"pallas_interpret_shim cannot attach: {error}")
    xla_BTNH = pa.paged_attention(q_BTNH, kv_PSCH, table_BM, kv_lens_B, implementation="xla")
    real = lambda x_BTNH: np.concatenate(  # noqa: E731
        [np.asarray(x_BTNH[b, T - n:], np.float32) for b, n in enumerate(q_lens)])
    cu_q_lens = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    ref_QNH = kernel_module.ref_ragged_paged_attention(
        jnp.concatenate([q_BTNH[b, T - n:] for b, n in enumerate(q_lens)]), kv_PSCH, kv_lens_B, table_BM,
        cu_q_lens, jnp.asarray([B], jnp.int32), sm_scale=H ** -0.5)
    np.testing.assert_allclose(real(kernel_BTNH), real(xla_BTNH), atol=atol, rtol=0)
    np.testing.assert_allclose(real(kernel_BTNH), np.asarray(ref_QNH, np.float32), atol=atol, rtol=0)


def _attention_under_mesh(mesh, implementation, q_BTNH, pool, table_BM, ends_B):
    """`paged_attention` jitted under `activation_sharding(mesh)`, the kernel interpreted through
    the shim (skips where the shim cannot attach to this JAX)."""

    def attend(q, pool, table, ends):
        with activation_sharding(mesh, TRAIN_RULES):
            return pa.paged_attention(q, pool, table, ends, implementation=implementation, interpret=True)

    try:
        with patched_tpu_interpreter():
            return jax.jit(attend)(q_BTNH, pool, table_BM, ends_B)
    except ShimUnavailable as error:
        pytest.skip(f"pallas_interpret_shim cannot attach: {error}")


def _assert_real_queries_close(a_BTNH, b_BTNH, q_lens, atol=1e-5):
    """The real (right-aligned) queries of each row agree."""
    T = a_BTNH.shape[1]
    for b, n in enumerate(q_lens):
        np.testing.assert_allclose(np.asarray(a_BTNH[b, T - n:]), np.asarray(b_BTNH[b, T - n:]), atol=atol)


def test_kernel_under_a_mesh_runs_in_shard_map_and_equals_the_xla_path():
    """Mosaic kernels are not partitioned automatically: under a 4-device mesh (rows over data,
    heads over tensor) the kernel runs inside `shard_map`, each device on its own rows and heads
    with its copy of the pool, and equals the unsharded XLA path."""
    pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")
    q_BTNH, kv_PSCH, table_BM, kv_lens_B, q_lens = (x[:4] if i != 1 else x for i, x in enumerate(_ragged_case()))
    mesh = make_mesh((2, 1, 2), jax.devices()[:4])
    kernel_BTNH = _attention_under_mesh(mesh, "kernel", q_BTNH, kv_PSCH, table_BM, kv_lens_B)
    xla_BTNH = pa.paged_attention(q_BTNH, kv_PSCH, table_BM, kv_lens_B, implementation="xla")
    _assert_real_queries_close(kernel_BTNH, xla_BTNH, q_lens)
    with activation_sharding(mesh, (("batch", ("data",)), ("heads", ("tensor",)), ("kv_heads", ()))):
        with pytest.raises(ValueError, match="query heads split over"):
            jax.eval_shape(lambda: pa.paged_attention(q_BTNH, kv_PSCH, table_BM, kv_lens_B, implementation="kernel"))


def _per_shard_case(shards: int):
    """`_ragged_case`'s first four rows with the pool cut into `shards` blocks, each its own trash
    page and the pages of its rows (row b on shard b // (4 / shards)), and tables of local indices."""
    q_BTNH, kv_PSCH, table_BM, kv_lens_B, q_lens = _ragged_case()
    q_BTNH, table_BM, kv_lens_B, q_lens = q_BTNH[:4], np.asarray(table_BM[:4]), kv_lens_B[:4], q_lens[:4]
    per_shard = 4 // shards
    blocks, local_BM = [], np.zeros_like(table_BM)
    for s in range(shards):
        rows = table_BM[s * per_shard:(s + 1) * per_shard]
        blocks.append(jnp.concatenate([kv_PSCH[:1], kv_PSCH[rows.reshape(-1)]]))
        local_BM[s * per_shard:(s + 1) * per_shard] = 1 + np.arange(rows.size).reshape(rows.shape)
    return q_BTNH, jnp.concatenate(blocks), jnp.asarray(local_BM), kv_lens_B, q_lens, (kv_PSCH, jnp.asarray(table_BM))


@pytest.mark.parametrize("implementation", ["xla", "kernel"])
def test_paged_attention_on_a_per_shard_pool_equals_the_whole_pool(implementation):
    """Under a (2, 1, 2) mesh a pool of two 9-page blocks (pages split over data like the rows),
    read through local page indices, gives what the whole pool gives through global ones."""
    if implementation == "kernel":
        pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")
    q_BTNH, pool_PSCH, local_BM, kv_lens_B, q_lens, (whole_PSCH, global_BM) = _per_shard_case(2)
    mesh = make_mesh((2, 1, 2), jax.devices()[:4])
    with activation_sharding(mesh, TRAIN_RULES):
        assert pa.pool_axes(pool_PSCH)[0] == "batch" and pa._pages_split(pool_PSCH, local_BM)
    split_BTNH = _attention_under_mesh(mesh, implementation, q_BTNH, pool_PSCH, local_BM, kv_lens_B)
    whole_BTNH = pa.paged_attention(q_BTNH, whole_PSCH, global_BM, kv_lens_B, implementation="xla")
    _assert_real_queries_close(split_BTNH, whole_BTNH, q_lens)


def test_implementation_choice():
    assert pa.resolve("xla") == "xla"
    assert pa.resolve("auto") == ("kernel" if jax.default_backend() == "tpu" else "xla")
    with pytest.raises(ValueError, match="unknown paged attention"):
        pa.resolve("flash")
    with pytest.raises(ValueError, match="unknown kv_cache"):
        RowEngine(_policy(1), 2, max_new_tokens=4, kv_cache="ring")
