"""The C ABI as Python sees it: constants equal to tpfuse_c.h's, one NCCL in the process (torch's, at
or past the build's floor), and the library's statuses turned into exceptions with their messages."""

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tpfuse
from tpfuse import _library
from tpfuse.errors import StatusCode, error_for

HEADER = Path(__file__).resolve().parents[3] / "include" / "tpfuse" / "tpfuse_c.h"


def header_constants():
    """NAME -> value of every `NAME = value` enumerator and `#define NAME value` of tpfuse_c.h."""
    text = HEADER.read_text()
    pairs = re.findall(r"^\s*(TPFUSE_\w+)\s*=\s*(\d+)\s*,", text, re.M)
    pairs += re.findall(r"^#define\s+(TPFUSE_\w+)\s+(\d+)\s*$", text, re.M)
    return {name: int(value) for name, value in pairs}


def test_constants_match_the_header():
    constants = header_constants()
    status_names = {name[len("TPFUSE_"):] for name in constants} & set(StatusCode.__members__)
    assert status_names == set(StatusCode.__members__)
    for code in StatusCode:
        assert constants["TPFUSE_" + code.name] == code.value
    assert constants["TPFUSE_WEIGHT_KXN"] == _library.WEIGHT_LAYOUT_CODES["kn"]
    assert constants["TPFUSE_WEIGHT_NXK"] == _library.WEIGHT_LAYOUT_CODES["nk"]
    assert constants["TPFUSE_DTYPE_BF16"] == _library.DTYPE_CODES[torch.bfloat16]
    assert constants["TPFUSE_DTYPE_E4M3"] == _library.DTYPE_CODES[torch.float8_e4m3fn]
    assert {name: constants["TPFUSE_SCALING_" + name.upper()] for name in _library.SCALING_CODES} == \
        _library.SCALING_CODES
    assert {name: constants["TPFUSE_ACCUMULATION_" + name.upper()] for name in _library.ACCUMULATION_CODES} == \
        _library.ACCUMULATION_CODES
    assert constants["TPFUSE_NCCL_UNIQUE_ID_BYTES"] == _library.NCCL_UNIQUE_ID_BYTES
    assert constants["TPFUSE_C_API_VERSION"] == _library.C_API_VERSION


def test_every_code_has_its_exception():
    for code in StatusCode:
        if code == StatusCode.OK:
            continue
        error = error_for(code, "the message")
        assert isinstance(error, tpfuse.TpfuseError) and error.code == code and str(error) == "the message"
    assert isinstance(error_for(StatusCode.INVALID_ARGUMENT, ""), ValueError)
    assert isinstance(error_for(StatusCode.PEER_TIMEOUT, ""), TimeoutError)
    assert isinstance(error_for(99, "x"), tpfuse.InternalError)


def test_one_nccl_in_the_process_and_it_is_torchs():
    info = tpfuse.nccl_info()
    assert info.loaded_by_torch, "torch loaded no libnccl.so before tpfuse"
    assert _library.loaded_nccl_paths() == [info.path]
    assert not info.exact and info.runtime_version >= info.required_version == 21300
    major, minor, patch = torch.cuda.nccl.version()
    assert info.runtime_version == major * 10000 + minor * 100 + patch == _library.torch_nccl_version()
    package_library = _library.torch_nccl_package_library()
    if package_library is not None:
        assert Path(info.path).resolve() == package_library.resolve()


def test_an_nccl_below_the_floor_or_another_than_a_device_api_builds_is_refused():
    _library.check_nccl_versions(_library.NcclInfo("libnccl.so.2", 23007, 21300, False, True))
    _library.check_nccl_versions(_library.NcclInfo("libnccl.so.2", 21300, 21300, False, True))
    with pytest.raises(tpfuse.UnsupportedError, match=r"needs NCCL 2.13.0 or later, and this process runs NCCL "
                                                      r"2.12.12 .*pip install -U torch"):
        _library.check_nccl_versions(_library.NcclInfo("libnccl.so.2", 21212, 21300, False, True))
    _library.check_nccl_versions(_library.NcclInfo("libnccl.so.2", 22809, 22809, True, True))
    with pytest.raises(tpfuse.UnsupportedError, match="built with NCCL 2.28.9's device API compiled in, but this "
                                                      "process runs NCCL 2.30.7"):
        _library.check_nccl_versions(_library.NcclInfo("libnccl.so.2", 23007, 22809, True, True))


