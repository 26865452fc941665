"""Gradient accumulation over microbatches against the unaccumulated step on the whole batch:
the FP8 state records the maximum amax over the microbatches (what the big batch records), the
loss and parameter gradients are the big batch's."""

import jax
import numpy as np
import pytest
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from conftest import TINY

import corpus
import train
from accumulate import accumulated_grad, combine, microbatches
import run as gpt_run

MICRO = 4


def _flat(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in
            jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A delayed-scaling run after 2 steps (histories with amaxes in them) and the next batch."""
    out = tmp_path_factory.mktemp("acc")
    args = train.parse([*TINY, "--steps", "2", "--microbatches", str(MICRO), "--out", str(out)])
    r = gpt_run.Run(args, "delayed")
    r.train()
    tokens = corpus.train_batch(r.train_data, 2, args.batch, args.seq, args.seed)
    return r, r.state["variables"], r._global(tokens)


def test_accumulated_equals_big_batch(setup):
    r, variables, tokens = setup
    n = tokens.shape[0] * (tokens.shape[1] - 1)
    with r._context():
        big_loss, big = jax.jit(lambda v, t: r.loss_and_grad(v, t, n))(variables, tokens)
        acc_loss, acc = jax.jit(lambda v, t: accumulated_grad(r.loss_and_grad, v, t, MICRO))(
            variables, tokens)
        parts = jax.jit(lambda t: microbatches(t, MICRO))(tokens)
        last = jax.jit(lambda v, t: r.loss_and_grad(v, t, n))(variables, parts[-1])[1]
    want, got = _flat(big[OVERWRITE_WITH_GRADIENT]), _flat(acc[OVERWRITE_WITH_GRADIENT])
    assert want.keys() == got.keys() and len(want) == 2 * 3 * 4  # 4 GEMMs x 3 operands
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, err_msg=k)
    # the test can fail: the last microbatch alone records other amaxes
    lone = _flat(last[OVERWRITE_WITH_GRADIENT])
    assert any(not np.allclose(lone[k], want[k], rtol=1e-6) for k in want if "history" in k)
    np.testing.assert_allclose(float(acc_loss), float(big_loss), rtol=1e-5)
    gw, gg = _flat(big["params"]), _flat(acc["params"])
    for k in gw:
        np.testing.assert_allclose(gg[k], gw[k], rtol=2e-3, atol=2e-5, err_msg=k)


def test_one_microbatch_is_the_plain_step(setup):
    r, variables, tokens = setup
    n = tokens.shape[0] * (tokens.shape[1] - 1)
    with r._context():
        plain = jax.jit(lambda v, t: r.loss_and_grad(v, t, n))(variables, tokens)
        one = jax.jit(lambda v, t: accumulated_grad(r.loss_and_grad, v, t, 1))(variables, tokens)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(one)))


def test_microbatches_round_with_their_own_keys():
    """Microbatch i draws its stochastic rounding from fold_in(key, i): a stand-in gradient
    that is a random draw of its key sums to the draws of the three keys."""
    def draw(variables, tokens, denominator, key):
        return jax.numpy.zeros(()), {"params": {"w": jax.random.uniform(key, (2,))}}

    key = jax.random.key(5)
    _, grad = accumulated_grad(draw, {}, np.zeros((6, 4), np.int32), 3, key)
    want = sum(jax.random.uniform(jax.random.fold_in(key, i), (2,)) for i in range(3))
    np.testing.assert_allclose(grad["params"]["w"], want, rtol=1e-6)
    _, one = accumulated_grad(draw, {}, np.zeros((6, 4), np.int32), 1, key)
    np.testing.assert_array_equal(one["params"]["w"], jax.random.uniform(key, (2,)))


def test_combine_rules():
    a = {"params": {"w": np.float32([1, 2])},
         OVERWRITE_WITH_GRADIENT: {"d": {"input_amax_history": np.float32([0, 3, 1]),
                                         "input_scale": np.float32(2.0)}}}
    b = {"params": {"w": np.float32([10, 20])},
         OVERWRITE_WITH_GRADIENT: {"d": {"input_amax_history": np.float32([0, 5, 1]),
                                         "input_scale": np.float32(1.5)}}}
    c = combine(a, b)
    np.testing.assert_array_equal(c["params"]["w"], [11, 22])
    np.testing.assert_array_equal(c[OVERWRITE_WITH_GRADIENT]["d"]["input_amax_history"], [0, 5, 1])
    assert float(c[OVERWRITE_WITH_GRADIENT]["d"]["input_scale"]) == 1.5
    bad = {"params": a["params"], OVERWRITE_WITH_GRADIENT: {"d": {"other": np.float32(1)}}}
    with pytest.raises(ValueError, match="unknown FP8 state variable"):
        combine(bad, bad)
    with pytest.raises(ValueError, match="divisible by the number of microbatches"):
        microbatches(np.zeros((6, 3)), 4)
