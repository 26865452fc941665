"""Checkpoints of the training state with orbax-checkpoint: the step, the variables (parameters
and the FP8 state, the `_overwrite_with_gradient` collection: amax histories and scales) and the
optimizer state, with the run's recipe and configuration beside them (JSON).

Restoring checks the checkpoint's tree against the state the run needs before reading any
array: a checkpoint without the FP8 state under delayed scaling (say, written by a bf16 or
current-scaling run) is an error that says so, never a silent restart of the amax histories.
Every process of a multi-process run calls these functions (orbax writes each array's shards
from the processes that hold them); the directory must be shared between them.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT


def manager(directory: str) -> ocp.CheckpointManager:
    """The checkpoint manager of `directory` (created if missing); keeps the last 2 steps."""
    return ocp.CheckpointManager(os.path.abspath(directory),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True),
                                 item_handlers={"state": ocp.StandardCheckpointHandler(),
                                                "run": ocp.JsonCheckpointHandler()})


def save(mngr: ocp.CheckpointManager, step: int, state: dict, run: dict) -> None:
    """Writes `state` (a pytree of jax arrays) and `run` (JSON-able) as checkpoint `step`, and
    waits until it is on disk."""
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            run=ocp.args.JsonSave(run)))
    mngr.wait_until_finished()


def _paths(tree) -> set[str]:
    return {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def restore(mngr: ocp.CheckpointManager, target: dict, recipe: str) -> tuple[int, dict, dict]:
    """(step, state, run) of the latest checkpoint, its arrays placed like `target` (a pytree of
    jax.ShapeDtypeStruct with shardings, the state this run would start from). Raises
    ValueError when there is no checkpoint, or when its tree is not the one `target` needs."""
    step = mngr.latest_step()
    if step is None:
        raise ValueError(f"no checkpoint in {mngr.directory} to resume from: run without "
                         "--resume to start from scratch")
    saved = mngr.item_metadata(step)["state"]
    saved = getattr(saved, "tree", saved)["variables"]  # (the metadata lists namedtuples)
    missing = _paths(target["variables"]) - _paths(saved)
    extra = _paths(saved) - _paths(target["variables"])
    run = mngr.restore(step, args=ocp.args.Composite(run=ocp.args.JsonRestore()))["run"]
    origin = f"checkpoint {step} in {mngr.directory} (written by a {run.get('recipe')!r} run)"
    if any(OVERWRITE_WITH_GRADIENT in p for p in missing):
        raise ValueError(f"{origin} has no FP8 state ({OVERWRITE_WITH_GRADIENT}: amax histories "
                         f"and scales), which recipe {recipe!r} needs; restarting them would "
                         "throw the scaling history away. Resume with the recipe the checkpoint "
                         "was written with, or start a fresh run in another --out directory")
    if missing or extra:
        raise ValueError(f"{origin} does not match this run's model (missing "
                         f"{sorted(missing)[:4]}, unexpected {sorted(extra)[:4]}): resume with "
                         "the options it was written with")
    state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    return step, state["state"], run
