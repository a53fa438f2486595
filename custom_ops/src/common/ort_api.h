// The ONNX Runtime C++ API, with manual initialisation: the library must not reference OrtGetApiBase
// (the Python module does not export it); RegisterCustomOps receives the API table instead.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT
