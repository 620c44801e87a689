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

# NCCL ships with the CUDA toolkit (2.28.x, with the device API header nccl_device.h).
find_path(TPFUSE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include /usr/local/include)
find_library(TPFUSE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu /usr/local/lib)
if(NOT TPFUSE_NCCL_INCLUDE_DIR OR NOT TPFUSE_NCCL_LIBRARY)
  message(FATAL_ERROR "NCCL (nccl.h and libnccl.so, 2.28 or later) not found; it ships with the CUDA toolkit "
                      "(or install libnccl-dev). Pass -DTPFUSE_NCCL_INCLUDE_DIR= and -DTPFUSE_NCCL_LIBRARY=.")
endif()
add_library(tpfuse_nccl INTERFACE)
target_include_directories(tpfuse_nccl INTERFACE ${TPFUSE_NCCL_INCLUDE_DIR})
target_link_libraries(tpfuse_nccl INTERFACE ${TPFUSE_NCCL_LIBRARY})

# Compile options for every CUDA target of the project.
function(tpfuse_cuda_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${_tpfuse_gencode} --expt-relaxed-constexpr -lineinfo>)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
endfunction()
