# The Python package, built by `pip install .` through scikit-build-core: libtpfuse.so, the C ABI of
# include/tpfuse/tpfuse_c.h, installed next to python/tpfuse, which loads it with ctypes. Only the
# target tpfuse_python and the install component `python` are built (pyproject.toml), not the
# tests or the benchmark.
#
# NCCL: none at build time. The package is built without NCCL's device API (TPFUSE_NCCL_DEVICE_API=OFF,
# cmake/cuda.cmake): peers' addresses come from CUDA IPC and NCCL's host functions are resolved at run
# time from the libnccl.so.2 PyTorch loads (src/capi/nccl_runtime.cpp), so one build runs with every
# torch whose NCCL is 2.13 or later. This file is included before cmake/cuda.cmake.
if(NOT TPFUSE_CUDA)
  message(FATAL_ERROR "The Python package needs the CUDA library: build it with TPFUSE_CUDA=ON.")
endif()
if(CMAKE_VERSION VERSION_LESS 3.24)
  message(FATAL_ERROR "The Python package needs CMake 3.24 or later (found ${CMAKE_VERSION}).")
endif()
set(TPFUSE_NCCL_DEVICE_API OFF CACHE BOOL "Inline NCCL's device API and link NCCL" FORCE)
set(TPFUSE_BENCH OFF CACHE BOOL "Build the benchmark" FORCE)

# CuTe/CUTLASS headers: third_party/cutlass (scripts/install_deps.sh) when present, else those of the
# nvidia-cutlass package, a build requirement in pyproject.toml (its headers are in
# cutlass_library/source/include; found without importing it).
if(NOT DEFINED TPFUSE_CUTLASS_DIR AND NOT EXISTS "${PROJECT_SOURCE_DIR}/third_party/cutlass/include/cute/tensor.hpp")
  find_package(Python COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import importlib.util as u; print(list(u.find_spec('cutlass_library').submodule_search_locations)[0])"
    RESULT_VARIABLE _tpfuse_no_cutlass
    OUTPUT_VARIABLE _tpfuse_cutlass_library
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_tpfuse_no_cutlass EQUAL 0 AND EXISTS "${_tpfuse_cutlass_library}/source/include/cute/tensor.hpp")
    set(TPFUSE_CUTLASS_DIR "${_tpfuse_cutlass_library}/source")
    message(STATUS "tpfuse: CuTe/CUTLASS headers of the nvidia-cutlass package: ${TPFUSE_CUTLASS_DIR}")
  endif()
endif()

# libtpfuse.so is the static library's code, whole (c_api.cpp is in src/CMakeLists.txt's objects; the
# header it exports is its one listed source), plus NCCL's host functions resolved at run time. The
# CUDA runtime is linked statically (--as-needed drops the libcudart.so that tpfuse's usage
# requirements also name), so the library does not depend on which libcudart the process has; the
# version script exports only the tpfuse_* functions, so that neither the static runtime, the C++ API
# nor the ncclXxx forwarders bind to, or are bound by, another library's symbols of the same name.
add_library(tpfuse_python SHARED ${PROJECT_SOURCE_DIR}/include/tpfuse/tpfuse_c.h
                                 ${PROJECT_SOURCE_DIR}/src/capi/nccl_runtime.cpp)
target_include_directories(tpfuse_python PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
                                                 ${PROJECT_SOURCE_DIR}/src/capi/nccl_host)
target_link_libraries(tpfuse_python PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,tpfuse_static>" CUDA::cudart_static
                                            ${CMAKE_DL_LIBS})
target_link_options(tpfuse_python PRIVATE
  "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/tpfuse_c.map" "LINKER:--as-needed" "LINKER:--no-undefined")
set_target_properties(tpfuse_python PROPERTIES OUTPUT_NAME tpfuse LINKER_LANGUAGE CXX)
install(TARGETS tpfuse_python LIBRARY DESTINATION tpfuse COMPONENT python)
