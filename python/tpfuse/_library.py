"""libtpfuse.so, the C ABI (include/tpfuse/tpfuse_c.h), loaded with ctypes against PyTorch's NCCL.

The package's build compiles no NCCL in (TPFUSE_NCCL_DEVICE_API=OFF): tpfuse calls only NCCL's stable
host API, resolved at run time, so any NCCL from the build's floor (2.13) on serves. A process must
hold one NCCL library, since torch's communicator pointer is only meaningful to the NCCL that made it:
  1. torch is imported first; it loads its libnccl.so.2 (the nvidia.nccl package's) as a dependency
     of libtorch_cuda.so. If it did not (a torch with NCCL linked in statically), the nvidia.nccl
     package's libnccl.so.2 is loaded here, RTLD_GLOBAL.
  2. libtpfuse.so is loaded and told that library's path (tpfuse_nccl_open), from which it resolves
     NCCL's functions.
  3. The NCCL must be the build's floor or later (a C++ build with NCCL's device API compiled in: its
     headers' version exactly), else UnsupportedError.
torch's own communicator is used only when the loaded NCCL is the one torch itself links
(`loaded_by_torch`: loaded before tpfuse, of the version torch reports); otherwise tpfuse makes its
own communicator over the group.
"""

import ctypes
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch  # imported first: it loads its libnccl.so.2 (step 1 above)

from .errors import StatusCode, UnsupportedError, error_for

C_API_VERSION = 7  # TPFUSE_C_API_VERSION this package speaks
NCCL_UNIQUE_ID_BYTES = 128  # TPFUSE_NCCL_UNIQUE_ID_BYTES
WEIGHT_LAYOUT_CODES = {"kn": 0, "nk": 1}  # TPFUSE_WEIGHT_KXN, TPFUSE_WEIGHT_NXK
# The inputs' dtype: TPFUSE_DTYPE_BF16, TPFUSE_DTYPE_E4M3 (every op serves it).
DTYPE_CODES = {torch.bfloat16: 0, torch.float8_e4m3fn: 1}
# How E4M3 inputs are scaled: TPFUSE_SCALING_NONE (BF16), _TENSORWISE, _ROWWISE, _BLOCKWISE.
SCALING_CODES = {"none": 0, "tensorwise": 1, "rowwise": 2, "blockwise": 3}
# How E4M3 products are accumulated: TPFUSE_ACCUMULATION_PROMOTED, _FAST (torch's use_fast_accum).
ACCUMULATION_CODES = {"promoted": 0, "fast": 1}

LIBRARY_NAME = "libtpfuse.so"


def find_library() -> Path:
    """libtpfuse.so: next to this file (an installed wheel), else in one of the package's folders (an
    editable install keeps the Python files in the repository and the library in site-packages)."""
    candidates = [Path(__file__).with_name(LIBRARY_NAME)]
    try:
        import importlib.resources
        candidates.append(Path(str(importlib.resources.files(__package__) / LIBRARY_NAME)))
    except (ImportError, TypeError, ValueError):
        pass
    package = sys.modules.get(__package__)
    candidates += [Path(folder) / LIBRARY_NAME for folder in getattr(package, "__path__", [])]
    return next((path for path in candidates if path.exists()), candidates[0])


LIBRARY_PATH = find_library()

_c_int, _c_int64, _c_double, _c_void_p, _c_char_p = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_char_p)
_c_int_p, _c_void_pp = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)

# Argument types of each function of tpfuse_c.h that returns a status code.
_SIGNATURES = {
    "tpfuse_nccl_open": [_c_char_p],
    "tpfuse_nccl_versions": [_c_int_p, _c_int_p, _c_int_p],
    "tpfuse_nccl_get_unique_id": [_c_void_p],
    "tpfuse_nccl_comm_init_rank": [_c_void_pp, _c_int, _c_void_p, _c_int, _c_int],
    "tpfuse_nccl_comm_destroy": [_c_void_p],
    "tpfuse_communicator_create": [_c_void_p, _c_int64, _c_int64, _c_int64, _c_double, _c_void_pp],
    "tpfuse_communicator_destroy": [_c_void_p],
    "tpfuse_communicator_status": [_c_void_p],
    "tpfuse_communicator_workspace_bytes": [_c_void_p, ctypes.POINTER(_c_int64)],
    # comm, m, n, k_per_rank, world_size, weight_layout, dtype, scaling, accumulation, batch, a, w, a_scale,
    # w_scale, bias, out, stream
    "tpfuse_gemm_reduce_scatter": [_c_void_p, _c_int64, _c_int64, _c_int64, _c_int, _c_int, _c_int, _c_int, _c_int,
                                   _c_int64, _c_void_p, _c_void_p, _c_void_p, _c_void_p, _c_void_p, _c_void_p,
                                   _c_void_p],
    # m, n, k, weight_layout, dtype, scaling, accumulation, a, w, a_scale, w_scale, c, stream
    "tpfuse_gemm": [_c_int64, _c_int64, _c_int64, _c_int, _c_int, _c_int, _c_int, _c_void_p, _c_void_p, _c_void_p,
                    _c_void_p, _c_void_p, _c_void_p],
    # comm, m, n_per_rank, k, world_size, weight_layout, dtype, scaling, accumulation, batch, x, w, x_scale,
    # w_scale, bias, y, gathered_x, stream
    "tpfuse_all_gather_gemm": [_c_void_p, _c_int64, _c_int64, _c_int64, _c_int, _c_int, _c_int, _c_int, _c_int,
                               _c_int64, _c_void_p, _c_void_p, _c_void_p, _c_void_p, _c_void_p, _c_void_p,
                               _c_void_p, _c_void_p],
}


