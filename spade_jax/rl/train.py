"""The XLA-compiled update: one optimizer step over a packed batch of both roles.

`Trainer` owns the optimizer state and updates the policy's parameters (the master weights)
in place (`nnx.update`), then refreshes the weights the samplers read (`sampling_policy`: the
masters themselves, or a bfloat16 copy, freed during the update and cast again after it,
`models/sampling_weights.py`), so the sampler always sees the newest weights. The step is a single
`jax.jit` with explicit in/out shardings and a donated state; micro-batches run under
`lax.scan` and their gradients of the loss *sums* are added, then divided by the total
token count, which is exact whatever the number of tokens in each micro-batch.

Memory: each transformer block is rematerialised per `LossConfig.remat` (default "dots":
weight-matmul outputs kept, attention recomputed), and the LM head + log-softmax run in
rematerialised chunks over the masked targets only, so neither the `(R, heads, T, T)`
attention probabilities of every layer nor `(R, T, V)` logits are ever stored.

For a mixture-of-experts model the update also reports what the routers did (`router_*`
metrics; the per-layer, per-expert load of the last update in `Trainer.router_load_LE`).

Two objectives share the machinery: `"pg"` (clipped policy gradient, `rl/losses.py`)
for self-play and `"nll"` (token cross-entropy on the masked tokens) for supervised
bootstrapping.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from spade_jax.models.moe import RouterStats, load_balancing_loss
from spade_jax.models.policy import Policy
from spade_jax.models.sampling_weights import SamplingWeights
from spade_jax.models.sharding import activation_sharding, param_shardings
from spade_jax.models.transformer import REMAT_POLICIES
from spade_jax.rl import losses
from spade_jax.rl.batch import ROLE_IDS, TrainBatch


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with global-norm clipping and linear warmup to a constant (or cosine) rate."""

    lr: float = 1e-6
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-8
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"  # "constant" | "cosine"
    total_steps: int = 0  # cosine decay horizon


@dataclasses.dataclass(frozen=True)
class LossConfig:
    objective: str = "pg"  # "pg" | "nll"
    eps_low: float = 0.2
    eps_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0  # k3 KL to the policy the Trainer was built with (a separate copy of its weights)
    micro_batch_rows: int = 0  # rows per micro-batch; 0 = the whole batch at once
    remat: str = "dots"  # per-layer rematerialisation, a key of models.transformer.REMAT_POLICIES
    logits_chunk: int = 128  # positions per chunk of the LM head + log-softmax; 0 = all at once
    # Switch-style load-balancing term for MoE routers (models/moe.py), per target token. Off by
    # default: the reference fine-tunes its MoE base without one, and a pretrained router is
    # already balanced; watch `router_load_max` and turn it on if experts collapse.
    router_aux_coef: float = 0.0


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    if cfg.schedule == "constant":
        schedule = optax.constant_schedule(cfg.lr)
        if cfg.warmup_steps:
            schedule = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
            schedule = optax.join_schedules([schedule, optax.constant_schedule(cfg.lr)], [cfg.warmup_steps])
    elif cfg.schedule == "cosine":
        if cfg.total_steps <= cfg.warmup_steps:
            raise ValueError("cosine schedule needs total_steps > warmup_steps")
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, cfg.lr, max(cfg.warmup_steps, 1), cfg.total_steps, end_value=cfg.lr * 0.1
        )
    else:
        raise ValueError(f"unknown lr schedule {cfg.schedule!r}; choose constant or cosine")
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )


