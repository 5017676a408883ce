// The module's functions for tests only (tests/test_cuda_transport.py):
// the CUDA stand-in, and a tap or a call made as the CUDA handlers make
// them, with host memory for "device" memory and a stand-in stream.

#include "module_support.h"

#include <cstdint>
#include <vector>

#include "cuda_api.h"
#include "hub.h"

namespace hcb::python {
namespace {

PyObject* TestingCudaStandIn(PyObject*, PyObject* args) {
  const char* path;
  if (!PyArg_ParseTuple(args, "s", &path)) return nullptr;
  return CatchToPython([&] { return NoneOrRaise(hcb::InstallCudaStandIn(path)); });
}

PyObject* TestingCudaTap(PyObject*, PyObject* args) {
  long long ordinal, site;
  unsigned long long stream;
  PyObject* arrays;
  if (!PyArg_ParseTuple(args, "LKLO", &ordinal, &stream, &site, &arrays)) {
    return nullptr;
  }
  std::vector<hcb::Span> spans;
  if (!SpanList(arrays, &spans)) return nullptr;
  return CatchToPython([&] {
    hcb::Status status;
    WithoutGil([&] {
      status = hub().CudaSend(ordinal, reinterpret_cast<void*>(stream), site,
                              spans.data(), spans.size());
    });
    return NoneOrRaise(status);
  });
}

PyObject* TestingCudaCall(PyObject*, PyObject* args) {
  long long ordinal, site;
  unsigned long long stream;
  PyObject *arrays, *results;
  if (!PyArg_ParseTuple(args, "LKLOO", &ordinal, &stream, &site, &arrays,
                        &results)) {
    return nullptr;
  }
  std::vector<hcb::Span> spans, outputs;
  if (!SpanList(arrays, &spans) || !SpanList(results, &outputs)) {
    return nullptr;
  }
  return CatchToPython([&] {
    hcb::Status status;
    WithoutGil([&] {
      status = hub().CudaCall(ordinal, reinterpret_cast<void*>(stream), site,
                              spans.data(), spans.size(), outputs.data(),
                              outputs.size());
    });
    return NoneOrRaise(status);
  });
}

}  // namespace

PyMethodDef kTestingMethods[] = {
    {"_testing_cuda_standin", TestingCudaStandIn, METH_VARARGS, nullptr},
    {"_testing_cuda_tap", TestingCudaTap, METH_VARARGS, nullptr},
    {"_testing_cuda_call", TestingCudaCall, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
