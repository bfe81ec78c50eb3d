"""Compiles each preset's real TPU programs ahead of time on this CPU host and reports their cost.

    bash bench/aot_tpu_setup.sh      # once: .venv-tpu with jax[tpu] (libtpu compiles for TPU here)
    .venv-tpu/bin/python bench/aot_tpu.py --preset=qwen3_0p6b --out=aot.json
    .venv/bin/python bench/aot_tpu.py --dry_run          # the plan only; no libtpu needed

libtpu describes a TPU slice without one (`jax.experimental.topologies`); the programs are
lowered onto a mesh over those abstract devices with abstract (shape, dtype, sharding)
arguments and compiled by the TPU compiler, so a program that does not fit a chip's HBM fails
here with RESOURCE_EXHAUSTED, as it would on the slice. Nothing runs and nothing is loaded:
the model is the preset's published architecture (`PUBLISHED_ARCHITECTURES`) at the preset's
dtypes.

The programs are the ones a self-play run compiles, lowered through the same functions:
- `update`: `Trainer._update_fn` (jitted as `Trainer.__init__` jits it: donated parameters and
  optimizer state, the same out shardings) at the preset's `rl` settings, over the largest
  batch the preset packs (`update_rows`);
- the rollout engine's (`sampling/engine.py`, `RowEngine`) `decode` chunk over `agent.rows`
  rows with the cache of `agent.context_budget`, the same chunk on the paged cache
  (`decode_paged`: a pool of `--page_size`-slot pages holding that many slots a row, read by
  `--paged_attention`, the TPU kernel by default; compared with `decode` it shows the bytes
  a step reads through page tables instead of whole cache rows), its `prefill` (an append pass into empty
  rows, `MAX_FRESH_TOKENS` each) and its `append` (a pass onto every row's history,
  `MAX_APPEND_TOKENS` each).

The engine programs read the weights the samplers read on TPU (`models/sampling_weights.py`): the
preset's `model.sampling_dtype` resolved for "tpu" ("auto": a bfloat16 copy of the matrices,
cast as `_casts` casts them, sharded like the masters). While they run, the float32 masters (when
a copy is used), the Adam moments and the KL reference (`rl.kl_coef > 0`) stay in HBM without
being arguments of the program: "resident GiB" is their bytes per device, placed as the update
places them, and an engine row "fits" when peak + resident is within the chip's HBM.

Per program: per-device memory (`memory_analysis`; an update row "fits" when the peak is within
the chip's HBM), FLOPs and bytes accessed per device (`cost_analysis`), a roofline time
max(FLOPs / peak FLOP/s, bytes / HBM bandwidth), and two ceilings from it: tokens/s = tokens
per execution / roofline s, and for the update the MFU ceiling = 6 * active parameters *
tokens / (roofline s * chips * the chip's peak bf16 FLOP/s). The compiler counts a loop body
once whatever its trip count: a decode execution (a `lax.while_loop` with a data-dependent
trip count) is therefore one step, one token for every row; the update's counts come from
probes (`update_counts`). "compute s" is FLOPs / peak alone. Bytes accessed count a
`dynamic_update_slice` into a cache as a copy of the whole cache, so the roofline is pessimistic
for decode. The compiler's own `optimal_seconds` is kept as "compiler s" (mended, see
`optimal_seconds`), but the ceilings do not use it: in the update it did not grow when the LM
head's chunks (inside a `lax.cond`) doubled in length while their FLOPs did, and a decode step
still reads negative after the mending. "model FLOP share" = 6 * active parameters * tokens /
the compiled FLOPs: the MFU of the update at 100% FLOP utilisation.

Decode rows also get a bandwidth bound, "bound s" = (bytes per device of the sampling weights +
the live KV cache when every row holds `cache_length` slots) / HBM bandwidth ("weights+KV
GB/dev" is that numerator): what one step must read at least. "roofline / bound" compares the
compiler's bytes with it and is only indicative, skewed both ways: XLA's cost analysis does not
see inside a Pallas kernel (the paged kernel's KV reads are missing from decode_paged's bytes,
pulling the ratio down), and it counts a scatter or `dynamic_update_slice` into the donated cache
as a copy of the whole cache (pushing decode's ratio up).

Needs one libtpu process at a time (its lockfile) and, on 2 cores, minutes per program.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from experiments import presets  # noqa: E402
from spade_jax.models.config import ModelConfig  # noqa: E402
from spade_jax.sampling.memory_plan import PUBLISHED_ARCHITECTURES  # noqa: E402
from spade_jax.models.policy import Policy, abstract_model  # noqa: E402
from spade_jax.models.sampling_weights import SAMPLING_DTYPES, _casts, resolve_sampling_dtype  # noqa: E402
from spade_jax.models.sharding import TRAIN_RULES, logical_to_spec, make_mesh, param_shardings  # noqa: E402
from spade_jax.rl.batch import TrainSequence, bucket_rows, pack  # noqa: E402
from spade_jax.rl.train import Trainer, make_optimizer  # noqa: E402
from spade_jax.sampling import engine as engine_lib  # noqa: E402
from spade_jax.sampling import paged_cache  # noqa: E402
from spade_jax.sampling.batching import bucket  # noqa: E402
from spade_jax.selfplay import config as config_lib  # noqa: E402

GIB = 2**30
QWEN3_STOP_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>: the stop ids of the Qwen3 tokenizer


@dataclasses.dataclass(frozen=True)
class Chip:
    hbm_gib: float
    peak_bf16: float  # FLOP/s per chip
    hbm_bytes_per_s: float
    megacore: bool  # two TensorCores presented as one device (what the runtime does on v4 and v5p)


CHIPS = {
    "v4": Chip(32, 275e12, 1228e9, True),
    "v5p": Chip(95, 459e12, 2765e9, True),
    "v5e": Chip(16, 197e12, 819e9, False),
    "v6e": Chip(32, 918e12, 1640e9, False),
}


@dataclasses.dataclass(frozen=True)
class Slice:
    name: str  # as the preset's docstring and Cloud TPU name it
    topology: str  # libtpu's topology name: "<chip>:<chips per axis>"
    mesh: tuple[int, int, int]  # (data, fsdp, tensor), from the preset's docstring


# The TPU slice each preset's docstring names first, with the mesh it gives for it.
PRESET_SLICES = {
    "qwen3_0p6b": Slice("v4-8", "v4:2x2x1", (4, 1, 1)),
    "qwen3_4b": Slice("v4-32", "v4:2x2x4", (1, 8, 2)),
    "qwen3_8b": Slice("v4-64", "v4:2x4x4", (1, 8, 4)),
    "qwen3_30b_a3b": Slice("v5p-64", "v5p:2x4x4", (1, 8, 4)),
}


# ---- the plan -------------------------------------------------------------------------------


def chips_of(topology: str) -> tuple[str, int]:
    """("v4", 16) for "v4:2x2x4"."""
    kind, _, dims = topology.partition(":")
    if kind not in CHIPS or not re.fullmatch(r"\d+(x\d+)*", dims):
        raise ValueError(f"topology {topology!r}: expected <chip>:<AxB[xC]> with chip one of {sorted(CHIPS)}")
    return kind, math.prod(int(d) for d in dims.split("x"))


def resolve_mesh(shape, chips: int) -> tuple[int, int, int]:
    """A mesh shape with its -1 (if any) resolved against `chips`, checked to use them all."""
    shape = list(shape)
    if -1 in shape:
        shape[shape.index(-1)] = chips // math.prod(s for s in shape if s != -1)
    if math.prod(shape) != chips:
        raise ValueError(f"mesh {tuple(shape)} does not use the {chips} chips of the slice")
    return tuple(shape)


def update_rows(c, data_parallel: int) -> int:
    """Rows of the largest batch the preset packs: every design slot admitted, each design a row
    (its prompt holds a document and exemplars), each trained episode at `agent.context_budget`
    tokens, then `pack`'s bucketing (a power of two, a multiple of lcm(data parallel, micro rows))."""
    envs = c.designer.num_slots + c.agent.replay_envs
    episodes = envs * c.agent.episodes_per_env * (2 if c.agent.train_hinted else 1)
    per_row = max(1, c.rl.row_length // c.agent.context_budget)
    rows = c.designer.num_slots + -(-episodes // per_row)
    return bucket_rows(rows, math.lcm(data_parallel, c.rl.micro_batch_rows or 1))


@dataclasses.dataclass
class Plan:
    preset: str
    slice: Slice
    chip: str
    chips: int
    mesh: tuple[int, int, int]
    model: ModelConfig
    loss: object  # rl.train.LossConfig
    optim: object  # rl.train.OptimConfig
    rows: int  # update rows
    row_length: int
    engine_rows: int
    cache_length: int
    max_new_tokens: int  # agent.max_new_tokens: a decode chunk runs up to bucket(this, 16) steps
    truncate: bool
    with_old_logprobs: bool
    moments_as_trainer: bool = False  # Adam moments placed as Trainer.__init__ places them (replicated)
    page_size: int = engine_lib.PAGE_SIZE  # decode_paged: slots per page (divides cache_length)
    paged_attention: str = "kernel"  # decode_paged: `paged_attention` implementation
    sampling_dtype: str | None = None  # engine weights: model.sampling_dtype resolved for "tpu" (None: the masters)

    def describe(self) -> str:
        m, loss = self.model, self.loss
        return (
            f"{self.preset} on {self.slice.name} ({self.slice.topology}, {self.chips} chips, mesh {self.mesh}): "
            f"{m.family} L={m.num_layers} D={m.hidden_size} F={m.intermediate_size} N={m.num_heads} "
            f"K={m.num_kv_heads} H={m.head_dim} V={m.vocab_size} E={m.num_experts}/{m.num_experts_per_tok}, "
            f"{m.num_params / 1e9:.2f}B params ({m.num_active_params / 1e9:.2f}B active), {m.param_dtype} "
            f"params / {m.dtype} compute\n"
            f"  sampling weights: {self.sampling_dtype or m.param_dtype} "
            f"({'a copy of the matrices' if self.sampling_dtype else 'the masters'})\n"
            f"  update: {self.rows} x {self.row_length} rows, micro_batch_rows={loss.micro_batch_rows}, "
            f"remat={loss.remat}, logits_chunk={loss.logits_chunk}, kl_coef={loss.kl_coef}\n"
            f"  decode: {self.engine_rows} rows, cache {self.cache_length} slots, {bucket(self.max_new_tokens, 16)} "
            f"steps/chunk; "
            f"prefill: {self.engine_rows} x {engine_lib.MAX_FRESH_TOKENS}; "
            f"append: {self.engine_rows} x {engine_lib.MAX_APPEND_TOKENS}"
        )


def make_plan(args, preset: str) -> Plan:
    c = presets.load(preset)
    slice_ = PRESET_SLICES.get(preset)
    if args.topology:
        slice_ = Slice(args.topology, args.topology, tuple(c.mesh.shape))
    if slice_ is None:
        raise ValueError(f"no TPU slice known for preset {preset!r}; pass --topology (and --mesh)")
    chip, chips = chips_of(slice_.topology)
    mesh = resolve_mesh(args.mesh or slice_.mesh, chips)
    model = PUBLISHED_ARCHITECTURES[preset].replace(dtype=c.model.dtype, param_dtype=c.model.param_dtype,
                                                   moe_capacity_factor=c.model.moe_capacity_factor)
    overrides = {k: v for k, v in (("micro_batch_rows", args.micro_batch_rows), ("remat", args.remat),
                                   ("logits_chunk", args.logits_chunk)) if v is not None}
    if args.row_length:
        c.rl.row_length = args.row_length
        c.agent.context_budget = min(c.agent.context_budget, args.row_length)
    loss = dataclasses.replace(config_lib.loss_config(c), **overrides)
    c.rl.micro_batch_rows = loss.micro_batch_rows
    c.mesh.shape = mesh
    c.model.path = "(published architecture)"
    config_lib.validate(c, chips)  # what a run checks first: e.g. micro_batch_rows vs the data-parallel size
    data_parallel = mesh[0] * mesh[1]
    agent = config_lib.agent_config(c)
    sampling = resolve_sampling_dtype(args.sampling_dtype or c.model.sampling_dtype, "tpu")
    _, masters = abstract_model(model)
    copies = any(_casts(leaf, sampling) for leaf in jax.tree.leaves(masters))  # as SamplingWeights decides
    return Plan(
        preset=preset, slice=slice_, chip=chip, chips=chips, mesh=mesh, model=model, loss=loss,
        optim=config_lib.optim_config(c), rows=args.rows or update_rows(c, data_parallel),
        row_length=c.rl.row_length, engine_rows=bucket(args.engine_rows or agent.rows, 1, data_parallel),
        cache_length=engine_lib.cache_bucket(agent.context_budget),
        max_new_tokens=agent.max_new_tokens, truncate=agent.top_k > 0 or agent.top_p < 1,
        with_old_logprobs=c.rl.updates_per_iteration > 1, moments_as_trainer=args.moments_as_trainer,
        page_size=args.page_size, paged_attention=args.paged_attention,
        sampling_dtype=sampling.name if copies else None,
    )


# ---- lowering onto abstract devices ---------------------------------------------------------


def abstract(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def sampling_copy(tree, dtype: str | None):
    """Abstract arrays of the samplers' weights: the leaves `_casts` casts in `dtype`, the rest as
    they are, every leaf with its sharding (None: the masters themselves)."""
    dtype = jax.numpy.dtype(dtype) if dtype else None
    return jax.tree.map(lambda x: abstract(x.shape, dtype if _casts(x, dtype) else x.dtype, x.sharding), tree)


def placed_like_inputs(host: dict, mesh, rules) -> dict:
    """Abstract arrays with the shardings `engine.place_inputs` gives those host arrays."""
    out = {}
    for name, value in host.items():
        axes = ("batch",) + (None,) * (value.ndim - 1) if name.endswith(("_B", "_BT")) else (None,) * value.ndim
        out[name] = abstract(value.shape, value.dtype, NamedSharding(mesh, logical_to_spec(axes, value.shape, mesh, rules)))
    return out


class Programs:
    """The preset's programs lowered onto `mesh`; each `lower_*` returns a `jax.stages.Lowered`."""

    def __init__(self, plan: Plan, devices):
        self.plan, self.devices = plan, devices
        self.mesh = make_mesh(plan.mesh, devices)
        self.rules = TRAIN_RULES
        graphdef, state = abstract_model(plan.model)
        shardings = param_shardings(state, self.mesh, self.rules)
        state = jax.tree.map(lambda x, s: abstract(x.shape, x.dtype, s), state, shardings)
        self.graphdef, self.state = graphdef, state
        self.policy = Policy(nnx.merge(graphdef, state), plan.model, None, self.mesh, self.rules)
        self.sampling_state = sampling_copy(state, plan.sampling_dtype)
        self.sampling_policy = Policy(nnx.merge(graphdef, self.sampling_state), plan.model, None, self.mesh,
                                      self.rules)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self._resident = None

    def _trainer(self) -> Trainer:
        """A `Trainer` with what `_update_fn` reads (`__init__` runs concrete code on the devices)."""
        trainer = object.__new__(Trainer)
        trainer.policy, trainer.loss_config, trainer.graphdef = self.policy, self.plan.loss, self.graphdef
        trainer.optimizer = make_optimizer(self.plan.optim)
        return trainer

    def _train_state(self, optimizer):
        """Abstract parameters and optimizer state with their shardings.

        By default the moments are sharded like their parameters (what an FSDP update needs).
        With `plan.moments_as_trainer` they are placed as `Trainer.__init__` places them today:
        `jit(init)`'s output shardings, committed; its zeros do not follow the parameters, so
        they come out replicated.
        """
        params = nnx.to_pure_dict(self.state)
        param_sh = jax.tree.map(lambda x: x.sharding, params)
        shapes = jax.eval_shape(optimizer.init, params)
        if self.plan.moments_as_trainer:
            init_out = jax.jit(optimizer.init).lower(params).compile().output_shardings
            opt_sh = jax.tree.map(lambda s: s if isinstance(s, NamedSharding) else self.replicated, init_out)
        else:
            opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, shapes, param_sh,
                                           transform_non_params=lambda _: self.replicated)
        opt_state = jax.tree.map(lambda x, s: abstract(x.shape, x.dtype, s), shapes, opt_sh)
        return params, opt_state, param_sh, opt_sh

    def resident_bytes(self) -> dict[str, int]:
        """Per-device bytes that stay in HBM while the engine samples and are not its arguments:
        the masters (when the engine reads a copy), the optimizer state, the KL reference."""
        if self._resident is None:
            params, opt_state, _, _ = self._train_state(make_optimizer(self.plan.optim))
            masters = per_device_bytes(params)
            self._resident = {"masters": masters if self.plan.sampling_dtype else 0,
                              "optimizer": per_device_bytes(opt_state),
                              "kl_reference": masters if self.plan.loss.kl_coef > 0 else 0}
        return self._resident

    def decode_bound_inputs(self) -> dict:
        """`decode_bound`'s arguments for this plan: the sampling weights' bytes per device, and the
        rows and KV heads per device of the contiguous cache."""
        plan, engine = self.plan, self._engine()
        k_sharding = engine._cache_shardings(plan.cache_length)[0][0]
        rows, kv_heads = k_sharding.shard_shape((engine.rows, plan.model.num_kv_heads, plan.model.head_dim,
                                                 plan.cache_length))[:2]
        return dict(weight_bytes=per_device_bytes(self.sampling_state), rows_per_device=rows,
                    cache_length=plan.cache_length, layers=plan.model.num_layers, kv_heads_per_device=kv_heads,
                    head_dim=plan.model.head_dim, cache_itemsize=np.dtype(jax.numpy.dtype(plan.model.dtype)).itemsize,
                    hbm_bytes_per_s=CHIPS[plan.chip].hbm_bytes_per_s)

    def lower_update(self):
        plan, trainer = self.plan, self._trainer()
        params, opt_state, param_sh, opt_sh = self._train_state(trainer.optimizer)
        batch_axes = tuple(a for a in ("data", "fsdp") if self.mesh.shape[a] > 1)
        row_sharding = NamedSharding(self.mesh, PartitionSpec(batch_axes or None, None))
        example = pack([TrainSequence(np.zeros(2, np.int32), np.ones(2, bool), np.zeros(2, np.float32), 0.0)], 4)
        arrays = {name: abstract((plan.rows, plan.row_length), a.dtype, row_sharding)
                  for name, a in example.arrays().items()}
        if plan.with_old_logprobs:
            arrays["old_logprobs_RT"] = abstract((plan.rows, plan.row_length), np.float32, row_sharding)
        ref = params if plan.loss.kl_coef > 0 else None
        return jax.jit(trainer._update_fn, donate_argnums=(0, 1),
                       out_shardings=(param_sh, opt_sh, self.replicated)).lower(params, opt_state, arrays, ref)

    def lower_optimizer_step(self):
        """The once-per-update part of `_update_fn` after the gradients: the optimizer and the norm."""
        optimizer = make_optimizer(self.plan.optim)
        params, opt_state, param_sh, opt_sh = self._train_state(optimizer)

        def step(grads, opt_state, params):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, optax.tree.norm(grads)

        return jax.jit(step, donate_argnums=(1, 2), out_shardings=(param_sh, opt_sh, self.replicated)).lower(
            params, opt_state, params)

    def lower_accumulate(self):
        """The micro-batch loop's gradient sum, once per micro-batch (`jnp.add` over the parameters)."""
        params = nnx.to_pure_dict(self.state)
        sh = jax.tree.map(lambda x: x.sharding, params)
        return jax.jit(lambda a, b: jax.tree.map(jax.numpy.add, a, b), donate_argnums=(0,), out_shardings=sh).lower(
            params, params)

    def _engine(self, paged: bool = False):
        plan = self.plan
        paging = dict(kv_cache="paged", page_size=plan.page_size, paged_attention=plan.paged_attention) if paged else {}
        return engine_lib.RowEngine(self.sampling_policy, plan.engine_rows, max_new_tokens=plan.max_new_tokens,
                                    stop_token_ids=QWEN3_STOP_IDS, **paging)

    def _cache(self, engine):
        shardings = engine._cache_shardings(self.plan.cache_length)
        shapes = jax.eval_shape(lambda: engine_lib._init_cache(self.plan.model, engine.rows, self.plan.cache_length,
                                                               None, None))
        return [tuple(abstract(x.shape, x.dtype, s) for x, s in zip(kv, kv_sh)) for kv, kv_sh in zip(shapes, shardings)]

    def lower_decode(self, paged: bool = False):
        """`RowEngine._run_decode`'s program (`paged`: `_run_paged_decode`'s, a pool holding every
        row's `cache_length` slots): every row active, a chunk of `decode_steps` steps."""
        plan = self.plan
        engine = self._engine(paged)
        R = engine.rows
        host = {
            "last_B": np.zeros(R, np.int32), "lengths_B": np.zeros(R, np.int32), "active_B": np.ones(R, bool),
            "reply_len_B": np.zeros(R, np.int32), "limit_B": np.zeros(R, np.int32),
            "stream_B": np.zeros(R, np.uint32), "turn_B": np.zeros(R, np.uint32),
            **engine.settings_B(np.arange(R)), **engine._scalars, "exit_after": np.asarray(1, np.int32),
            "shrink_at": np.asarray(0, np.int32),
        }
        if paged:
            host["page_table_BM"] = np.zeros((R, plan.cache_length // plan.page_size), np.int32)
            pages = engine._pages  # a block per batch shard: its trash page and its rows' pages
            num_pages = pages.shards * (1 + pages.rows_per_shard * (plan.cache_length // plan.page_size))
            shardings = engine._pool_shardings(num_pages)
            shapes = jax.eval_shape(lambda: paged_cache.init_pools(plan.model, num_pages, plan.page_size,
                                                                   engine.paged_attention))
            cache = jax.tree.map(lambda x, sh: abstract(x.shape, x.dtype, sh), shapes, shardings)
        else:
            shardings, cache = engine._cache_shardings(plan.cache_length), self._cache(engine)
        args = placed_like_inputs(host, self.mesh, self.rules)
        # Mosaic asks the current device which TPU it lowers for; on this CPU host that is the
        # mesh's abstract device (a TPU of the topology), not the default CPU device.
        with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
            return jax.jit(
                engine_lib._decode, static_argnames=("graphdef", "num_steps", "truncate", "attention", "mesh", "rules"),
                donate_argnums=(1,), out_shardings=(self.replicated, shardings),
            ).lower(engine._state, cache, *(args.get(n) for n in engine_lib._DECODE_INPUTS),
                    graphdef=engine._graphdef, num_steps=engine.num_steps, truncate=plan.truncate,
                    attention=engine.paged_attention, mesh=self.mesh, rules=self.rules)

    def lower_append(self, fresh: bool):
        """`RowEngine._run_append_pass`'s program over every row: fresh = a prefill into empty rows."""
        engine, plan = self._engine(), self.plan
        A = engine.rows
        T = engine_lib.MAX_FRESH_TOKENS if fresh else engine_lib.MAX_APPEND_TOKENS
        host = {"rows_A": np.arange(A, dtype=np.int32), "tokens_AT": np.zeros((A, T), np.int32),
                "starts_A": np.zeros(A, np.int32), "lengths_A": np.zeros(A, np.int32)}
        args = placed_like_inputs(host, self.mesh, self.rules)
        return jax.jit(
            engine_lib._append, static_argnames=("graphdef", "with_history", "mesh", "rules"), donate_argnums=(1,),
            out_shardings=engine._cache_shardings(plan.cache_length),
        ).lower(engine._state, self._cache(engine), *(args[n] for n in ("tokens_AT", "starts_A", "lengths_A", "rows_A")),
                graphdef=engine._graphdef, with_history=not fresh, mesh=self.mesh, rules=self.rules)


PROGRAMS = ("update", "decode", "decode_paged", "prefill", "append")
ENGINE_PROGRAMS = ("decode", "decode_paged", "prefill", "append")
DECODE_PROGRAMS = ("decode", "decode_paged")


@contextlib.contextmanager
def short_scans_unrolled():
    """Every `jax.lax.scan` of length <= 2 traced inside is unrolled (the modules call it as `jax.lax.scan`)."""
    scan = jax.lax.scan

    def unrolled(f, init, xs=None, length=None, **kwargs):
        n = length if length is not None else jax.tree.leaves(xs)[0].shape[0]
        return scan(f, init, xs, length, **{**kwargs, "unroll": n <= 2})

    jax.lax.scan = unrolled
    try:
        yield
    finally:
        jax.lax.scan = scan


def counts(compiled) -> np.ndarray:
    """(FLOPs, bytes accessed) per device of one execution, as the compiler counts them."""
    cost = _cost(compiled)
    return np.asarray([cost.get("flops", 0.0), cost.get("bytes accessed", 0.0)], np.float64)


def update_counts(plan: Plan, devices) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes) per device of one update: (once per update, per micro-batch).

    The compiler counts a loop body once whatever its trip count, and the update loops over
    micro-batches, over layers and over LM-head chunks. So three probes compile the update of
    one micro-batch with the layer scan unrolled: 1 layer, 2 layers, and 1 layer with chunks
    twice as long. Their differences give a layer's and a head chunk's counts; the optimizer
    step and the micro-batch gradient sum are compiled on their own at the full size. Every
    head chunk is counted as computed (the update skips chunks past the longest row's masked
    targets): a ceiling on work, hence on time.
    """
    mb = plan.loss.micro_batch_rows or plan.rows
    probes = {}
    for layers, chunk in ((1, plan.loss.logits_chunk), (2, plan.loss.logits_chunk), (1, 2 * plan.loss.logits_chunk)):
        probe = dataclasses.replace(plan, model=plan.model.replace(num_layers=layers), rows=mb,
                                    loss=dataclasses.replace(plan.loss, micro_batch_rows=mb, logits_chunk=chunk))
        programs = Programs(probe, devices)
        print(f"[{time.strftime('%H:%M:%S')}]   cost probe: {layers} layer(s), logits_chunk {chunk}", flush=True)
        with short_scans_unrolled():
            probes[layers, chunk] = counts(programs.lower_update().compile())
        probes[layers, chunk] -= counts(programs.lower_optimizer_step().compile())
    full = Programs(plan, devices)
    C = plan.loss.logits_chunk
    one_layer, two_layers, long_chunks = probes[1, C], probes[2, C], probes[1, 2 * C]
    layer = two_layers - one_layer
    chunks = -(-plan.row_length // C) if C and C < plan.row_length else 1
    head_chunk = long_chunks - one_layer if chunks > 1 else 0.0
    micro = one_layer - layer + plan.model.num_layers * layer + (chunks - 1) * head_chunk
    if plan.rows > mb:
        micro = micro + counts(full.lower_accumulate().compile())
    return counts(full.lower_optimizer_step().compile()), micro


def per_device_bytes(tree) -> int:
    """Bytes one device holds of a tree of abstract arrays: each leaf's shard under its sharding."""
    return sum(math.prod(x.sharding.shard_shape(tuple(x.shape))) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree))


def decode_bound(*, weight_bytes: int, rows_per_device: int, cache_length: int, layers: int,
                 kv_heads_per_device: int, head_dim: int, cache_itemsize: int,
                 hbm_bytes_per_s: float) -> tuple[int, float]:
    """(bytes, seconds) a decode step reads per device at least: every weight, and the K and V of
    every layer with every row full (`cache_length` slots), at the chip's HBM bandwidth."""
    kv = rows_per_device * cache_length * layers * 2 * kv_heads_per_device * head_dim * cache_itemsize
    return weight_bytes + kv, (weight_bytes + kv) / hbm_bytes_per_s


def roofline_seconds(flops_bytes: np.ndarray, chip: Chip) -> float:
    return float(max(flops_bytes[0] / chip.peak_bf16, flops_bytes[1] / chip.hbm_bytes_per_s))


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    return cost[0] if isinstance(cost, (list, tuple)) else cost


def optimal_seconds(compiled) -> float:
    """The compiler's roofline seconds of one execution, mended: libtpu 0.0.42.1's cost model
    counts -1 s for each `ConcatBitcast` custom call (a 2- and a 3-layer prefill: -19.992 s with
    20 of them, -38.985 s with 39), so those are added back."""
    concat_bitcasts = compiled.as_text().count('custom_call_target="ConcatBitcast"')
    return float(_cost(compiled).get("optimal_seconds", 0.0)) + concat_bitcasts


def tokens_per_execution(plan: Plan, program: str) -> int:
    return {
        "update": plan.rows * plan.row_length,
        "decode": plan.engine_rows,
        "decode_paged": plan.engine_rows,
        "prefill": plan.engine_rows * engine_lib.MAX_FRESH_TOKENS,
        "append": plan.engine_rows * engine_lib.MAX_APPEND_TOKENS,
    }[program]


def shape_of(plan: Plan, program: str) -> str:
    return {
        "update": f"{plan.rows}x{plan.row_length} mb={plan.loss.micro_batch_rows or plan.rows} remat={plan.loss.remat}",
        "decode": f"{plan.engine_rows} rows, cache {plan.cache_length}",
        "decode_paged": f"{plan.engine_rows} rows, {plan.cache_length // plan.page_size} pages of {plan.page_size}, "
                        f"{plan.paged_attention}",
        "prefill": f"{plan.engine_rows}x{engine_lib.MAX_FRESH_TOKENS}, cache {plan.cache_length}",
        "append": f"{plan.engine_rows}x{engine_lib.MAX_APPEND_TOKENS}, cache {plan.cache_length}",
    }[program]


def measure(plan: Plan, programs: Programs, program: str, with_update_cost: bool = True) -> dict:
    """Lowers and compiles one program; its row (a RESOURCE_EXHAUSTED compile is a row too)."""
    chip = CHIPS[plan.chip]
    row = {"preset": plan.preset, "slice": plan.slice.name, "topology": plan.slice.topology, "mesh": list(plan.mesh),
           "program": program, "shape": shape_of(plan, program), "hbm_gib": chip.hbm_gib}
    resident = 0
    if program in ENGINE_PROGRAMS:
        parts = programs.resident_bytes()
        resident = sum(parts.values())
        row.update(sampling_dtype=plan.sampling_dtype or plan.model.param_dtype, resident_gib=resident / GIB,
                   **{f"resident_{k}_gib": v / GIB for k, v in parts.items()})
    start = time.perf_counter()
    lower = {"update": programs.lower_update, "decode": programs.lower_decode,
             "decode_paged": lambda: programs.lower_decode(paged=True),
             "prefill": lambda: programs.lower_append(fresh=True),
             "append": lambda: programs.lower_append(fresh=False)}[program]
    lowered = lower()
    row["lower_s"] = time.perf_counter() - start
    start = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as e:  # the TPU compiler's out-of-memory is an XlaRuntimeError
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        row.update(fits=False, compile_s=time.perf_counter() - start, error=_oom_summary(str(e)),
                   error_detail=str(e)[:4000])
        return row
    row["compile_s"] = time.perf_counter() - start
    mem = compiled.memory_analysis()
    sizes = {k: getattr(mem, f"{k}_size_in_bytes") for k in ("argument", "output", "alias", "temp", "generated_code")}
    peak = getattr(mem, "peak_memory_in_bytes", 0) or (sizes["argument"] + sizes["output"] - sizes["alias"]
                                                        + sizes["temp"])
    flops_bytes = counts(compiled)
    row.update(fits=peak + resident <= chip.hbm_gib * GIB, peak_gib=peak / GIB, **{f"{k}_gib": v / GIB for k, v in sizes.items()},
               compiler_flops=flops_bytes[0], compiler_bytes=flops_bytes[1], compiler_seconds=optimal_seconds(compiled))
    if program == "update":
        if not with_update_cost:
            return row
        start = time.perf_counter()
        once, micro = update_counts(plan, programs.devices)
        row["probes_s"] = time.perf_counter() - start
        n = plan.rows // (plan.loss.micro_batch_rows or plan.rows)
        flops_bytes = once + n * micro
        seconds = roofline_seconds(once, chip) + n * roofline_seconds(micro, chip)
    else:  # a decode execution is costed as one loop iteration: one token for every row
        seconds = roofline_seconds(flops_bytes, chip)
    if program in DECODE_PROGRAMS:
        bound_bytes, bound = decode_bound(**programs.decode_bound_inputs())
        row.update(bound_bytes=bound_bytes, bound_s=bound, roofline_over_bound=seconds / bound)
    tokens = tokens_per_execution(plan, program)
    row.update(flops=float(flops_bytes[0]), bytes=float(flops_bytes[1]), compute_s=flops_bytes[0] / chip.peak_bf16,
               roofline_s=seconds, tokens=tokens, tokens_per_s=tokens / seconds if seconds > 0 else None)
    if program == "update" and seconds > 0:
        model_flops = 6 * plan.model.num_active_params * tokens
        row["mfu_ceiling"] = model_flops / (seconds * plan.chips * chip.peak_bf16)
        row["model_flops_share"] = model_flops / (flops_bytes[0] * plan.chips)  # the MFU at 100% FLOP use
    return row


def _oom_summary(message: str) -> str:
    """The compiler's out-of-memory line (it names the sizes), without the per-buffer listing."""
    lines = [l.strip() for l in message.splitlines() if l.strip()]
    keep = [l for l in lines if re.search(r"RESOURCE_EXHAUSTED|[Uu]sed|exceed|[0-9.]+[GM]i?B? ", l)][:3]
    return " | ".join(keep or lines[:1])[:400]


# ---- output ---------------------------------------------------------------------------------

COLUMNS = ("preset", "slice", "mesh", "program", "shape", "fits", "peak GiB / HBM", "resident GiB", "args GiB",
           "temp GiB", "TFLOP/dev", "GB/dev", "weights+KV GB/dev", "compute s", "roofline s", "bound s",
           "roofline / bound", "compiler s", "tokens/s ceiling", "MFU ceiling", "model FLOP share", "compile s")


def table_row(r: dict) -> str:
    def f(x, fmt):
        return "" if x is None else format(x, fmt)

    cells = {"preset": r["preset"], "slice": r["slice"], "mesh": str(tuple(r["mesh"])), "program": r["program"],
             "shape": r["shape"], "resident GiB": f(r.get("resident_gib"), ".2f"), "compile s": f(r["compile_s"], ".0f")}
    if "error" in r:
        cells.update({"fits": "does not fit", "peak GiB / HBM": r["error"]})
    else:
        cells.update({
            "fits": "yes" if r["fits"] else "NO", "peak GiB / HBM": f"{r['peak_gib']:.2f} / {r['hbm_gib']:g}",
            "args GiB": f(r["argument_gib"], ".2f"), "temp GiB": f(r["temp_gib"], ".2f"),
            "TFLOP/dev": f(r.get("flops") and r["flops"] / 1e12, ".2f"),
            "GB/dev": f(r.get("bytes") and r["bytes"] / 1e9, ".1f"),
            "weights+KV GB/dev": f(r.get("bound_bytes") and r["bound_bytes"] / 1e9, ".2f"),
            "compute s": f(r.get("compute_s"), ".4g"), "roofline s": f(r.get("roofline_s"), ".4g"),
            "bound s": f(r.get("bound_s"), ".4g"), "roofline / bound": f(r.get("roofline_over_bound"), ".2f"),
            "compiler s": f(r["compiler_seconds"], ".4g"), "tokens/s ceiling": f(r.get("tokens_per_s"), ",.0f"),
            "MFU ceiling": f(r.get("mfu_ceiling"), ".1%"), "model FLOP share": f(r.get("model_flops_share"), ".1%")})
    return "| " + " | ".join(cells.get(c, "") for c in COLUMNS) + " |"


def markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)
    return "\n".join([head] + [table_row(r) for r in rows])


def topology_devices(plan: Plan):
    from jax.experimental import topologies

    extra = {"chip_config_name": "megacore"} if CHIPS[plan.chip].megacore else {}
    devices = topologies.get_topology_desc(topology_name=plan.slice.topology, platform="tpu", **extra).devices
    if len(devices) != plan.chips:
        raise RuntimeError(f"{plan.slice.topology}: libtpu gave {len(devices)} devices for {plan.chips} chips")
    return devices


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", action="append", help="preset name (repeatable); default: every preset with a slice")
    p.add_argument("--topology", help="libtpu topology, e.g. v5p:2x2x2 (default: the preset's slice)")
    p.add_argument("--mesh", type=lambda s: tuple(int(x) for x in s.split(",")), help="data,fsdp,tensor")
    p.add_argument("--programs", default=",".join(PROGRAMS), help=f"comma-separated subset of {PROGRAMS}")
    p.add_argument("--micro_batch_rows", type=int, help="override rl.micro_batch_rows")
    p.add_argument("--remat", help="override rl.remat")
    p.add_argument("--logits_chunk", type=int, help="override rl.logits_chunk")
    p.add_argument("--row_length", type=int, help="override rl.row_length (agent.context_budget at most this)")
    p.add_argument("--rows", type=int, help="update rows (default: update_rows, the largest batch the preset packs)")
    p.add_argument("--engine_rows", type=int, help="override agent.rows (rollout engine rows)")
    p.add_argument("--page_size", type=int, default=engine_lib.PAGE_SIZE, help="decode_paged: slots per page")
    p.add_argument("--paged_attention", default="kernel", choices=("kernel", "xla"),
                   help="decode_paged: the ragged paged attention TPU kernel, or the XLA gather path")
    p.add_argument("--sampling_dtype", choices=SAMPLING_DTYPES,
                   help="override model.sampling_dtype (resolved for tpu) for the engine programs' weights")
    p.add_argument("--moments_as_trainer", action="store_true",
                   help="place the Adam moments as Trainer.__init__ does today (replicated) instead of like the params")
    p.add_argument("--no_update_cost", action="store_true", help="skip the update's cost probes (memory only)")
    p.add_argument("--out", help="JSON file for the rows (rewritten after each program)")
    p.add_argument("--dry_run", action="store_true", help="print the plan, compile nothing")
    args = p.parse_args(argv)
    programs = [x for x in args.programs.split(",") if x]
    if unknown := set(programs) - set(PROGRAMS):
        p.error(f"unknown programs {sorted(unknown)}; choose from {PROGRAMS}")
    names = args.preset or [n for n in PRESET_SLICES if n in presets.names()]
    plans = []
    for name in names:
        try:
            plans.append(make_plan(args, name))
        except ValueError as e:  # a preset that its slice's run would refuse: say why, go on
            print(f"{name}: not runnable as planned: {e}", flush=True)
            continue
        print(plans[-1].describe(), flush=True)
    if args.dry_run:
        return 0
    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs", flush=True)
    rows = []
    for plan in plans:
        compiled_for = Programs(plan, topology_devices(plan))
        for program in programs:
            print(f"[{time.strftime('%H:%M:%S')}] {plan.preset} {plan.slice.name} {program}: compiling ...", flush=True)
            row = measure(plan, compiled_for, program, with_update_cost=not args.no_update_cost)
            rows.append(row)
            print(f"[{time.strftime('%H:%M:%S')}] " + table_row(row), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
