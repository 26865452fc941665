"""One training run of the GPT example (train.py) for one recipe: the mesh and its MeshResource,
the sharded training state, the jitted train and held-out steps, the loop with its progress
lines, held-out evaluations and checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import qmesh.jax as qj
from qmesh.jax.flax import logical_axis_rules
from qmesh.jax.recipe import (DelayedScaling, Float8BlockScaling, Float8CurrentScaling,
                               MXFP8BlockScaling, NVFP4BlockScaling, uses_sr)

import checkpoint
import corpus
from accumulate import accumulated_grad
from model import BlockConfig, GPT

AXES = ("dp", "fsdp", "tp")
BATCH_AXES = ("dp", "fsdp")


def make_recipe(name: str, amax_history_len: int, emulate: bool = False):
    """The qmesh recipe of a --recipe name (None: the BF16 baseline); `emulate` runs the MXFP8
    and NVFP4 GEMMs emulated (dequantized, float32 accumulation)."""
    return {"bf16": None, "delayed": DelayedScaling(amax_history_len=amax_history_len),
            "current": Float8CurrentScaling(), "block": Float8BlockScaling(),
            "mxfp8": MXFP8BlockScaling(emulate=emulate),
            "nvfp4": NVFP4BlockScaling(emulate=emulate)}[name]


def make_mesh(args):
    """(mesh, resource, parameter rules) for --dp x --fsdp x --tp over the first devices.

    The parameters' logical axes map as qmesh's logical_axis_rules say (heads/mlp on tp), with
    the hidden ("embed") dimension sharded over fsdp. With fsdp > 1 the MeshResource leaves tp
    unnamed: the modules then add no activation constraints (theirs put the batch on dp only)
    and XLA propagates the batch sharding over dp and fsdp; the tp sharding still comes from
    the parameters."""
    n = args.dp * args.fsdp * args.tp
    devices = jax.devices()
    if len(devices) < n:
        raise ValueError(f"the mesh dp {args.dp} x fsdp {args.fsdp} x tp {args.tp} needs {n} "
                         f"devices, JAX has {len(devices)} (over {jax.process_count()} "
                         "processes): change the mesh, or --cpu-devices on a CPU")
    mesh = jax.make_mesh((args.dp, args.fsdp, args.tp), AXES, devices=devices[:n],
                         axis_types=(AxisType.Auto,) * 3)
    tp = "tp" if args.fsdp == 1 else None
    resource = qj.MeshResource(dp_resource="dp", fsdp_resource="fsdp", tp_resource=tp,
                               tpsp_resource="tp" if args.sp else None)
    rules = tuple(("embed", "fsdp") if name == "embed" else (name, axis) for name, axis in
                  logical_axis_rules(qj.MeshResource(dp_resource="dp", tp_resource="tp")))
    return mesh, resource, rules


class Run:
    """The training of one recipe; train() returns the record it writes to <out>/<recipe>.json."""

    def __init__(self, args, recipe: str):
        self.args, self.recipe = args, recipe
        self.mesh, self.resource, rules = make_mesh(args)
        block = BlockConfig(args.heads, args.ffn,
                            make_recipe(recipe, args.amax_history_len, args.emulate),
                            jnp.bfloat16 if recipe == "bf16" else jnp.float32,
                            jnp.dtype(args.attention_dtype), args.attention)
        self.model = GPT(args.layers, args.hidden, args.seq, block)
        self.train_data, held_out = corpus.load()
        self.held_out = corpus.held_out_batches(held_out, args.eval_batches, args.batch, args.seq)
        self.batch_sharding = NamedSharding(self.mesh, P(BATCH_AXES, None))
        self._build(rules)

    # -- state ------------------------------------------------------------------------------

    def _build(self, rules):
        args, mesh = self.args, self.mesh
        dummy = jnp.zeros((1, args.seq), jnp.int32)
        # qmesh's modules create their parameters in their compute dtype: initialise with the
        # float32 twin, so that every recipe keeps float32 parameters (the bf16 run computes in
        # bfloat16 from them) and starts from the same values. Initialisation runs outside the
        # mesh context: the values do not depend on it, and the modules' activation layout
        # (sequence parallelism) would not take the one-sequence dummy batch.
        f32 = self.model.clone(block=dataclasses.replace(self.model.block,
                                                        gemm_dtype=jnp.float32))

        def init(key):  # (NVFP4's modules also want their stochastic-rounding stream here)
            return f32.init(dict(_rngs(self.sr_key(0)), params=key), dummy)

        boxed = jax.eval_shape(init, jax.random.key(0))
        var_shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
        params = nn.unbox(boxed)["params"]
        schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, args.warmup,
                                                      max(args.steps, args.warmup + 1),
                                                      args.lr * 0.1)
        decay = jax.tree.map(lambda p: p.ndim >= 2 and p.shape[0] != corpus.VOCAB, params)
        self.tx = optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=args.weight_decay,
                              mask=decay)
        replicated = NamedSharding(mesh, P())
        opt_abstract = jax.eval_shape(self.tx.init, params)
        opt_shardings = optax.tree_map_params(self.tx, lambda _, s: s, opt_abstract,
                                              var_shardings["params"],
                                              transform_non_params=lambda _: replicated)
        self.shardings = {"step": replicated, "variables": var_shardings, "opt": opt_shardings}

        def fresh(key):
            variables = nn.unbox(init(key))
            return {"step": jnp.zeros((), jnp.int32), "variables": variables,
                    "opt": self.tx.init(variables["params"])}

        self._fresh = jax.jit(fresh, out_shardings=self.shardings)
        self._step = jax.jit(self._train_step, in_shardings=(self.shardings, self.batch_sharding),
                             out_shardings=(self.shardings, replicated), donate_argnums=0)
        self._eval = jax.jit(self._held_out_loss, in_shardings=(var_shardings, self.batch_sharding),
                             out_shardings=replicated)

    def _context(self):
        """The mesh and the MeshResource, in force for tracing the steps."""
        stack = contextlib.ExitStack()
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(qj.global_shard_guard(self.resource))
        return stack

    def abstract_state(self):
        """The state's shapes, dtypes and shardings (the target of a checkpoint restore)."""
        shapes = jax.eval_shape(self._fresh, jax.random.key(0))
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                            shapes, self.shardings)

    # -- steps ------------------------------------------------------------------------------

    def sr_key(self, step):
        """The stochastic-rounding key of training step `step` (a function of the seed and the
        step only, so that a resumed run rounds as the uninterrupted one); None where the
        recipe does not round stochastically."""
        if not uses_sr(self.model.block.recipe):
            return None
        return jax.random.fold_in(jax.random.key(self.args.seed), step)

    def loss_and_grad(self, variables, tokens, denominator, key=None):
        """(sum of the cross-entropy over tokens / denominator, its gradient with respect to
        all variables: the FP8 collection's is its updated state); `key` feeds the rng stream
        "sr_rng" (NVFP4's stochastic rounding of the gradients)."""
        def loss(v):
            logits = self.model.apply(v, tokens[:, :-1], rngs=_rngs(key))
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
            return jnp.sum(ce) / denominator
        return jax.value_and_grad(loss)(variables)

    def _train_step(self, state, tokens):
        variables = state["variables"]
        loss, grads = accumulated_grad(self.loss_and_grad, variables, tokens,
                                       self.args.microbatches, self.sr_key(state["step"]))
        updates, opt = self.tx.update(grads["params"], state["opt"], variables["params"])
        new = dict(variables, params=optax.apply_updates(variables["params"], updates))
        if OVERWRITE_WITH_GRADIENT in grads:
            new[OVERWRITE_WITH_GRADIENT] = grads[OVERWRITE_WITH_GRADIENT]
        return {"step": state["step"] + 1, "variables": new, "opt": opt}, loss

    def _held_out_loss(self, variables, tokens):
        # no gradient, hence no stochastic rounding: the modules still want a key (step 0's)
        logits = self.model.apply(variables, tokens[:, :-1], rngs=_rngs(self.sr_key(0)))
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]))

    def _global(self, batch: np.ndarray):
        """A batch computed identically by every process as a global array sharded over the
        batch axes (each process places its devices' rows)."""
        return jax.make_array_from_callback(batch.shape, self.batch_sharding, lambda i: batch[i])

    def held_out_loss(self, variables) -> float:
        with self._context():
            losses = [_value(self._eval(variables, self._global(b))) for b in self.held_out]
        return float(np.mean(losses))

    # -- the loop ---------------------------------------------------------------------------

    def initial_state(self):
        """(first step, state): fresh, or from the latest checkpoint with --resume."""
        if not self.args.resume:
            return 0, self._fresh(jax.random.key(self.args.seed))
        step, state, _ = checkpoint.restore(self._manager(), self.abstract_state(), self.recipe)
        return step, state

    def _manager(self):
        return checkpoint.manager(os.path.join(self.args.out, f"checkpoints-{self.recipe}"))

    def _save(self, step: int, state) -> None:
        config = {k: v for k, v in vars(self.args).items() if isinstance(v, (int, float, str))}
        checkpoint.save(self._manager(), step, state, {"recipe": self.recipe, "config": config})

    def train(self) -> dict:
        args, name = self.args, self.recipe
        first, state = self.initial_state()
        last = min(args.steps, args.stop_at) if args.stop_at is not None else args.steps
        tokens_per_step = args.batch * args.seq
        record = {"recipe": name, "first_step": first, "loss": [], "held_out": [],
                  "device": jax.devices()[0].device_kind, "devices": len(self.mesh.devices.flat),
                  "processes": jax.process_count()}
        say = print if jax.process_index() == 0 else (lambda *a, **k: None)
        say(f"[{name:>7}] steps {first}..{last} of {args.steps}, mesh {dict(self.mesh.shape)}, "
            f"{jax.process_count()} process(es), {tokens_per_step} tokens/step", flush=True)
        start = mark = time.perf_counter()
        mark_step, eval_time, steady = first, 0.0, []
        for s in range(first, last):
            batch = self._global(corpus.train_batch(self.train_data, s, args.batch, args.seq,
                                                    args.seed))
            with self._context():
                state, loss = self._step(state, batch)
            record["loss"].append(_value(loss))
            done = s + 1
            if done % args.eval_every == 0 or done == args.steps:
                t = time.perf_counter()
                record["held_out"].append([done, self.held_out_loss(state["variables"])])
                eval_time += time.perf_counter() - t
                say(f"[{name:>7}] step {done:6d}  held-out loss {record['held_out'][-1][1]:.4f}",
                    flush=True)
            if s % args.log_every == 0 or done == last:
                now = time.perf_counter()
                rate = (done - mark_step) * tokens_per_step / max(now - mark - eval_time, 1e-9)
                if mark_step > first:  # the first interval includes compilation
                    steady.append(rate)
                say(f"[{name:>7}] step {s:6d}  loss {record['loss'][-1]:.4f}  "
                    f"tokens/s {rate:9.0f}  elapsed {now - start:7.1f} s", flush=True)
                mark, mark_step, eval_time = now, done, 0.0
            if done == args.stop_at or (args.checkpoint_every and done % args.checkpoint_every == 0):
                self._save(done, state)
        record["tokens_per_s"] = float(np.median(steady)) if steady else None
        record["seconds"] = time.perf_counter() - start
        if jax.process_index() == 0:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"{name}.json"), "w") as f:
                json.dump(record, f, indent=1)
        self.state = state
        return record


def _rngs(sr_key) -> dict:
    """The rng streams of init and apply: "sr_rng" where the recipe takes a key."""
    return {} if sr_key is None else {"sr_rng": sr_key}


def _value(x) -> float:
    """A replicated scalar's value (also where the array spans several processes)."""
    return float(np.asarray(x.addressable_data(0)))
