"""An expert layer for the tests: the einsum drop-in over a batch index of experts."""

import jax
import jax.numpy as jnp
import numpy as np

from qmesh.jax.flax import make_einsum_cls


def expert_step(rng, recipe, eqn="ecd,edf->ecf", x_shape=(4, 8, 32)):
    """(x, w [4, 32, 16], the einsum's variables, f) where f(v, x, w) gives the output and the
    gradients of sum(y ** 2) with respect to (v, x, w)."""
    x = jnp.asarray(rng.standard_normal(x_shape).astype(np.float32))
    w = jnp.asarray((rng.standard_normal((4, 32, 16)) / 6).astype(np.float32))
    einsum = make_einsum_cls(recipe)()
    v = einsum.init(jax.random.key(0), eqn, x, w)

    def f(v, x, w):
        loss = lambda v_, x_, w_: jnp.sum(einsum.apply(v_, eqn, x_, w_) ** 2)  # noqa: E731
        return einsum.apply(v, eqn, x, w), jax.grad(loss, argnums=(0, 1, 2))(v, x, w)

    return x, w, v, f
