"""A stand-in for NVIDIA's `pynvml`: the calls the agent's NVML backend makes, over GPUs a test describes.

An instance of `FakeNvml` goes into `sys.modules["pynvml"]`, so the backend's own
`import pynvml` finds it and runs its real code path. Errors are `NVMLError` with the
library's codes and messages, so "not supported" and a real failure are told apart as
they are on hardware.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 1 << 20

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
_MESSAGES = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class FakeMig:
    gi: int
    ci: int
    profile: str
    memory_mib: int
    uuid: str
    # Drivers name a MIG device `<GPU name> MIG <profile>`; False leaves the profile out.
    name_has_profile: bool = True


@dataclass
class FakeGpu:
    uuid: str
    name: str
    memory_mib: int
    bus_id: str  # NVML's form, 00000000:1B:00.0
    minor: int
    mig_capable: bool = False
    mig_enabled: bool = False
    migs: list[FakeMig] = field(default_factory=list)
    nvlinks: list[str] = field(default_factory=list)  # the remote PCI bus id of each active link
    retired_pages_supported: bool = True
    retired_pending: bool = False
    remap_failure: bool = False
    failing: dict[str, int] = field(default_factory=dict)  # call name -> NVML error code it raises
    lost: bool = False  # even its handle cannot be had
    processes: list[int] = field(default_factory=list)  # pids of the compute processes on it


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


def h100(index: int, *, nvswitch: bool = True) -> FakeGpu:
    """One H100 SXM5 of an HGX board: each of its 18 NVLinks goes to one of four NVSwitches."""
    bus = ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"][index]
    switches = [f"00000000:{0x05 + k:02X}:00.0" for k in range(4)]
    return FakeGpu(
        uuid=f"GPU-00000000-0000-4000-8000-0000000000{index:02d}",
        name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        bus_id=f"00000000:{bus}:00.0",
        minor=index,
        mig_capable=True,
        nvlinks=[switches[k % 4] for k in range(18)] if nvswitch else [],
        retired_pages_supported=False,  # Hopper remaps rows instead
    )


def a100_mig(index: int, profiles: list[tuple[int, int, str, int]]) -> FakeGpu:
    """An A100-SXM4-80GB in MIG mode with instances (gi, ci, profile, memoryMiB)."""
    return FakeGpu(
        uuid=f"GPU-00000000-0000-4000-8000-a100000000{index:02d}",
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        bus_id=f"00000000:{['07', '0F'][index]}:00.0",
        minor=index,
        mig_capable=True,
        mig_enabled=True,
        migs=[
            FakeMig(gi, ci, profile, mem, f"MIG-00000000-0000-4000-8000-{index:04d}{gi:04d}{ci:04d}")
            for gi, ci, profile, mem in profiles
        ],
    )


class FakeNvml:
    """What `import pynvml` gives the backend in a test; `events` are XIDs waiting to be read."""

    NVMLError = NVMLError
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 0x8
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN

    def __init__(
        self, gpus: list[FakeGpu], *, init_error: int | None = None, driver: str = "550.90.07"
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.initialised = 0
        self.events: list[tuple[int, int]] = []  # (GPU index, XID)
        self.registered: set[str] = set()

    def xid(self, index: int, xid: int) -> None:
        """XID `xid` happens on GPU `index` now."""
        self.events.append((index, xid))

    # --- the library's calls ------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._live()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._live()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return _Handle(gpu)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._check(handle, "nvmlDeviceGetUUID")
        return handle.mig.uuid if handle.mig else handle.gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._check(handle, "nvmlDeviceGetName")
        if handle.mig is None:
            return handle.gpu.name
        return (
            f"{handle.gpu.name} MIG {handle.mig.profile}" if handle.mig.name_has_profile else handle.gpu.name
        )

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> Any:
        self._check(handle, "nvmlDeviceGetMemoryInfo")
        mib = handle.mig.memory_mib if handle.mig else handle.gpu.memory_mib
        return SimpleNamespace(total=mib * MIB, free=mib * MIB, used=0)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        self._check(handle, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=handle.gpu.bus_id.encode(), busIdLegacy=handle.gpu.bus_id[4:].encode())

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._check(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [
            SimpleNamespace(
                pid=pid, usedGpuMemory=1 << 30, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
            for pid in handle.gpu.processes
        ]

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        self._check(handle, "nvmlDeviceGetMinorNumber")
        return handle.gpu.minor

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._check(handle, "nvmlDeviceGetMigMode")
        if not handle.gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = int(handle.gpu.mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._check(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if handle.gpu.mig_capable else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._check(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index >= len(handle.gpu.migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, handle.gpu.migs[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._check(handle, "nvmlDeviceGetGpuInstanceId")
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.gi

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._check(handle, "nvmlDeviceGetComputeInstanceId")
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.ci

    def nvmlDeviceGetAttributes(self, handle: _Handle) -> Any:
        self._check(handle, "nvmlDeviceGetAttributes")
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        match = re.fullmatch(r"(?:(\d+)c\.)?(\d+)g\.\d+gb", handle.mig.profile)
        assert match, handle.mig.profile
        gi_slices = int(match.group(2))
        ci_slices = int(match.group(1) or gi_slices)
        return SimpleNamespace(
            gpuInstanceSliceCount=gi_slices,
            computeInstanceSliceCount=ci_slices,
            memorySizeMB=handle.mig.memory_mib,
        )

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        self._check(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        if not handle.gpu.retired_pages_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.NVML_FEATURE_ENABLED if handle.gpu.retired_pending else self.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        self._check(handle, "nvmlDeviceGetRemappedRows")
        return (0, 1 if handle.gpu.remap_failure else 0, 0, int(handle.gpu.remap_failure))

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        self._check(handle, "nvmlDeviceGetNvLinkState")
        if not handle.gpu.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= len(handle.gpu.nvlinks):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> Any:
        self._check(handle, "nvmlDeviceGetNvLinkRemotePciInfo")
        return SimpleNamespace(busId=handle.gpu.nvlinks[link].encode())

    def nvmlEventSetCreate(self) -> object:
        self._live()
        return object()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: object) -> None:
        self._check(handle, "nvmlDeviceRegisterEvents")
        assert event_types & self.nvmlEventTypeXidCriticalError
        self.registered.add(handle.gpu.uuid)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "the agent must never block on events"
        while self.events:
            index, xid = self.events.pop(0)
            gpu = self.gpus[index]
            if gpu.uuid in self.registered:  # an unregistered GPU's events reach no event set
                return SimpleNamespace(
                    device=_Handle(gpu),
                    eventType=self.nvmlEventTypeXidCriticalError,
                    eventData=xid,
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass

    # --- internals --------------------------------------------------------------------------------

    def _live(self) -> None:
        if self.initialised <= 0:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED

    def _check(self, handle: _Handle, call: str) -> None:
        self._live()
        code = handle.gpu.failing.get(call)
        if code is not None:
            raise NVMLError(code)