def test_nccl_is_resolved_at_run_time_from_a_library_that_has_it():
    # In a process without torch (so without NCCL): libtpfuse.so alone.
    script = f"""
import ctypes
lib = ctypes.CDLL({str(_library.LIBRARY_PATH)!r})
lib.tpfuse_last_error.restype = ctypes.c_char_p
def show(status):
    print(status, lib.tpfuse_last_error().decode())
show(lib.tpfuse_nccl_get_unique_id(ctypes.create_string_buffer(128)))
show(lib.tpfuse_nccl_open(None))
show(lib.tpfuse_nccl_open(b"libc.so.6"))
"""
    lines = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                           text=True).stdout.splitlines()
    assert lines[0].startswith(f"{StatusCode.NCCL_ERROR} ncclGetUniqueId failed: NCCL is not loaded")
    assert lines[1].startswith(f"{StatusCode.UNSUPPORTED} no libnccl.so.2 is loaded in this process")
    assert lines[2] == f"{StatusCode.UNSUPPORTED} libc.so.6 lacks ncclGetVersion, ncclGetUniqueId, " \
        "ncclCommInitRank, ncclCommDestroy, ncclCommCount, ncclCommCuDevice, ncclCommUserRank, ncclAllGather, " \
        "ncclGetErrorString, ncclGetLastError: tpfuse needs NCCL 2.13 or later"
    # In this process: torch's NCCL, opened at load; opening it again changes nothing.
    tpfuse._library.library().call("tpfuse_nccl_open", tpfuse.nccl_info().path.encode())


NULLS = (None,) * 8  # the pointers (operands, scales, bias, outputs, stream) of a call that fails before them


