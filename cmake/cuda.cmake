# CUDA for Hopper (sm_90a: wgmma, setmaxnreg, TMA), cuBLAS, NCCL and the CuTe/CUTLASS headers.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# The architecture is passed as -gencode below; CMake's own architecture flags stay off.
set(CMAKE_CUDA_ARCHITECTURES OFF)
enable_language(CUDA)
find_package(CUDAToolkit 12.8 REQUIRED)

set(TPFUSE_CUDA_GENCODE "-gencode=arch=compute_90a,code=sm_90a" CACHE STRING
    "nvcc -gencode flags (tpfuse's kernels need sm_90a)")
separate_arguments(_tpfuse_gencode UNIX_COMMAND "${TPFUSE_CUDA_GENCODE}")

# CuTe/CUTLASS 4.2 headers, installed by scripts/install_deps.sh into third_party/ (git-ignored).
set(TPFUSE_CUTLASS_DIR "${PROJECT_SOURCE_DIR}/third_party/cutlass" CACHE PATH
    "Folder holding CUTLASS's include/ (from PyPI nvidia-cutlass==4.2.0.0)")
if(NOT EXISTS "${TPFUSE_CUTLASS_DIR}/include/cute/tensor.hpp")
  message(FATAL_ERROR
    "CuTe/CUTLASS 4.2 headers not found under ${TPFUSE_CUTLASS_DIR}/include.\n"
    "Run scripts/install_deps.sh (it installs nvidia-cutlass==4.2.0.0 from PyPI into third_party/), "
    "or pass -DTPFUSE_CUTLASS_DIR=<folder with include/cute>.")
endif()

# NCCL. With TPFUSE_NCCL_DEVICE_API (the C++ build: tests, benchmark, the installed package), the
# kernels inline NCCL's device API (nccl_device.h, for the NCCL symmetric transport) and the library
# links libnccl: run it with the NCCL of its headers. Without (the Python package, cmake/python.cmake),
# no NCCL headers or library are needed: peers' addresses come from CUDA IPC, and NCCL's host functions
# are resolved at run time from the libnccl.so.2 that PyTorch loads (src/capi/nccl_runtime.cpp), any
# version from 2.13 on.
option(TPFUSE_NCCL_DEVICE_API "Inline NCCL's device API and link NCCL (OFF: the Python package's build)" ON)
add_library(tpfuse_nccl INTERFACE)
if(TPFUSE_NCCL_DEVICE_API)
  # NCCL ships with some CUDA toolkits (2.28.x, with nccl_device.h); else libnccl-dev.
  find_path(TPFUSE_NCCL_INCLUDE_DIR nccl_device.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include /usr/local/include)
  find_library(TPFUSE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu /usr/local/lib)
  # A cached folder (an earlier configure, or -D) is kept as it is: check that it still has the device API.
  if(NOT TPFUSE_NCCL_INCLUDE_DIR OR NOT TPFUSE_NCCL_LIBRARY OR NOT EXISTS "${TPFUSE_NCCL_INCLUDE_DIR}/nccl_device.h")
    message(FATAL_ERROR "NCCL 2.28 or later (nccl.h, nccl_device.h and libnccl.so) not found; it ships with some "
                        "CUDA toolkits (or install libnccl-dev). Pass -DTPFUSE_NCCL_INCLUDE_DIR= and "
                        "-DTPFUSE_NCCL_LIBRARY=, or -DTPFUSE_NCCL_DEVICE_API=OFF for the library alone.")
  endif()
  target_link_libraries(tpfuse_nccl INTERFACE ${TPFUSE_NCCL_LIBRARY})
  target_compile_definitions(tpfuse_nccl INTERFACE TPFUSE_NCCL_DEVICE_API=1)
else()
  if(TPFUSE_TESTS OR TPFUSE_BENCH)
    message(FATAL_ERROR "TPFUSE_NCCL_DEVICE_API=OFF builds the library alone (the Python package): "
                        "pass -DTPFUSE_TESTS=OFF -DTPFUSE_BENCH=OFF too")
  endif()
  set(TPFUSE_NCCL_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/src/capi/nccl_host")
  set(TPFUSE_NCCL_LIBRARY "")
  target_link_libraries(tpfuse_nccl INTERFACE ${CMAKE_DL_LIBS})
  target_compile_definitions(tpfuse_nccl INTERFACE TPFUSE_NCCL_DEVICE_API=0)
endif()
target_include_directories(tpfuse_nccl INTERFACE ${TPFUSE_NCCL_INCLUDE_DIR})

# Compile options for every CUDA target of the project.
function(tpfuse_cuda_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${_tpfuse_gencode} --expt-relaxed-constexpr -lineinfo>)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
endfunction()
