# Decides whether the CUDA kernels are built and sets ONNX_NORM_WITH_CUDA, ONNX_NORM_CUDA_SOURCES and
# ONNX_NORM_CUDA_ARCHITECTURES. CUDA is optional: any reason not to build it falls back to a CPU-only
# library with a message, never a configure error.

option(ONNX_NORM_ENABLE_CUDA "Build the CUDA kernels when a CUDA compiler is found" ON)
# The environment variable wins over the cache so that `ONNX_NORM_ENABLE_CUDA=OFF pip install .` works
# even with a persistent build directory configured earlier with CUDA on.
if(DEFINED ENV{ONNX_NORM_ENABLE_CUDA})
  set(ONNX_NORM_ENABLE_CUDA "$ENV{ONNX_NORM_ENABLE_CUDA}")
endif()
# The release list (tools/build_wheel.sh): SASS for Ampere (sm_80 A100, sm_86 RTX 30/A10), Ada (sm_89), Hopper
# (sm_90) and Blackwell (sm_100 B200, also run by sm_103; sm_120 RTX 50/RTX PRO, also run by sm_121), and
# compute_120 PTX that the driver compiles for anything newer. tools/setup.sh builds a shorter development list
# (`native` on a GPU machine, sm_90 without one).
set(ONNX_NORM_CUDA_ARCHITECTURES_RELEASE "80-real;86-real;89-real;90-real;100-real;120-real;120-virtual")
set(ONNX_NORM_CUDA_ARCHITECTURES "release"
    CACHE STRING "CUDA architectures (CMake CUDA_ARCHITECTURES syntax or `release`; also read from the environment)")
# The environment wins over the cache, as for ONNX_NORM_ENABLE_CUDA: a persistent build directory configured
# with one list is rebuilt with the one asked for.
if(DEFINED ENV{ONNX_NORM_CUDA_ARCHITECTURES} AND NOT "$ENV{ONNX_NORM_CUDA_ARCHITECTURES}" STREQUAL "")
  set(ONNX_NORM_CUDA_ARCHITECTURES "$ENV{ONNX_NORM_CUDA_ARCHITECTURES}" CACHE STRING
      "CUDA architectures (CMake CUDA_ARCHITECTURES syntax or `release`; also read from the environment)" FORCE)
endif()
# `release` names the list above, so that scripts need not repeat it.
if(ONNX_NORM_CUDA_ARCHITECTURES STREQUAL "release")
  set(ONNX_NORM_CUDA_ARCHITECTURES "${ONNX_NORM_CUDA_ARCHITECTURES_RELEASE}")
endif()

set(ONNX_NORM_WITH_CUDA OFF)
file(GLOB ONNX_NORM_CUDA_SOURCES CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/*.cu")

if(NOT ONNX_NORM_ENABLE_CUDA)
  message(STATUS "onnx-norm: CUDA kernels disabled (ONNX_NORM_ENABLE_CUDA=${ONNX_NORM_ENABLE_CUDA})")
elseif(NOT ONNX_NORM_CUDA_SOURCES)
  message(STATUS "onnx-norm: no CUDA sources in src/cuda; building the CPU kernels only")
else()
  # check_language(CUDA) skips its probe when CMAKE_CUDA_COMPILER is preset, and enable_language then
  # fails hard on a path that does not exist: drop such a path and fall back to CPU-only.
  if(CMAKE_CUDA_COMPILER AND NOT EXISTS "${CMAKE_CUDA_COMPILER}")
    message(STATUS "onnx-norm: CMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER} does not exist; building without CUDA")
    unset(CMAKE_CUDA_COMPILER CACHE)
    unset(CMAKE_CUDA_COMPILER)
  else()
    set(_reason "no CUDA compiler found (nvcc on PATH, CUDACXX or CMAKE_CUDA_COMPILER)")
    if(NOT CMAKE_CUDA_COMPILER AND DEFINED ENV{CUDACXX} AND NOT EXISTS "$ENV{CUDACXX}")
      set(_reason "CUDACXX=$ENV{CUDACXX} does not exist")
    else()
      include(CheckLanguage)
      check_language(CUDA)
    endif()
    if(CMAKE_CUDA_COMPILER)
      enable_language(CUDA)
      set(CMAKE_CUDA_STANDARD 17)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      # Otherwise nvcc-compiled launchers and template instantiations are exported (the version script
      # also hides them; this keeps the symbol table small).
      set(CMAKE_CUDA_VISIBILITY_PRESET hidden)
      set(ONNX_NORM_WITH_CUDA ON)
      message(STATUS "onnx-norm: building CUDA kernels with ${CMAKE_CUDA_COMPILER} "
                     "(${CMAKE_CUDA_COMPILER_VERSION}) for ${ONNX_NORM_CUDA_ARCHITECTURES}")
    else()
      message(STATUS "onnx-norm: ${_reason}; building the CPU kernels only")
    endif()
  endif()
endif()
