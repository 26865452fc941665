"""pytest setup for qmesh's JAX tests: 8 CPU devices (set before JAX starts) and meshes."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402


def make_mesh(shape, names=("dp", "tp")):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))


@pytest.fixture(params=[(2, 2), (2, 4)], ids=["2x2", "2x4"])
def mesh(request):
    return make_mesh(request.param)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
