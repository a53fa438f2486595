# Decides whether the CUDA kernels are built and sets ONNX_NORM_WITH_CUDA, ONNX_NORM_CUDA_SOURCES and
# ONNX_NORM_CUDA_ARCHITECTURES. CUDA is optional: any reason not to build it falls back to a CPU-only
# library with a message, never a configure error.

option(ONNX_NORM_ENABLE_CUDA "Build the CUDA kernels when a CUDA compiler is found" ON)
# The environment variable wins over the cache so that `ONNX_NORM_ENABLE_CUDA=OFF pip install .` works
# even with a persistent build directory configured earlier with CUDA on.
if(DEFINED ENV{ONNX_NORM_ENABLE_CUDA})
  set(ONNX_NORM_ENABLE_CUDA "$ENV{ONNX_NORM_ENABLE_CUDA}")
endif()
set(ONNX_NORM_CUDA_ARCHITECTURES "80-real;86-real;89-real;90-real;90-virtual"
    CACHE STRING "CUDA architectures: SASS for sm_80/86/89/90 and compute_90 PTX for newer GPUs")

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
