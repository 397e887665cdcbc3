"""The CUDA layer (plugins/backends/cuda.py) on a real GPU; needs no TensorRT."""

from __future__ import annotations

import numpy as np
import pytest

from infermux.plugins.backends import cuda

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def test_round_trip_through_device_on_two_streams():
    streams = [cuda.Stream(), cuda.Stream()]
    data = [np.random.default_rng(i).integers(0, 255, 4 * MiB, dtype=np.uint8) for i in range(2)]
    buffers = [(cuda.HostBuffer(4 * MiB), cuda.DeviceBuffer(4 * MiB), cuda.HostBuffer(4 * MiB)) for _ in data]
    for stream, payload, (src, dev, dst) in zip(streams, data, buffers):
        src.view(np.uint8, (4 * MiB,))[:] = payload
        cuda.copy_to_device(dev, src, 4 * MiB, stream)
        cuda.copy_to_host(dst, dev, 4 * MiB, stream)
    for stream, payload, (_, _, dst) in zip(streams, data, buffers):
        stream.synchronize()
        np.testing.assert_array_equal(dst.view(np.uint8, (4 * MiB,)), payload)
    for resource in [*streams, *(b for trio in buffers for b in trio)]:
        resource.close()


def test_mem_info_moves_with_device_allocations():
    # Jetson: free memory is system RAM that other processes move too.
    slack = 64 * MiB if cuda.is_integrated() else 8 * MiB
    before = cuda.mem_info()
    assert 0 < before.free <= before.total
    buf = cuda.DeviceBuffer(256 * MiB)
    during = cuda.mem_info()
    buf.close()
    after = cuda.mem_info()
    assert before.free - during.free >= 256 * MiB - slack
    assert abs(after.free - before.free) <= slack


def test_cuda_errors_are_named():
    with pytest.raises(cuda.CudaError, match="cudaMalloc failed: cudaErrorMemoryAllocation") as err:
        cuda.DeviceBuffer(1 << 50)  # 1 PiB
    assert err.value.out_of_memory
    cuda.DeviceBuffer(MiB).close()  # an allocation failure does not poison later calls


def test_stream_handles_are_native_ints_without_deprecation_warnings():
    # cuda-bindings 12.9.1+ deprecates int(cudaStream_t); the layer reads get_cuda_native_handle.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        stream = cuda.Stream()
        assert isinstance(stream.handle, int) and stream.handle != 0
        stream.synchronize()
        stream.close()


def test_the_installed_bindings_pass_the_gil_version_rule():
    # The load refuses older ones (conftest would have skipped with that reason); state the version.
    version = cuda.bindings_version()
    assert version, "cuda.bindings.__version__ is missing: the version rule cannot be applied"
    cuda.check_releases_gil(version)
