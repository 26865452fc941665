"""Trains a byte-level GPT on Shakespeare's plays with qmesh's Flax modules, in BF16, in FP8
(delayed, current and block scaling), MXFP8 and NVFP4, on a dp x fsdp x tp mesh, in one process
or several; prints a progress line (loss, tokens/s, elapsed) and the held-out loss, writes each
recipe's losses (<out>/<recipe>.json) and PNGs of the loss curves (<out>/train_loss.png,
<out>/held_out_loss.png; blue bf16, red delayed, green current, purple block, orange mxfp8,
brown nvfp4).

    python examples/jax/gpt/train.py --preset small --out build/gpt      # CPU, minutes
    python examples/jax/gpt/train.py --preset small --recipe block,mxfp8,nvfp4 --emulate
    python examples/jax/gpt/train.py --preset gpu --recipe bf16,delayed,current --out gpt_gpu
    launch/jaxrun -n 2 --cpu-devices 2 -- python examples/jax/gpt/train.py --preset tiny --dp 2 --tp 2

Several processes: started by launch/jaxrun, mpirun or srun (docs/multinode.md), each calls
jax.distributed.initialize; the mesh spans the devices of all of them. Checkpoints
(--checkpoint-every, --stop-at, --resume) hold parameters, optimizer state and the FP8 state;
NVFP4's stochastic rounding takes a key of (seed, step), so a resumed run repeats its bits.
Needs the qmesh package (pip install "./python[flax]", or PYTHONPATH=python with
QMESH_JAX_LIBRARY_DIR set to the build directory of qmesh_jax_ffi). See README.md.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # png.py, shared with the other JAX examples

PRESETS = {
    # CI: seconds
    "tiny": dict(layers=1, hidden=32, heads=2, ffn=64, seq=32, batch=8, steps=4, lr=3e-3,
                 warmup=1, log_every=1, eval_every=2, eval_batches=1),
    # the CPU configuration of docs/benchmarks/gpt-shakespeare-cpu.md: minutes on 2 cores
    "small": dict(layers=2, hidden=128, heads=4, ffn=512, seq=128, batch=16, steps=600,
                  lr=2e-3, warmup=50, log_every=50, eval_every=100, eval_batches=8),
    # GPU-sized (one H100): 12 layers, hidden 1536, 32k tokens per step
    "gpu": dict(layers=12, hidden=1536, heads=12, ffn=6144, seq=1024, batch=32, steps=2000,
                lr=3e-4, warmup=200, log_every=20, eval_every=250, eval_batches=16,
                attention_dtype="bfloat16", attention="cudnn"),
}
RECIPES = ("bf16", "delayed", "current", "block", "mxfp8", "nvfp4")
COLOURS = "blue bf16, red delayed, green current, purple block, orange mxfp8, brown nvfp4"
DEFAULT_RECIPES = RECIPES[:3]
EMULATED = ("mxfp8", "nvfp4")  # no device qmesh drives has their GEMMs natively
BLOCK = {"block": 128, "mxfp8": 32, "nvfp4": 16}  # elements per scaling block (and weight tile)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=PRESETS, default="small",
                   help="model and run size (default small); the options below override it")
    p.add_argument("--recipe", default=",".join(DEFAULT_RECIPES),
                   help="comma-separated recipes to run one after the other: bf16 (GEMMs in "
                        "bfloat16), delayed (FP8 delayed scaling), current (FP8 current "
                        "scaling), block (FP8 in 1x128 blocks, weights in 128x128 tiles), "
                        "mxfp8 (MXFP8: 32-element blocks, power-of-two scales), nvfp4 (NVFP4: "
                        "4-bit codes in 16-element blocks, stochastically rounded gradients); "
                        "default bf16,delayed,current. mxfp8 and nvfp4 need --emulate")
    p.add_argument("--emulate", action="store_true",
                   help="run the mxfp8 and nvfp4 GEMMs emulated (dequantized, float32 "
                        "accumulation): no device qmesh drives has them natively")
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=int)
    g.add_argument("--hidden", type=int)
    g.add_argument("--heads", type=int)
    g.add_argument("--ffn", type=int, help="the MLP's hidden width")
    g.add_argument("--seq", type=int, help="tokens (bytes) per sequence")
    g.add_argument("--attention-dtype", choices=("float32", "bfloat16"),
                   help="q, k, v dtype of the attention (bfloat16 lets cuDNN run it on a GPU); "
                        "default float32 (gpu preset: bfloat16)")
    g.add_argument("--attention", choices=("xla", "cudnn"),
                   help="jax.nn.dot_product_attention's implementation: xla (default), or "
                        "cudnn (GPU only, bfloat16 attention; the gpu preset's)")
    g.add_argument("--amax-history-len", type=int, default=16,
                   help="delayed scaling's amax history (default 16)")
    g = p.add_argument_group("training")
    g.add_argument("--batch", type=int, help="sequences per step (global)")
    g.add_argument("--microbatches", type=int, default=1,
                   help="split each step's batch into this many microbatches, gradients "
                        "accumulated (default 1)")
    g.add_argument("--steps", type=int)
    g.add_argument("--lr", type=float, help="peak AdamW learning rate (cosine decay to 10%%)")
    g.add_argument("--warmup", type=int, help="linear warm-up steps")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW, kernels only")
    g.add_argument("--seed", type=int, default=1234, help="initialisation and data order")
    g = p.add_argument_group("mesh (dp x fsdp x tp devices, over all processes)")
    g.add_argument("--dp", type=int, default=1, help="data parallel")
    g.add_argument("--fsdp", type=int, default=1,
                   help="data parallel with the parameters and optimizer state sharded")
    g.add_argument("--tp", type=int, default=1, help="tensor parallel")
    g.add_argument("--sp", action="store_true",
                   help="sequence parallel over the tp axis (TransformerEngine's tpsp)")
    g.add_argument("--cpu-devices", type=int,
                   help="CPU devices of this process (default: what JAX has; set before JAX starts)")
    g = p.add_argument_group("output and checkpoints")
    g.add_argument("--log-every", type=int, help="progress line every N steps")
    g.add_argument("--eval-every", type=int, help="held-out loss every N steps")
    g.add_argument("--eval-batches", type=int, help="held-out batches per evaluation")
    g.add_argument("--out", default="gpt_out", help="directory of the JSON, PNG and checkpoints")
    g.add_argument("--checkpoint-every", type=int, default=0,
                   help="write a checkpoint every N steps (0: only at --stop-at)")
    g.add_argument("--stop-at", type=int,
                   help="write a checkpoint after this many steps and stop (as if interrupted)")
    g.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in <out>/checkpoints-<recipe>")
    args = p.parse_args(argv)
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    args.attention_dtype = args.attention_dtype or "float32"
    args.attention = args.attention or "xla"
    if args.attention == "cudnn" and args.attention_dtype != "bfloat16":
        p.error("--attention cudnn needs --attention-dtype bfloat16 (cuDNN's attention takes "
                "16-bit q, k and v)")
    args.recipes = [r.strip() for r in args.recipe.split(",") if r.strip()]
    for r in args.recipes:
        if r not in RECIPES:
            p.error(f"--recipe: unknown recipe {r!r}; choose from {', '.join(RECIPES)}")
        if r in EMULATED and not args.emulate:
            p.error(f"--recipe {r} needs --emulate: no device qmesh drives has native "
                    f"{r.upper()} GEMMs, and without emulation they raise")
    for name in ("layers", "hidden", "heads", "ffn", "seq", "batch", "steps", "log_every",
                 "eval_every", "eval_batches", "dp", "fsdp", "tp", "microbatches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.batch % (args.dp * args.fsdp * args.microbatches):
        p.error(f"--batch ({args.batch}) must be divisible by dp x fsdp x microbatches "
                f"({args.dp * args.fsdp * args.microbatches})")
    if args.stop_at is not None and not 1 <= args.stop_at <= args.steps:
        p.error(f"--stop-at must be between 1 and --steps ({args.steps}), not {args.stop_at}")
    for r in args.recipes:  # a shard boundary must not cut a scaling block
        for option, n, what, size in (("--tp", args.tp, "--hidden", args.hidden),
                                      ("--tp", args.tp, "--ffn", args.ffn),
                                      ("--fsdp", args.fsdp, "--hidden", args.hidden)):
            if r in BLOCK and n > 1 and size % (n * BLOCK[r]):
                p.error(f"--recipe {r} with {option} {n}: {what} ({size}) must be a multiple of "
                        f"{option[2:]} x {BLOCK[r]} ({n * BLOCK[r]}), so that every shard holds "
                        f"whole {BLOCK[r]}-element scaling blocks; change {what} or {option}")
    if args.sp and args.fsdp > 1:
        p.error("--sp with --fsdp > 1 is not supported: qmesh's activation layout maps the "
                "batch to the dp axis only")
    return args


def start_jax(args):
    """Configures JAX before its backends start: CPU device count, and jax.distributed with gloo
    collectives where the process is one of several (launch/jaxrun sets JAX_NUM_PROCESSES and
    JAX_PROCESS_ID, mpirun and srun their own variables)."""
    import jax
    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    env = os.environ
    explicit = "JAX_NUM_PROCESSES" in env
    launched = explicit or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1 or \
        int(env.get("SLURM_NTASKS", "1")) > 1
    if launched and not jax.distributed.is_initialized():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if explicit:
            jax.distributed.initialize(env.get("JAX_COORDINATOR_ADDRESS"),
                                       int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"]))
        else:
            jax.distributed.initialize()
    return jax


def exit_at_once_on_error(run):
    """Returns run(). In a job of several processes, an exception is printed and ends this
    process at once (os._exit(1)): a normal exit would wait in jax.distributed's shutdown
    barrier for the other processes (up to its shutdown_timeout_seconds, 300 s), which keep
    training or wait in a collective for this one, so the launcher would stop the job only
    minutes later."""
    try:
        return run()
    except Exception:
        import jax
        if not jax.distributed.is_initialized():
            raise
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def main(argv=None) -> dict:
    """Runs every recipe of --recipe; returns {recipe: its record (the JSON written)}."""
    args = parse(argv)
    jax = start_jax(args)
    from run import Run  # imports JAX-dependent modules after start_jax
    from png import COLORS, line_plot

    records = {}
    for recipe in args.recipes:
        records[recipe] = Run(args, recipe).train()
    if jax.process_index() != 0:
        return records
    os.makedirs(args.out, exist_ok=True)
    for name, key, what in (("train_loss", "loss", "training loss"),
                            ("held_out_loss", "held_out", "held-out loss")):
        curves = {r: rec[key] for r, rec in records.items()}
        if all(len(c) > 1 for c in curves.values()):
            line_plot(os.path.join(args.out, name + ".png"), curves, ylabel=what,
                      title=f"GPT on Shakespeare ({args.preset}): {what}",
                      colors={r: COLORS[RECIPES.index(r)] for r in curves})
    finals = {r: rec["held_out"][-1][1] for r, rec in records.items() if rec["held_out"]}
    for r, v in finals.items():
        vs = f"  ({(v / finals['bf16'] - 1) * 100:+.2f}% vs bf16)" if "bf16" in finals else ""
        print(f"final held-out loss {r:>8}: {v:.4f}{vs}")
    print(f"wrote {args.out}/<recipe>.json, train_loss.png and held_out_loss.png ({COLOURS})",
          flush=True)
    return records


if __name__ == "__main__":
    exit_at_once_on_error(main)
