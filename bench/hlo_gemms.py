"""GEMMs in an optimized HLO text (`jax.jit(f).lower(...).compile().as_text()`), for the
benchmarks that must say whether a computation really ran FP8 GEMMs."""

from __future__ import annotations

import re

_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+) = (?P<type>\S+)", re.M)
_CUSTOM_CALL = re.compile(r"custom-call\((?P<operands>[^)]*)\)(?P<rest>.*?)"
                          r"custom_call_target=\"(?P<target>[^\"]+)\"(?P<tail>.*)")


def fp8_gemm_counts(hlo: str) -> dict:
    """FP8 GEMMs in an optimized HLO text: XLA's FP8 cuBLASLt custom calls, qmesh GEMM calls
    with FP8 operands, and all GEMM custom calls (any dtype). An operand's type is read from
    the call itself (operand shapes, operand_layout_constraints) or from its definition."""
    types = {m.group("name"): m.group("type") for m in _DEFINITION.finditer(hlo)}
    xla_fp8 = qmesh_fp8 = gemms = 0
    for m in _CUSTOM_CALL.finditer(hlo):
        target = m.group("target")
        if not (target.startswith("__cublas") or target == "qmesh_gemm"):
            continue
        gemms += 1
        if target == "__cublas$lt$matmul$f8":
            xla_fp8 += 1
        elif target == "qmesh_gemm":
            names = re.findall(r"%([\w.\-]+)", m.group("operands"))
            seen = " ".join([m.group("operands"), m.group("tail")] +
                            [types.get(n, "") for n in names])
            qmesh_fp8 += "f8e" in seen
    return dict(xla_fp8_gemms=xla_fp8, qmesh_fp8_gemms=qmesh_fp8, gemm_custom_calls=gemms)