def test_a_failed_status_raises_with_the_librarys_message():
    library = tpfuse._library.library()
    with pytest.raises(tpfuse.InvalidArgumentError, match="comm must not be null"):
        library.call("tpfuse_gemm_reduce_scatter", None, 512, 64, 64, 1, 1, 0, 0, 0, 1, *NULLS[:7])
    with pytest.raises(tpfuse.InvalidArgumentError, match="comm must not be null"):
        library.call("tpfuse_all_gather_gemm", None, 512, 64, 64, 1, 1, 0, 0, 0, 1, *NULLS)
    with pytest.raises(tpfuse.InvalidArgumentError, match="weight_layout = 7 is neither"):
        library.call("tpfuse_all_gather_gemm", None, 512, 64, 64, 1, 7, 0, 0, 0, 1, *NULLS)
    with pytest.raises(tpfuse.InvalidArgumentError, match="a must not be null"):
        library.call("tpfuse_gemm", 512, 64, 64, 1, 0, 0, 0, *NULLS[:6])
    with pytest.raises(tpfuse.InvalidArgumentError, match="weight_layout = 2 is neither"):
        library.call("tpfuse_gemm", 512, 64, 64, 2, 0, 0, 0, *NULLS[:6])
    # The dtype: a code the C ABI does not name is a bad argument.
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"dtype = 7 is neither TPFUSE_DTYPE_BF16 \(0\) nor "
                                                          r"TPFUSE_DTYPE_E4M3 \(1\)"):
        library.call("tpfuse_gemm", 512, 64, 64, 1, 7, 0, 0, *NULLS[:6])
    with pytest.raises(tpfuse.InvalidArgumentError, match="dtype = 2 is neither"):
        library.call("tpfuse_all_gather_gemm", None, 512, 64, 64, 1, 1, 2, 0, 0, 1, *NULLS)
    # E4M3 comes with a scaling and an N x K weight; BF16 with no scaling; the codes are the header's.
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"problem.dtype = E4M3 needs a scaling \(kTensorwise, "
                                                          r"kRowwise or kBlockwise\), not kNone"):
        library.call("tpfuse_gemm", 512, 64, 64, 1, 1, 0, 0, *NULLS[:6])
    # Blockwise (the code the package passes) is accepted by the GEMM, promoted and K a multiple of 128 only.
    blockwise = _library.SCALING_CODES["blockwise"]
    with pytest.raises(tpfuse.InvalidArgumentError, match="a must not be null"):
        library.call("tpfuse_gemm", 512, 64, 256, 1, 1, blockwise, 0, *NULLS[:6])
    with pytest.raises(tpfuse.InvalidArgumentError, match="accumulation = fast with blockwise scaling"):
        library.call("tpfuse_gemm", 512, 64, 256, 1, 1, blockwise, 1, *NULLS[:6])
    with pytest.raises(tpfuse.InvalidArgumentError, match="k_per_rank = 64 is not a multiple of 128"):
        library.call("tpfuse_gemm", 512, 64, 64, 1, 1, blockwise, 0, *NULLS[:6])
    with pytest.raises(tpfuse.UnsupportedError, match="problem.weight_layout = KxN with E4M3 inputs: FP8 takes an "
                                                      "N x K weight"):
        library.call("tpfuse_gemm", 512, 64, 64, 0, 1, 1, 0, *NULLS[:6])
    with pytest.raises(tpfuse.InvalidArgumentError, match="problem.scaling = rowwise with BF16 inputs"):
        library.call("tpfuse_gemm", 512, 64, 64, 1, 0, 2, 0, *NULLS[:6])
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"scaling = 7 is not TPFUSE_SCALING_NONE \(0\)"):
        library.call("tpfuse_gemm", 512, 64, 64, 1, 1, 7, 0, *NULLS[:6])
    with pytest.raises(tpfuse.InvalidArgumentError, match=r"accumulation = 5 is neither "
                                                          r"TPFUSE_ACCUMULATION_PROMOTED \(0\)"):
        library.call("tpfuse_gemm", 512, 64, 64, 1, 1, 1, 5, *NULLS[:6])
    with pytest.raises(tpfuse.InvalidArgumentError, match="comm must not be null"):
        library.call("tpfuse_communicator_create", None, 512, 64, 0, 0.0, ctypes.byref(ctypes.c_void_p()))
    with pytest.raises(tpfuse.InvalidArgumentError, match="comm and bytes must not be null"):
        library.call("tpfuse_communicator_workspace_bytes", None, ctypes.byref(ctypes.c_int64()))
    with pytest.raises(tpfuse.InvalidArgumentError, match="rank 3 of world_size 2 is out of range"):
        library.call("tpfuse_nccl_comm_init_rank", ctypes.byref(ctypes.c_void_p()), 2,
                     bytes(_library.NCCL_UNIQUE_ID_BYTES), 3, 0)
    # The message is that of the thread's last call: gone after one that succeeded.
    runtime, required, exact = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    library.call("tpfuse_nccl_versions", ctypes.byref(runtime), ctypes.byref(required), ctypes.byref(exact))
    assert library._dll.tpfuse_last_error() == b""


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None, reason="needs binutils")
def test_the_library_exports_the_c_abi_only_and_needs_no_libcudart_and_no_libnccl():
    exported = subprocess.run(["nm", "-D", "--defined-only", str(_library.LIBRARY_PATH)], check=True,
                              capture_output=True, text=True).stdout.split()[2::3]
    assert exported and all(name.startswith("tpfuse_") for name in exported), exported
    assert set(_library._SIGNATURES) <= set(exported)
    dynamic = subprocess.run(["readelf", "-d", str(_library.LIBRARY_PATH)], check=True, capture_output=True,
                             text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic)
    assert not [name for name in needed if name.startswith(("libcudart", "libnccl"))], needed


def test_without_a_process_group_the_call_says_so():
    assert not torch.distributed.is_initialized()
    a, w = torch.zeros(16, 8, dtype=torch.bfloat16), torch.zeros(8, 8, dtype=torch.bfloat16)
    with pytest.raises(tpfuse.InvalidArgumentError, match="no process group: call torch.distributed.init_process_group"):
        tpfuse.gemm_reduce_scatter(a, w)
