"""The live backend on a real NVIDIA host: what it reads passes the server's report schema and parser.

Runs only where `nvidia-smi` is on PATH (and `nvidia-ml-py` is installed): `pytest -m gpu tests/agent`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import jsonschema
import pytest

from better_compute_agent.discovery.nvml import NvmlSource
from better_compute_agent.discovery.report import gpu_devices, report_from_snapshot
from better_compute_agent.discovery.snapshot import snapshot_problem
from inventory.reports import report_parse, report_schema


@pytest.mark.gpu
@pytest.mark.skipif(
    shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU host: nvidia-smi is not on PATH"
)
def test_the_real_host_reads_into_a_report_the_server_takes() -> None:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    whole = [line for line in listed.splitlines() if line.startswith("GPU ")]
    source = NvmlSource()
    try:
        snapshot = source.read()
    finally:
        source.close()
    assert snapshot_problem(snapshot) is None
    report = report_from_snapshot(snapshot)
    jsonschema.validate(report, report_schema())
    parsed = report_parse(data=report)
    assert len(parsed.gpus) == len(whole)
    assert all(gpu.uuid.startswith("GPU-") and gpu.memory_mib > 0 for gpu in parsed.gpus)
    assert parsed.resources["vcpu"] > 0 and parsed.resources["memoryGiB"] > 0
    assert all(dev.device_nodes[0].startswith("/dev/nvidia") for dev in gpu_devices(snapshot).values())


# A CUDA process: the driver API alone (libcuda, which every NVIDIA driver installs), holding a
# context on device 0 until its stdin closes.
CUDA_HOLDER = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
device, context = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.gpu
@pytest.mark.skipif(
    shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU host: nvidia-smi is not on PATH"
)
def test_a_real_cuda_process_is_among_its_gpus_holders() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", CUDA_HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        # CUDA's device 0 is NVML's index 0 only in PCI order.
        env={**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
    )
    source = NvmlSource()
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        first = source.read()["gpus"][0]["uuid"]
        assert holder.pid in source.gpu_processes().get(first, [])
    finally:
        source.close()
        holder.communicate("", timeout=30)
