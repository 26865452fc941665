"""The communicators of the collective GEMMs (collective_gemm.py): one per (mesh, axis),
made at the first call of `communicator` and reused; the handlers find them by id.

A mesh axis of size `size` whose other axes have `groups` index combinations gets one world of
`size` ranks per combination, one rank per device. The backend follows where the devices are:

- CPU devices, every group inside one process: the local backend (the devices of a process
  run on threads of their own), made at once in every process.
- CPU devices, a group across processes: UCX (include/qmesh/comm/ucx.h). Each process makes
  the ranks of its own devices, one thread per rank, all at once (the creation is collective
  over the world), and joins the threads before it returns. The ranks meet through a
  key-value store: jax.distributed's (jax.distributed.initialize), or the directory that
  QMESH_JAX_STORE_DIR names (a qmesh FileStore: a fresh directory per job that every process
  sees). A build without UCX refuses with a clear error.
- GPU devices: NCCL (include/qmesh/comm/nccl.h), its unique id through the same store.

Every wait, the creation included, is bounded by the timeout (timeout_s, else
QMESH_COMM_TIMEOUT_S, else qmesh's default): a process that never makes its ranks is an error
naming the key that did not appear, never a hang.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import tempfile
import threading

import jax
import numpy as np

from qmesh.jax import _ffi

STORE_DIR_ENV = "QMESH_JAX_STORE_DIR"
_UCX, _NCCL = 1, 2
_lock = threading.Lock()
_comms: dict[tuple, int] = {}

_SetFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
_GetFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p)
_lib = _ffi.library
_lib.qmesh_jax_reserve_comm.argtypes = [ctypes.c_int, ctypes.c_int]
_lib.qmesh_jax_reserve_comm.restype = ctypes.c_int64
_lib.qmesh_jax_join_comm.argtypes = [
    ctypes.c_int64,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_char_p,
    _SetFn,
    _GetFn,
    ctypes.c_char_p,
    ctypes.c_int64,
    ctypes.c_char_p,
    ctypes.c_size_t,
]
_lib.qmesh_jax_store_reply.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]


def communicator(mesh, axis: str, timeout_s: float | None = None) -> int:
    """The id of the communicator of `axis` of `mesh` (made at the first call for this mesh,
    axis and timeout, reused afterwards). timeout_s: the bound of every wait (None:
    QMESH_COMM_TIMEOUT_S, else qmesh's default). An abstract mesh (inside jit) takes its
    devices from jax.set_mesh's mesh; without one the axis is taken to lie inside this
    process."""
    if axis not in mesh.axis_names:
        raise ValueError(f"collective_gemm: the mesh has no axis {axis!r} ({mesh.axis_names})")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"collective_gemm: timeout_s must be > 0, not {timeout_s}")
    timeout_ms = 0 if timeout_s is None else max(1, round(timeout_s * 1000))
    ranks = _ranks(mesh, axis)
    key = (tuple(mesh.axis_names), tuple(mesh.axis_sizes), axis, timeout_s)
    backend = _backend(ranks)
    if backend is not None:
        key += (tuple(d.id for d in ranks.flat),)
    with _lock:
        if key not in _comms:
            _ffi.cap_cpu_threads()
            if backend is None:
                _comms[key] = _make_local(*_shape(mesh, axis), timeout_ms)
            else:
                _comms[key] = _make_across(ranks, backend, axis, timeout_ms, key)
        return _comms[key]


def _shape(mesh, axis):
    size = mesh.shape[axis]
    return math.prod(mesh.axis_sizes) // size, size


def _ranks(mesh, axis):
    """The devices as [groups, size] (group: the index over the other axes, row-major; rank:
    the index on `axis`), or None when the mesh's devices are not known."""
    devices = mesh.devices if isinstance(mesh, jax.sharding.Mesh) else None
    if devices is None:
        concrete = _context_mesh()
        if concrete is not None and (concrete.axis_names, concrete.axis_sizes) == (
            mesh.axis_names,
            mesh.axis_sizes,
        ):
            devices = concrete.devices
    if devices is None:
        return None
    at = mesh.axis_names.index(axis)
    return np.moveaxis(np.asarray(devices), at, -1).reshape(_shape(mesh, axis))


def _context_mesh():
    """jax.set_mesh's concrete mesh (also inside jit), or None."""
    try:
        from jax._src.mesh import get_concrete_mesh
    except ImportError:
        return None
    mesh = get_concrete_mesh()
    return None if mesh is None or mesh.empty else mesh


def _backend(ranks):
    """None (the local backend), _UCX or _NCCL for the [groups, size] devices."""
    if ranks is None:
        return None
    if any(d.platform != "cpu" for d in ranks.flat):
        return _NCCL
    if any(len({d.process_index for d in group}) > 1 for group in ranks):
        return _UCX
    return None


def _make_local(groups, size, timeout_ms):
    comm = _lib.qmesh_jax_make_local_comm(groups, size, timeout_ms)
    if comm < 0:
        raise RuntimeError(f"collective_gemm: cannot make {groups} local worlds of {size}")
    return comm


def _make_across(ranks, backend, axis, timeout_ms, key):
    name = "UCX" if backend == _UCX else "NCCL"
    if not _lib.qmesh_jax_comm_backends() & backend:
        raise NotImplementedError(
            f"collective_gemm: the axis {axis!r} needs {name} communicators "
            f"({'its devices are in several processes' if backend == _UCX else 'GPU devices'}),"
            f" and this qmesh was built without {name} (QMESH_WITH_{name.upper()}=OFF): build "
            "qmesh with it, or keep the axis inside each process, or use collective_gemm=None"
        )
    groups, size = ranks.shape
    comm = _lib.qmesh_jax_reserve_comm(groups, size)
    if comm < 0:
        raise RuntimeError(f"collective_gemm: cannot register {groups} worlds of {size}")
    store_dir, set_fn, get_fn = _store()
    tag = hashlib.sha1(repr(key).encode()).hexdigest()[:16]
    me = jax.process_index()
    errors = []

    def join(group, rank, device):
        error = ctypes.create_string_buffer(4096)
        prefix = f"qmesh.cgemm.{tag}.{group}".encode()
        args = (comm, group, rank, backend, device, store_dir, set_fn, get_fn, prefix)
        try:
            failed = _lib.qmesh_jax_join_comm(*args, timeout_ms, error, len(error)) != 0
            reason = error.value.decode(errors="replace")
        except Exception as e:  # noqa: BLE001 (reported below, with the other ranks')
            failed, reason = True, repr(e)
        if failed:
            errors.append(f"group {group}, rank {rank}: {reason}")

    threads = [
        threading.Thread(target=join, args=(g, r, d.local_hardware_id or 0))
        for (g, r), d in np.ndenumerate(ranks)
        if d.process_index == me
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(
            f"collective_gemm: cannot make the {name} communicator of axis {axis!r} ({groups} "
            f"world(s) of {size} ranks): {errors[0]}. Every process must run the same step on "
            "the same mesh (the creation waits for all of them)"
        )
    return comm


def _store():
    """(store_dir, set, get) of qmesh_jax_join_comm: QMESH_JAX_STORE_DIR, else
    jax.distributed's key-value store (callbacks that live as long as the creation), else (one
    process) a fresh private directory."""
    directory = os.environ.get(STORE_DIR_ENV)
    if directory:
        return directory.encode(), _SetFn(), _GetFn()
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        if jax.process_count() > 1:
            raise RuntimeError(
                "collective_gemm: communicators across processes need a key-value store: "
                f"call jax.distributed.initialize, or set {STORE_DIR_ENV} to a fresh "
                "directory that every process sees"
            )
        return tempfile.mkdtemp(prefix="qmesh_jax_store_").encode(), _SetFn(), _GetFn()
    return None, _client_set(client), _client_get(client)


def _client_set(client):
    def set_value(key, value, size):
        try:
            client.key_value_set_bytes(key.decode(), ctypes.string_at(value, size))
            return 0
        except Exception:  # noqa: BLE001 (nothing may cross the C callback)
            return 2

    return _SetFn(set_value)


def _client_get(client):
    def get_value(key, timeout_ms, reply):
        try:
            value = client.blocking_key_value_get_bytes(key.decode(), int(timeout_ms))
        except Exception as e:  # noqa: BLE001 (nothing may cross the C callback)
            return 1 if "DEADLINE_EXCEEDED" in str(e) else 2
        _lib.qmesh_jax_store_reply(reply, value, len(value))
        return 0

    return _GetFn(get_value)
