# The Python package, built by `pip install .` through scikit-build-core: libtpfuse.so, the C ABI of
# include/tpfuse/tpfuse_c.h, installed next to python/tpfuse, which loads it with ctypes. Only the
# target tpfuse_python and the install component `python` are built (pyproject.toml), not the
# tests or the benchmark.
#
# NCCL: the kernels inline NCCL's device API (header-only), so the NCCL that runs must be the version
# whose headers the build used, and the NCCL that runs is the one PyTorch loads. When PyTorch's NCCL
# package (nvidia.nccl) is importable in the build's Python, its headers and library are used, unless
# -DTPFUSE_NCCL_INCLUDE_DIR= and -DTPFUSE_NCCL_LIBRARY= say otherwise. This file is included before
# cmake/cuda.cmake, whose find_path/find_library then keep these values.
if(NOT TPFUSE_CUDA)
  message(FATAL_ERROR "The Python package needs the CUDA library: build it with TPFUSE_CUDA=ON.")
endif()
if(CMAKE_VERSION VERSION_LESS 3.24)
  message(FATAL_ERROR "The Python package needs CMake 3.24 or later (found ${CMAKE_VERSION}).")
endif()

find_package(Python COMPONENTS Interpreter REQUIRED)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
  RESULT_VARIABLE _tpfuse_no_torch_nccl
  OUTPUT_VARIABLE _tpfuse_torch_nccl_dir
  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(_tpfuse_no_torch_nccl EQUAL 0 AND EXISTS "${_tpfuse_torch_nccl_dir}/include/nccl_device.h")
  set(TPFUSE_NCCL_INCLUDE_DIR "${_tpfuse_torch_nccl_dir}/include" CACHE PATH "Folder of nccl.h")
  set(TPFUSE_NCCL_LIBRARY "${_tpfuse_torch_nccl_dir}/lib/libnccl.so.2" CACHE FILEPATH "libnccl.so to link")
  message(STATUS "tpfuse: PyTorch's NCCL package at ${_tpfuse_torch_nccl_dir}")
else()
  message(STATUS "tpfuse: no nvidia.nccl package (with nccl_device.h) in ${Python_EXECUTABLE}; NCCL from the "
                 "CUDA toolkit or the system, which must be the version PyTorch loads")
endif()

# libtpfuse.so is the static library's code, whole (c_api.cpp is in src/CMakeLists.txt's objects; the
# header it exports is its one listed source). The CUDA runtime is linked statically (--as-needed drops
# the libcudart.so that tpfuse's usage requirements also name), so the library does not depend on which
# libcudart the process has; the version script exports only the tpfuse_* functions, so that neither
# the static runtime nor the C++ API binds to, or is bound by, another library's symbols of the same name.
add_library(tpfuse_python SHARED ${PROJECT_SOURCE_DIR}/include/tpfuse/tpfuse_c.h)
target_link_libraries(tpfuse_python PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,tpfuse_static>" CUDA::cudart_static)
target_link_options(tpfuse_python PRIVATE
  "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/tpfuse_c.map" "LINKER:--as-needed" "LINKER:--no-undefined")
set_target_properties(tpfuse_python PROPERTIES OUTPUT_NAME tpfuse LINKER_LANGUAGE CXX)
install(TARGETS tpfuse_python LIBRARY DESTINATION tpfuse COMPONENT python)
