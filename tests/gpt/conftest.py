"""pytest setup for the GPT example's tests: 4 CPU devices (a 2 x 2 mesh, set before JAX
starts) and the example's directory on the import path."""

import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "jax", "gpt")
sys.path.insert(0, EXAMPLE)

# A few steps of the tiny preset on a dp 2 x tp 2 mesh, FP8 delayed scaling.
TINY = ["--preset", "tiny", "--dp", "2", "--tp", "2", "--recipe", "delayed"]