def version_string(code: int) -> str:
    """NCCL's version code as text: 22809 -> "2.28.9"."""
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def loaded_library_paths(prefix: str) -> list:
    """The files mapped into this process (from /proc/self/maps) whose name starts with `prefix`."""
    paths = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if Path(path).name.startswith(prefix) and path not in paths:
                paths.append(path)
    return paths


def loaded_nccl_paths() -> list:
    return loaded_library_paths("libnccl.so")


def torch_nccl_package_library() -> Optional[Path]:
    """lib/libnccl.so.2 of the nvidia.nccl package that PyTorch's wheels depend on, if installed."""
    try:
        import nvidia.nccl
    except ImportError:
        return None
    candidate = Path(list(nvidia.nccl.__path__)[0]) / "lib" / "libnccl.so.2"
    return candidate if candidate.exists() else None


def torch_nccl_version() -> Optional[int]:
    """The version code of the NCCL torch calls, None for a torch without NCCL."""
    try:
        major, minor, patch = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return major * 10000 + minor * 100 + patch


@dataclass(frozen=True)
class NcclInfo:
    path: Optional[str]    # the libnccl.so the process runs, None if not found in the maps
    runtime_version: int   # its ncclGetVersion
    required_version: int  # the oldest NCCL the build runs with (exact: the only one)
    exact: bool            # NCCL's device API is compiled in: only its headers' version serves
    loaded_by_torch: bool  # loaded by torch itself, so torch's communicators are usable by tpfuse


def check_nccl_versions(nccl: NcclInfo) -> None:
    """Step 3 above: the NCCL that runs must be one the build serves."""
    runtime, required = version_string(nccl.runtime_version), version_string(nccl.required_version)
    if nccl.exact and nccl.runtime_version != nccl.required_version:
        raise UnsupportedError(
            f"this libtpfuse.so was built with NCCL {required}'s device API compiled in, but this process runs "
            f"NCCL {runtime} ({nccl.path}): install the Python package (pip install . in tpfuse's repository), "
            "whose build needs no particular NCCL")
    if nccl.runtime_version < nccl.required_version:
        raise UnsupportedError(
            f"tpfuse needs NCCL {required} or later, and this process runs NCCL {runtime} ({nccl.path}): "
            "upgrade torch (pip install -U torch), whose NCCL tpfuse uses")


class Library:
    """The loaded libtpfuse.so: call(name, *args) raises the tpfuse error of a failed status."""

    def __init__(self):
        if not LIBRARY_PATH.exists():
            raise UnsupportedError(
                f"tpfuse's compiled library {LIBRARY_PATH.name} is not next to the package "
                f"({LIBRARY_PATH.parent}); install tpfuse with `pip install .` from its repository")
        torch_loaded_nccl = bool(loaded_nccl_paths())
        package_library = None if torch_loaded_nccl else torch_nccl_package_library()
        try:
            if package_library is not None:
                ctypes.CDLL(str(package_library), mode=ctypes.RTLD_GLOBAL)
            self._dll = ctypes.CDLL(str(LIBRARY_PATH))
        except OSError as error:
            raise UnsupportedError(f"cannot load {LIBRARY_PATH}: {error}") from error
        self._dll.tpfuse_c_api_version.restype = _c_int
        self._dll.tpfuse_last_error.restype = _c_char_p
        api_version = self._dll.tpfuse_c_api_version()
        if api_version != C_API_VERSION:
            raise UnsupportedError(f"{LIBRARY_PATH} has C API version {api_version}, this package needs "
                                   f"{C_API_VERSION}: reinstall tpfuse (pip install . in its repository)")
        # Each function once, with its argument types: a call then costs one ctypes call.
        self.functions = {}
        for name, argtypes in _SIGNATURES.items():
            function = getattr(self._dll, name)
            function.argtypes, function.restype = argtypes, _c_int
            self.functions[name] = function

        paths = loaded_nccl_paths()
        if not paths:
            raise UnsupportedError("no libnccl.so.2 is loaded after importing torch, and the nvidia.nccl package "
                                   "is not installed: tpfuse needs a torch with CUDA (pip install torch)")
        self.call("tpfuse_nccl_open", paths[0].encode())
        runtime, required, exact = _c_int(), _c_int(), _c_int()
        self.call("tpfuse_nccl_versions", ctypes.byref(runtime), ctypes.byref(required), ctypes.byref(exact))
        loaded_by_torch = torch_loaded_nccl and torch_nccl_version() == runtime.value
        self.nccl = NcclInfo(paths[0], runtime.value, required.value, bool(exact.value), loaded_by_torch)
        check_nccl_versions(self.nccl)

    def error(self, status: int):
        """The TpfuseError of a failed status, with this thread's last message."""
        return error_for(status, self._dll.tpfuse_last_error().decode(errors="replace"))

    def call(self, name: str, *args) -> None:
        """Calls tpfuse_<...>(*args); a status other than TPFUSE_OK raises its TpfuseError."""
        status = self.functions[name](*args)
        if status != StatusCode.OK:
            raise self.error(status)


_library: Optional[Library] = None
_library_lock = threading.Lock()


def library() -> Library:
    """The library, loaded on first use (importing tpfuse loads nothing compiled)."""
    global _library
    with _library_lock:
        if _library is None:
            _library = Library()
        return _library
