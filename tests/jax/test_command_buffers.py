"""The GEMM handler under XLA's command buffers (CUDA graphs): on CUDA it takes cuBLASLt's
workspace as an XLA-allocated result and is declared command-buffer compatible
(src/ffi/gemm_handlers.cpp), so XLA may capture it. A jitted FP8 dense step (forward and
backward: the three GEMMs, the casts, the delayed-scaling update) run several times on new
inputs gives bit for bit the same results with command buffers forced on as with them off.
The CPU case runs everywhere (the GPU flags are then inert); the GPU case skips where JAX sees
no GPU and also checks that XLA did put a qmesh GEMM into a command buffer: in a command-buffer
computation of the optimized HLO, or, where XLA forms command buffers from the thunk sequence
(jax 0.11), in a command-buffer thunk of the sequence it dumps."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from qmesh.jax import _ffi
from qmesh.jax.gemm import gemm

# Every call of the step gets new inputs, so that a captured graph is replayed (or updated)
# with other buffers than the ones it was recorded with.
STEP = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from qmesh.jax import dense as qdense
from qmesh.jax.gemm import gemm
from qmesh.jax.recipe import DelayedScaling

platform, out = sys.argv[1], sys.argv[2]
device = jax.devices(platform)[0]
recipe = DelayedScaling(amax_history_len=4)

def step(x, kernel, bias, state, a, b):
    def loss(x, kernel, bias, state):
        y = qdense.dense(x, kernel, bias, state, recipe=recipe, activation="gelu")
        return jnp.sum(jnp.square(y.astype(jnp.float32)))
    value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, kernel, bias, state)
    return value, grads, gemm(a, b, out_dtype=jnp.float32)

rng = np.random.default_rng(7)
kernel = jax.device_put(jnp.asarray(rng.standard_normal((128, 64)) * 0.1, jnp.float32), device)
bias = jax.device_put(jnp.asarray(rng.standard_normal(64) * 0.1, jnp.float32), device)
state = jax.device_put(qdense.init_state(recipe), device)
f = jax.jit(step)
results = []
for i in range(3):
    x = jax.device_put(jnp.asarray(rng.standard_normal((256, 128)), jnp.bfloat16), device)
    a = jax.device_put(jnp.asarray(rng.standard_normal((64, 128)), jnp.bfloat16), device)
    b = jax.device_put(jnp.asarray(rng.standard_normal((32, 128)), jnp.bfloat16), device)
    value, grads, d = f(x, kernel, bias, state, a, b)
    state = grads[3]
    leaves = jax.tree.leaves((value, grads, d))
    results.append([np.asarray(v, np.float32).tolist() for v in leaves])
hlo = f.lower(x, kernel, bias, state, a, b).compile().as_text()
json.dump({"results": results, "hlo": hlo}, open(out, "w"))
"""

ON = (
    "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL "
    "--xla_gpu_graph_min_graph_size=1"
)
OFF = "--xla_gpu_enable_command_buffer="


