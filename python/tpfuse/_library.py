"""libtpfuse.so, the C ABI (include/tpfuse/tpfuse_c.h), loaded with ctypes against PyTorch's NCCL.

NCCL's device API is header-only: it is compiled into tpfuse's kernels, so the NCCL library that runs
must be the version whose headers tpfuse was built with, and a process must not hold two NCCL
libraries (torch's communicator pointer is only meaningful to the NCCL that made it). So:
  1. torch is imported first; it loads its libnccl.so.2 (the nvidia.nccl package's) as a dependency
     of libtorch_cuda.so. If it did not (a torch with NCCL linked in statically), the nvidia.nccl
     package's libnccl.so.2 is loaded here, RTLD_GLOBAL.
  2. libtpfuse.so is loaded; its DT_NEEDED libnccl.so.2 resolves to the library already loaded,
     which the dynamic linker matches by soname.
  3. ncclGetVersion must equal the NCCL_VERSION_CODE of the headers of the build, else UnsupportedError.
torch's own communicator is used only when the loaded NCCL is the one torch itself links
(`loaded_by_torch`: loaded before tpfuse, of the version torch reports); otherwise tpfuse makes its
own communicator over the group.
"""

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch  # imported first: it loads its libnccl.so.2 (step 1 above)

from .errors import StatusCode, UnsupportedError, error_for

C_API_VERSION = 2  # TPFUSE_C_API_VERSION this package speaks
NCCL_UNIQUE_ID_BYTES = 128  # TPFUSE_NCCL_UNIQUE_ID_BYTES
WEIGHT_LAYOUT_CODES = {"kn": 0, "nk": 1}  # TPFUSE_WEIGHT_KXN, TPFUSE_WEIGHT_NXK

LIBRARY_PATH = Path(__file__).with_name("libtpfuse.so")

_c_int, _c_int64, _c_double, _c_void_p, _c_char_p = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_char_p)
_c_int_p, _c_void_pp = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)

# Argument types of each function of tpfuse_c.h that returns a status code.
_SIGNATURES = {
    "tpfuse_nccl_versions": [_c_int_p, _c_int_p],
    "tpfuse_nccl_get_unique_id": [_c_void_p],
    "tpfuse_nccl_comm_init_rank": [_c_void_pp, _c_int, _c_void_p, _c_int, _c_int],
    "tpfuse_nccl_comm_destroy": [_c_void_p],
    "tpfuse_communicator_create": [_c_void_p, _c_int64, _c_int64, _c_int64, _c_double, _c_void_pp],
    "tpfuse_communicator_destroy": [_c_void_p],
    "tpfuse_communicator_status": [_c_void_p],
    "tpfuse_gemm_reduce_scatter": [_c_void_p, _c_int64, _c_int64, _c_int64, _c_int, _c_int,
                                   _c_void_p, _c_void_p, _c_void_p, _c_void_p],
    "tpfuse_gemm": [_c_int64, _c_int64, _c_int64, _c_int, _c_void_p, _c_void_p, _c_void_p, _c_void_p],
    "tpfuse_all_gather_gemm": [_c_void_p, _c_int64, _c_int64, _c_int64, _c_int, _c_int,
                               _c_void_p, _c_void_p, _c_void_p, _c_void_p, _c_void_p],
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
    header_version: int    # NCCL_VERSION_CODE of the headers tpfuse was built with
    loaded_by_torch: bool  # loaded by torch itself, so torch's communicators are usable by tpfuse


def check_nccl_versions(nccl: NcclInfo) -> None:
    """Step 3 above: the NCCL that runs must be the version of the headers tpfuse was built with."""
    if nccl.runtime_version != nccl.header_version:
        raise UnsupportedError(
            f"tpfuse was built with NCCL {version_string(nccl.header_version)} headers, but this process runs NCCL "
            f"{version_string(nccl.runtime_version)} ({nccl.path}); NCCL's device API is compiled into tpfuse's "
            "kernels, so the two must match: rebuild tpfuse in this environment (pip install --no-build-isolation "
            "--no-deps .), which uses torch's NCCL headers (the nvidia.nccl package)")


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
        for name, argtypes in _SIGNATURES.items():
            function = getattr(self._dll, name)
            function.argtypes, function.restype = argtypes, _c_int
        self._dll.tpfuse_c_api_version.restype = _c_int
        self._dll.tpfuse_last_error.restype = _c_char_p

        api_version = self._dll.tpfuse_c_api_version()
        if api_version != C_API_VERSION:
            raise UnsupportedError(f"{LIBRARY_PATH} has C API version {api_version}, this package needs "
                                   f"{C_API_VERSION}: reinstall tpfuse")
        runtime, header = _c_int(), _c_int()
        self.call("tpfuse_nccl_versions", ctypes.byref(runtime), ctypes.byref(header))
        paths = loaded_nccl_paths()
        loaded_by_torch = torch_loaded_nccl and torch_nccl_version() == runtime.value
        self.nccl = NcclInfo(paths[0] if paths else None, runtime.value, header.value, loaded_by_torch)
        check_nccl_versions(self.nccl)

    def call(self, name: str, *args) -> None:
        """Calls tpfuse_<...>(*args); a status other than TPFUSE_OK raises its TpfuseError."""
        status = getattr(self._dll, name)(*args)
        if status != StatusCode.OK:
            raise error_for(status, self._dll.tpfuse_last_error().decode(errors="replace"))


_library: Optional[Library] = None
_library_lock = threading.Lock()


def library() -> Library:
    """The library, loaded on first use (importing tpfuse loads nothing compiled)."""
    global _library
    with _library_lock:
        if _library is None:
            _library = Library()
        return _library