class Trainer:
    """Optimizer state plus the compiled update for one `Policy`; `sampling_dtype` ("auto",
    "float32" or "bfloat16"; None: the masters) is the dtype of the weights the samplers read
    (`sampling_policy`)."""

    def __init__(self, policy: Policy, optim: OptimConfig = OptimConfig(), loss: LossConfig = LossConfig(),
                 sampling_dtype: str | None = None):
        if loss.objective not in ("pg", "nll"):
            raise ValueError(f"unknown objective {loss.objective!r}; choose pg or nll")
        if loss.remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat policy {loss.remat!r}; choose one of {sorted(REMAT_POLICIES)}")
        if loss.logits_chunk < 0:
            raise ValueError(f"logits_chunk must be >= 0 (0 = no chunking), got {loss.logits_chunk}")
        self.policy = policy
        self.optim_config = optim
        self.loss_config = loss
        self.optimizer = make_optimizer(optim)
        self.graphdef, params = nnx.split(policy.model)
        mesh = policy.mesh
        self._param_shardings = nnx.to_pure_dict(param_shardings(params, mesh, policy.rules))
        self._replicated = NamedSharding(mesh, PartitionSpec())
        batch_axes = tuple(a for a in ("data", "fsdp") if mesh.shape[a] > 1)
        self.data_parallel = int(np.prod([mesh.shape[a] for a in batch_axes] or [1]))
        self._row_sharding = NamedSharding(mesh, PartitionSpec(batch_axes or None, None))
        pure = nnx.to_pure_dict(params)
        # Adam's moments sharded like their parameters (left to propagation, zeros come out
        # replicated: every device would hold the whole optimizer state), the rest replicated;
        # committed, and returned by the update with the same shardings, so the second call
        # does not compile again.
        opt_shardings = optax.tree_map_params(
            self.optimizer, lambda _, sharding: sharding, jax.eval_shape(self.optimizer.init, pure),
            self._param_shardings, transform_non_params=lambda _: self._replicated)
        self.opt_state = jax.jit(self.optimizer.init, out_shardings=opt_shardings)(pure)
        self.step = 0
        self.router_load_LE: np.ndarray | None = None
        # The KL reference is a copy: the update donates the live parameters' buffers.
        self.ref_params = (jax.jit(lambda tree: jax.tree.map(jnp.copy, tree), out_shardings=self._param_shardings)(pure)
                           if loss.kl_coef > 0 else None)
        self._update = jax.jit(
            self._update_fn,
            donate_argnums=(0, 1),
            out_shardings=(self._param_shardings, opt_shardings, self._replicated),
        )
        self._logprobs = jax.jit(self._logprobs_fn)
        self.sampling = SamplingWeights(policy, sampling_dtype)

    # ---- host API -------------------------------------------------------------------------

    @property
    def params(self) -> dict:
        return nnx.to_pure_dict(nnx.state(self.policy.model))

    @property
    def sampling_policy(self) -> Policy:
        """The policy to sample with: the masters, or their copy in `sampling_dtype` (refreshed
        whenever the masters change)."""
        return self.sampling.policy

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint needs to continue the optimisation exactly."""
        return {"params": self.params, "opt_state": self.opt_state, "step": self.step}

    def _set_params(self, pure_params: dict) -> None:
        state = nnx.state(self.policy.model)
        nnx.replace_by_pure_dict(state, pure_params)
        nnx.update(self.policy.model, state)
        self.sampling.refresh()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._set_params(state["params"])
        self.opt_state = state["opt_state"]
        self.step = int(state["step"])

    def device_batch(self, batch: TrainBatch) -> dict[str, jax.Array]:
        """Global arrays of the batch rows, sharded over the data-parallel axes (multi-process safe)."""
        if batch.num_rows % self.data_parallel:
            raise ValueError(
                f"batch of {batch.num_rows} rows is not divisible by the data-parallel size "
                f"{self.data_parallel}; pack with row_multiple={self.data_parallel}"
            )
        out = {}
        for name, host in batch.arrays().items():
            out[name] = jax.make_array_from_callback(
                host.shape, self._row_sharding, lambda index, host=host: host[index]
            )
        return out

    def logprobs(self, batch: TrainBatch) -> np.ndarray:
        """Trainer-side log-probs of every target, `(R, T)` (the PPO anchor)."""
        arrays = self.device_batch(batch)
        return np.asarray(self._logprobs(self.params, arrays))

    def update(self, batch: TrainBatch, old_logprobs_RT: np.ndarray | None = None) -> dict[str, float]:
        """One optimizer step. Without `old_logprobs_RT` the anchor is the current policy."""
        start = time.perf_counter()
        arrays = self.device_batch(batch)
        if old_logprobs_RT is not None:
            arrays["old_logprobs_RT"] = jax.make_array_from_callback(
                old_logprobs_RT.shape, self._row_sharding, lambda i: np.asarray(old_logprobs_RT, np.float32)[i]
            )
        self.sampling.release()  # the update never reads the samplers' copy: its memory is the update's
        params, self.opt_state, metrics = self._update(self.params, self.opt_state, arrays, self.ref_params)
        self._set_params(params)
        self.step += 1
        metrics = jax.device_get(metrics)
        if "router_load_LE" in metrics:
            self.router_load_LE = np.asarray(metrics.pop("router_load_LE"))
        metrics = {k: float(v) for k, v in metrics.items()}
        elapsed = time.perf_counter() - start
        metrics["step_time_s"] = elapsed
        metrics["tokens_per_s"] = float(batch.target_mask_RT.sum() + (batch.segment_ids_RT > 0).sum()) / elapsed
        return metrics

    # ---- compiled functions --------------------------------------------------------------

    def _token_logprobs(self, params, arrays, with_entropy: bool, only_masked: bool):
        """Log-probs of the targets `(R, T)`, the entropies if asked (else None), and the
        routers' `RouterStats` (None for a dense model).

        The LM head runs through `_chunked_head`; with `only_masked` it runs only at the
        masked targets, the only ones the loss reads, and other positions hold 0.
        """
        cfg = self.loss_config
        model = nnx.merge(self.graphdef, params)
        with activation_sharding(self.policy.mesh, self.policy.rules):
            hidden_RTD, router = model.hidden_and_router_stats(
                arrays["tokens_RT"], arrays["positions_RT"], arrays["segment_ids_RT"], remat=cfg.remat
            )

            def head(hidden_RCD, targets_RC):
                logits_RCV = model.logits_from_hidden(hidden_RCD)
                if with_entropy:
                    return losses.token_logprobs_and_entropy(logits_RCV, targets_RC)
                return losses.token_logprobs(logits_RCV, targets_RC), None

            mask_RT = arrays["target_mask_RT"].astype(bool) if only_masked else None
            return (*_chunked_head(head, hidden_RTD, arrays["targets_RT"], cfg.logits_chunk, mask_RT), router)

    def _logprobs_fn(self, params, arrays):
        return self._token_logprobs(params, arrays, with_entropy=False, only_masked=False)[0]

    def _micro_terms(self, params, micro, ref_params):
        cfg = self.loss_config
        mask_RT = micro["target_mask_RT"]
        if cfg.objective == "nll":
            logp_RT, _, router = self._token_logprobs(params, micro, with_entropy=False, only_masked=True)
            weighted = mask_RT * micro["weights_RT"]
            terms = losses.PGLossTerms(
                loss_sum=-jnp.sum(weighted * logp_RT),
                token_count=jnp.sum(mask_RT),
                metrics={"nll_sum": -jnp.sum(mask_RT * jax.lax.stop_gradient(logp_RT))},
            )
            return self._with_router(terms, router)
        logp_RT, entropy_RT, router = self._token_logprobs(params, micro, with_entropy=True, only_masked=True)
        ref_logp = None
        if ref_params is not None:
            ref_logp, _, _ = self._token_logprobs(ref_params, micro, with_entropy=False, only_masked=True)
            ref_logp = jax.lax.stop_gradient(ref_logp)
        old = micro.get("old_logprobs_RT", jax.lax.stop_gradient(logp_RT))
        terms = losses.pg_loss_terms(
            logp_RT,
            old,
            micro["advantages_RT"],
            mask_RT,
            sampler_logprobs_BT=micro["sampler_logprobs_RT"],
            weights_B=micro["weights_RT"],
            ref_logprobs_BT=ref_logp,
            kl_coef=cfg.kl_coef,
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            tis_cap=cfg.tis_cap,
            entropy_BT=jnp.where(mask_RT.astype(bool), entropy_RT, 0.0),
        )
        for role, role_id in ROLE_IDS.items():
            terms.metrics[f"{role}_tokens_sum"] = jnp.sum(mask_RT * (micro["roles_RT"] == role_id))
        return self._with_router(terms, router)

    def _with_router(self, terms: losses.PGLossTerms, router: RouterStats | None) -> losses.PGLossTerms:
        """Adds a micro-batch's router counts to its terms (summed over micro-batches; summarised
        by `_router_metrics`) and, with `router_aux_coef`, the load-balancing term per target token."""
        if router is None:
            return terms
        terms.metrics.update(router_load_LE=router.load_E, router_prob_LE=router.prob_E,
                             router_tokens_L=router.tokens, router_dropped=jnp.sum(router.dropped))
        coef = self.loss_config.router_aux_coef
        if coef:
            aux = load_balancing_loss(router, self.policy.config)
            terms = terms._replace(loss_sum=terms.loss_sum + coef * aux * terms.token_count)
        return terms

    def _update_fn(self, params, opt_state, arrays, ref_params):
        rows = arrays["tokens_RT"].shape[0]
        micro_rows = self.loss_config.micro_batch_rows or rows
        if rows % micro_rows:
            raise ValueError(f"{rows} rows do not split into micro-batches of {micro_rows} rows")
        num_micro = rows // micro_rows
        micro_arrays = jax.tree.map(lambda a: a.reshape(num_micro, micro_rows, *a.shape[1:]), arrays)

        def loss_sum_and_terms(p, micro):
            terms = self._micro_terms(p, micro, ref_params)
            return terms.loss_sum, terms

        grad_fn = jax.value_and_grad(loss_sum_and_terms, has_aux=True)

        def micro_step(carry, micro):
            grads_acc, terms_acc = carry
            (_, terms), grads = grad_fn(params, micro)
            return (jax.tree.map(jnp.add, grads_acc, grads), losses.accumulate(terms_acc, terms)), None

        if num_micro == 1:
            (_, terms), grads = grad_fn(params, jax.tree.map(lambda a: a[0], micro_arrays))
        else:
            # Every micro-batch runs in the loop body, from an exact identity carry: one copy of
            # the program, and never two micro-batches' activations alive at once.
            (_, like), _ = jax.eval_shape(grad_fn, params, jax.tree.map(lambda a: a[0], micro_arrays))
            carry = (jax.tree.map(jnp.zeros_like, params), losses.identity_terms(like))
            (grads, terms), _ = jax.lax.scan(micro_step, carry, micro_arrays)
        denom = jnp.maximum(terms.token_count, 1.0)
        grads = jax.tree.map(lambda g: g / denom, grads)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = losses.mean_metrics(terms)
        metrics["grad_norm"] = optax.tree.norm(grads)
        if "router_load_LE" in metrics:
            metrics.update(_router_metrics(metrics, self.policy.config))
        return params, opt_state, metrics


def _router_metrics(metrics: dict, config) -> dict:
    """Summaries of the accumulated router counts (removed from `metrics`):

    `router_load_LE` each expert's share of its layer's assignments over the real tokens
    (1 / E when balanced); `router_load_max` / `router_load_min` the largest / smallest share
    times E over layers and experts (1 when balanced); `router_unused` the fraction of
    (layer, expert) pairs that got no token; `router_dropped` the fraction of assignments a
    capacity dropped (0 when dropless); `router_aux_loss` the load-balancing loss (k when balanced).
    """
    load_LE, prob_LE = metrics.pop("router_load_LE"), metrics.pop("router_prob_LE")
    tokens_L, dropped = metrics.pop("router_tokens_L"), metrics.pop("router_dropped")
    assignments_L = jnp.maximum(tokens_L * config.num_experts_per_tok, 1.0)
    share_LE = load_LE / assignments_L[:, None]
    E = config.num_experts
    return {
        "router_load_LE": share_LE,
        "router_load_max": jnp.max(share_LE) * E,
        "router_load_min": jnp.min(share_LE) * E,
        "router_unused": jnp.mean(load_LE == 0),
        "router_dropped": dropped / jnp.sum(assignments_L),
        "router_aux_loss": load_balancing_loss(RouterStats(load_LE, prob_LE, tokens_L, dropped), config),
    }


def _chunked_head(head, hidden_RTD, targets_RT, chunk: int, mask_RT=None):
    """`head(hidden_RCD, targets_RC) -> (a_RC, b_RC or None)` over chunks of `chunk` positions.

    Each chunk runs under `jax.checkpoint`, so its `(R, chunk, V)` logits live only while
    the chunk is processed, in the forward and in the backward pass (which recomputes
    them): no `(R, T, V)` array exists. With `mask_RT`, each row's masked positions are
    moved to its front first and chunks past the longest row's count are skipped, so the
    head (about a fifth of SmolLM2-135M's FLOPs) runs only where the loss reads it;
    unmasked positions then hold 0. `chunk` 0 (or >= T) runs the head once over everything.
    """
    R, T, D = hidden_RTD.shape
    C = chunk
    if not C or C >= T:
        return head(hidden_RTD, targets_RT)
    if mask_RT is not None:
        order_RT = jnp.argsort(~mask_RT, axis=1, stable=True)
        hidden_RTD = jnp.take_along_axis(hidden_RTD, order_RT[..., None], axis=1)
        targets_RT = jnp.take_along_axis(targets_RT, order_RT, axis=1)
        live = jnp.max(jnp.sum(mask_RT, axis=1))
    n = -(-T // C)
    hidden_nRCD = jnp.pad(hidden_RTD, ((0, 0), (0, n * C - T), (0, 0))).reshape(R, n, C, D).swapaxes(0, 1)
    targets_nRC = jnp.pad(targets_RT, ((0, 0), (0, n * C - T))).reshape(R, n, C).swapaxes(0, 1)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def one_chunk(carry, xs):
        index, hidden_RCD, targets_RC = xs
        if mask_RT is None:
            return carry, head(hidden_RCD, targets_RC)
        out = jax.eval_shape(head, hidden_RCD, targets_RC)
        skipped = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), out)
        return carry, jax.lax.cond(index * C < live, head, lambda *_: skipped, hidden_RCD, targets_RC)

    _, out = jax.lax.scan(one_chunk, None, (jnp.arange(n), hidden_nRCD, targets_nRC))
    out = jax.tree.map(lambda a: a.swapaxes(0, 1).reshape(R, n * C)[:, :T], out)
    if mask_RT is None:
        return out
    inverse_RT = jnp.argsort(order_RT, axis=1)
    return jax.tree.map(lambda a: jnp.where(mask_RT, jnp.take_along_axis(a, inverse_RT, axis=1), 0.0), out)
