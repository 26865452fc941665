"""Checkpoint and resume (orbax): a run stopped after k steps and resumed continues with the
losses of the uninterrupted run, bit for bit (parameters, AdamW state and the FP8 amax
histories and scales all restored; under NVFP4 the stochastic rounding's keys, a function of
seed and step); a checkpoint without the FP8 state cannot resume a delayed-scaling run."""

import re

import jax
import numpy as np
import pytest
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from conftest import TINY

import checkpoint
import run as gpt_run
import train

STEPS = ["--steps", "6", "--eval-every", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(directory, uninterrupted record, record up to the stop, resumed record, the stopped Run)."""
    out = tmp_path_factory.mktemp("resume")
    whole = train.main([*TINY, *STEPS, "--out", str(out / "whole")])["delayed"]
    cut = gpt_run.Run(train.parse([*TINY, *STEPS, "--stop-at", "3", "--out", str(out / "cut")]),
                      "delayed")
    first = cut.train()
    rest = train.main([*TINY, *STEPS, "--resume", "--out", str(out / "cut")])["delayed"]
    return out, whole, first, rest, cut


def test_resume_is_bitwise(runs):
    _, whole, first, rest, _ = runs
    assert first["loss"] == whole["loss"][:3] and rest["first_step"] == 3
    assert len(rest["loss"]) == 3 and rest["loss"] == whole["loss"][3:]
    assert rest["held_out"] == [h for h in whole["held_out"] if h[0] > 3]


def _leaves(tree):
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])


def test_resume_restores_fp8_state(runs):
    """The restored FP8 state is the saved one, not a fresh one (histories 0, scales 1)."""
    out, *_, cut = runs
    resumed = gpt_run.Run(train.parse([*TINY, *STEPS, "--resume", "--out", str(out / "cut")]),
                          "delayed")
    step, state = resumed.initial_state()
    want = _leaves(cut.state["variables"][OVERWRITE_WITH_GRADIENT])
    got = _leaves(state["variables"][OVERWRITE_WITH_GRADIENT])
    assert step == 3 and np.array_equal(want, got) and np.any(got > 1)


def test_checkpoint_without_fp8_state_is_an_error(runs):
    out, *_, cut = runs
    state = dict(cut.state, variables={"params": cut.state["variables"]["params"]})
    checkpoint.save(checkpoint.manager(str(out / "nofp8" / "checkpoints-delayed")), 3, state,
                    {"recipe": "current"})
    with pytest.raises(ValueError, match=r"written by a 'current' run\) has no FP8 state .* "
                                         r"which recipe 'delayed' needs"):
        train.main([*TINY, *STEPS, "--resume", "--out", str(out / "nofp8")])


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint .* run without --resume"):
        train.main([*TINY, *STEPS, "--resume", "--out", str(tmp_path)])


# NVFP4 (GEMMs emulated on the CPU) on one device, two microbatches a step: each microbatch
# rounds its gradients stochastically with its own key of (seed, step).
NVFP4 = ["--preset", "tiny", "--recipe", "nvfp4", "--emulate", "--microbatches", "2",
         "--steps", "4", "--eval-every", "2"]


def test_nvfp4_resume_is_bitwise(tmp_path):
    """Uninterrupted, stopped after 2 steps, resumed: one Run, its steps compiled once."""
    args = train.parse([*NVFP4, "--out", str(tmp_path)])
    r = gpt_run.Run(args, "nvfp4")
    whole = r.train()
    args.stop_at = 2
    first = r.train()
    args.stop_at, args.resume = None, True
    rest = r.train()
    assert first["loss"] == whole["loss"][:2] and rest["first_step"] == 2
    assert rest["loss"] == whole["loss"][2:] and rest["held_out"] == whole["held_out"][1:]
    assert len(set(whole["loss"])) == 4


@pytest.mark.parametrize("argv,message", [
    (["--recipe", "bf16,nvfp4"], "--recipe nvfp4 needs --emulate"),
    (["--recipe", "mxfp8", "--emulate", "--tp", "2"],  # hidden 32: tp shards of 16 < 32
     r"--recipe mxfp8 with --tp 2: --hidden \(32\) must be a multiple of tp x 32 \(64\)"),
])
def test_recipe_option_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        train.parse(["--preset", "tiny", *argv])
    assert re.search(message, capsys.readouterr().err)