def run_step(platform, flags, tmp_path, name):
    """The step's results and optimized HLO, and its thunk sequences as XLA dumped them."""
    out, dump = tmp_path / f"{name}.json", tmp_path / f"{name}-dump"
    env = dict(os.environ, XLA_FLAGS=f"{flags} --xla_dump_to={dump}")
    done = subprocess.run(
        [sys.executable, "-c", STEP, platform, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    thunks = sorted(dump.glob("*jit_step*thunk_sequence_after_thunk_passes*.txt"))
    result["thunks"] = "\n".join(t.read_text() for t in thunks)
    return result


def command_buffer_targets(hlo: str) -> set:
    """Custom-call targets inside the computations XLA made command buffers of (XLA that
    forms command buffers from HLO computations)."""
    targets, current = set(), None
    for line in hlo.splitlines():
        if line and not line[0].isspace():
            m = re.match(r"(?:ENTRY\s+)?%?([\w.\-]+)", line)
            current = m.group(1) if m else None
        elif current and "command_buffer" in current:
            targets.update(re.findall(r'custom_call_target="([^"]+)"', line))
    return targets


def command_buffer_thunks(thunks: str) -> list:
    """The lines of the thunks nested in a command-buffer thunk (XLA that forms command
    buffers from the thunk sequence, dumped as thunk_sequence_after_thunk_passes.txt: one
    thunk a line, nested thunks indented deeper than their parent)."""
    nested, parent_indent = [], None
    for line in thunks.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if parent_indent is not None and indent > parent_indent:
            nested.append(line.strip())
            continue
        parent_indent = indent if line.strip().startswith("kCommandBuffer") else None
    return nested


def qmesh_gemm_captured(result: dict) -> bool:
    return "qmesh_gemm" in command_buffer_targets(result["hlo"]) or any(
        "qmesh_gemm" in line for line in command_buffer_thunks(result["thunks"])
    )


def _gpu_seen() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_step_with_command_buffers_equals_without(platform, tmp_path):
    if platform == "gpu" and not _gpu_seen():
        pytest.skip("JAX sees no GPU")
    off = run_step(platform, OFF, tmp_path, "off")
    on = run_step(platform, ON, tmp_path, "on")
    assert len(on["results"]) == 3
    for i, (a, b) in enumerate(zip(on["results"], off["results"])):
        for j, (x, y) in enumerate(zip(a, b)):
            np.testing.assert_array_equal(
                np.asarray(x), np.asarray(y), err_msg=f"call {i} leaf {j}"
            )
    # The results move with the inputs (a graph replayed on stale buffers would repeat them).
    assert on["results"][0][-1] != on["results"][1][-1]
    if platform == "gpu":
        assert qmesh_gemm_captured(on), (
            "XLA put no qmesh GEMM into a command buffer: is the handler declared compatible?\n"
            + on["thunks"][-3000:]
        )
        assert not qmesh_gemm_captured(off)


def test_cuda_lowering_gives_the_gemm_a_workspace_result():
    # Lowered for CUDA without a GPU: the custom call has one more result, uint8 of the size the
    # handler library asks for; the CPU lowering has none.
    a, b = jnp.ones((32, 16), jnp.bfloat16), jnp.ones((16, 16), jnp.bfloat16)
    f = jax.jit(lambda a, b: gemm(a, b, out_dtype=jnp.float32))
    size = _ffi.library.qmesh_jax_gemm_workspace_bytes()
    assert size >= 32 << 20

    def call_line(platform):
        text = f.trace(a, b).lower(lowering_platforms=(platform,)).as_text()
        lines = [ln for ln in text.splitlines() if "custom_call @qmesh_gemm" in ln]
        assert len(lines) == 1, text
        return lines[0]

    assert f"tensor<{size}xui8>" in call_line("cuda")
    assert "xui8>" not in call_line("cpu")


def test_command_buffer_targets_reads_the_computations():
    hlo = (
        "%command_buffer.1 (p: f32[2]) -> f32[2] {\n"
        '  %c = f32[2] custom-call(%p), custom_call_target="qmesh_gemm"\n}\n\n'
        "ENTRY %main (p: f32[2]) -> f32[2] {\n"
        '  %d = f32[2] custom-call(%p), custom_call_target="qmesh_quantize"\n}\n'
    )
    assert command_buffer_targets(hlo) == {"qmesh_gemm"}
    thunks = (
        "kKernel\tloop_convert_fusion\n"
        "kCommandBuffer\t\n"
        "  kCustomCall\tqmesh_gemm_ffi.23\n"
        "  kKernel\tloop_add_fusion\n"
        "kCustomCall\tqmesh_quantize_ffi.2\n"
    )
    assert command_buffer_thunks(thunks) == [
        "kCustomCall\tqmesh_gemm_ffi.23",
        "kKernel\tloop_add_fusion",
    ]
    assert qmesh_gemm_captured({"hlo": "", "thunks": thunks})
    assert not qmesh_gemm_captured({"hlo": "", "thunks": thunks.replace("  kCustom", "kCustom")})
