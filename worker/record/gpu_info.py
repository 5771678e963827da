"""GPU and CUDA library facts read through the CUDA driver API with ctypes, without TensorFlow."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

LIBCUDA_NAME = "libcuda.so.1"

CUDA_SUCCESS = 0
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

_NAME_BUFFER_BYTES = 256
_UUID_BYTES = 16
_PROC_MAPS = Path("/proc/self/maps")
_MAPS_FIELDS = 6
_CUDNN9_FLOOR = 10000


def format_driver_version(version: int) -> str:
    """Render a CUDA driver or runtime version integer (12040) as "12.4"."""
    if version < 0:
        raise ValueError(f"CUDA version must be non-negative, got {version}")
    return f"{version // 1000}.{(version % 1000) // 10}"


def format_cudnn_version(version: int) -> str:
    """Render a cudnnGetVersion() integer (90100 or pre-9 8902) as "9.1.0" / "8.9.2"."""
    if version < 0:
        raise ValueError(f"cuDNN version must be non-negative, got {version}")
    # cuDNN 9 switched from major*1000+minor*100+patch to major*10000+minor*100+patch;
    # every pre-9 release is below 10000 and every 9.x release is at least 90000.
    if version >= _CUDNN9_FLOOR:
        major, rest = divmod(version, _CUDNN9_FLOOR)
    else:
        major, rest = divmod(version, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def format_uuid(raw: bytes) -> str:
    """Render the 16 bytes of a CUuuid the way nvidia-smi prints them ("GPU-xxxxxxxx-...")."""
    if len(raw) != _UUID_BYTES:
        raise ValueError(f"a CUDA UUID has {_UUID_BYTES} bytes, got {len(raw)}")
    text = raw.hex()
    return f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def find_loaded_library(maps_text: str, stem: str) -> str | None:
    """Path of the first mapped file whose name starts with "<stem>.so" in /proc/<pid>/maps text."""
    prefix = f"{stem}.so"
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=_MAPS_FIELDS - 1)
        if len(fields) < _MAPS_FIELDS:
            continue
        path = fields[-1].strip()
        if Path(path).name.startswith(prefix):
            return path
    return None


def _open_driver() -> Any | None:
    try:
        lib = ctypes.CDLL(LIBCUDA_NAME)
    except OSError:
        return None
    return lib


def _ok(result: int) -> bool:
    return int(result) == CUDA_SUCCESS


def _driver_version(lib: Any) -> str | None:
    value = ctypes.c_int(0)
    if not _ok(lib.cuDriverGetVersion(ctypes.byref(value))):
        return None
    return format_driver_version(value.value)


def cuda_driver_version() -> str | None:
    """Version of the installed CUDA driver ("12.4"), or None when no driver can be loaded."""
    lib = _open_driver()
    if lib is None:
        return None
    try:
        return _driver_version(lib)
    except AttributeError:
        return None


def _attribute(lib: Any, attribute: int, device: ctypes.c_int) -> int | None:
    value = ctypes.c_int(0)
    if not _ok(lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device)):
        return None
    return value.value


def _device_uuid(lib: Any, device: ctypes.c_int) -> str | None:
    # cuDeviceGetUuid_v2 exists from CUDA 11.4; older drivers only have the unversioned symbol.
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or getattr(lib, "cuDeviceGetUuid", None)
    if get_uuid is None:
        return None
    buffer = (ctypes.c_char * _UUID_BYTES)()
    if not _ok(get_uuid(buffer, device)):
        return None
    return format_uuid(bytes(buffer))


def _describe_device(lib: Any, device: ctypes.c_int, driver: str | None) -> dict[str, Any]:
    name_buffer = ctypes.create_string_buffer(_NAME_BUFFER_BYTES)
    name: str | None = None
    if _ok(lib.cuDeviceGetName(name_buffer, _NAME_BUFFER_BYTES, device)):
        name = name_buffer.value.decode("utf-8", errors="replace")
    memory = ctypes.c_size_t(0)
    memory_bytes = (
        memory.value if _ok(lib.cuDeviceTotalMem_v2(ctypes.byref(memory), device)) else None
    )
    major = _attribute(lib, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
    minor = _attribute(lib, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
    capability = f"{major}.{minor}" if major is not None and minor is not None else None
    return {
        "name": name,
        "compute_capability": capability,
        "sm_count": _attribute(lib, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
        "memory_bytes": memory_bytes,
        "driver_version": driver,
        "uuid": _device_uuid(lib, device),
    }


def gpu_devices() -> list[dict[str, Any]]:
    """One dict per CUDA device visible to the driver; [] when there is no usable driver."""
    lib = _open_driver()
    if lib is None:
        return []
    devices: list[dict[str, Any]] = []
    try:
        if not _ok(lib.cuInit(0)):
            return []
        driver = _driver_version(lib)
        count = ctypes.c_int(0)
        if not _ok(lib.cuDeviceGetCount(ctypes.byref(count))):
            return []
        for ordinal in range(count.value):
            device = ctypes.c_int(0)
            if not _ok(lib.cuDeviceGet(ctypes.byref(device), ordinal)):
                break
            devices.append({"index": ordinal, **_describe_device(lib, device, driver)})
    except AttributeError:
        # A driver too old to export one of the symbols: report what was read before it.
        return devices
    return devices


def open_if_loaded(path: str) -> Any | None:
    """Handle to the shared library at path if this process has already loaded it, else None."""
    # RTLD_NOLOAD makes dlopen fail instead of loading: probing must not change the process.
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0)
    try:
        return ctypes.CDLL(path, mode=mode)
    except OSError:
        return None


def _runtime_version(path: str) -> str | None:
    lib = open_if_loaded(path)
    get_version = getattr(lib, "cudaRuntimeGetVersion", None) if lib is not None else None
    if get_version is None:
        return None
    value = ctypes.c_int(0)
    if not _ok(get_version(ctypes.byref(value))):
        return None
    return format_driver_version(value.value)


def _cudnn_version(path: str) -> str | None:
    lib = open_if_loaded(path)
    get_version = getattr(lib, "cudnnGetVersion", None) if lib is not None else None
    if get_version is None:
        return None
    get_version.restype = ctypes.c_size_t
    get_version.argtypes = []
    return format_cudnn_version(int(get_version()))


def loaded_library_versions() -> dict[str, str | None]:
    """Driver version plus the cudart and cuDNN versions of libraries already loaded here."""
    try:
        maps_text = _PROC_MAPS.read_text(encoding="utf-8", errors="replace")
    except OSError:
        maps_text = ""
    cudart_path = find_loaded_library(maps_text, "libcudart")
    cudnn_path = find_loaded_library(maps_text, "libcudnn")
    return {
        "driver_version": cuda_driver_version(),
        "runtime_version": _runtime_version(cudart_path) if cudart_path else None,
        "cudnn_version": _cudnn_version(cudnn_path) if cudnn_path else None,
    }
