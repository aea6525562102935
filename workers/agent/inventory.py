"""What the agent tells the controller about its host: inventory at registration, load in
heartbeats. GPUs come from NVML (nvidia-ml-py); a host without an NVIDIA driver has none."""

from __future__ import annotations

import os
import socket
from typing import Any

import psutil

from workers.agent.network import Reach
from workers.protocol import PROTOCOL_VERSION, GpuInfo, GpuLoad, NodeInfo, NodeLoad

AGENT_VERSION = "0.2.0"


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def gpu_inventory() -> list[GpuInfo]:
    nvml = _nvml()
    if nvml is None:
        return []
    gpus: list[GpuInfo] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        gpus.append(
            GpuInfo(
                index=index,
                name=name.decode() if isinstance(name, bytes) else str(name),
                uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            )
        )
    return gpus


def gpu_load() -> list[GpuLoad]:
    nvml = _nvml()
    if nvml is None:
        return []
    loads: list[GpuLoad] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        loads.append(
            GpuLoad(
                index=index,
                utilization=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                memory_used_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).used),
            )
        )
    return loads


def torch_version() -> str:
    # Reading the installed version avoids importing torch (seconds) into the agent.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return ""


def node_info(reach: Reach, slots: int, dns_warning: str = "") -> NodeInfo:
    """The host as the controller sees it; ``reach`` from workers/agent/network.py's detect."""
    cpus = os.cpu_count() or 1
    info = NodeInfo(
        hostname=socket.gethostname(),
        address=reach.address,
        interface=reach.interface,
        cpus=cpus,
        memory_bytes=int(psutil.virtual_memory().total),
        slots=slots or cpus,
        gpus=gpu_inventory(),
        torch_version=torch_version(),
        agent_version=AGENT_VERSION,
        protocol=PROTOCOL_VERSION,
    )
    if dns_warning:
        info["dns_warning"] = dns_warning
    return info


def node_load() -> NodeLoad:
    return NodeLoad(
        cpu_percent=float(psutil.cpu_percent(interval=None)),
        memory_percent=float(psutil.virtual_memory().percent),
        gpus=gpu_load(),
    )
