// DLPack capsules over memory the package lends a host function: a GPU's
// buffers in a buffers=True call (receiver/device_buffers.py:CudaBuffer's
// __dlpack__). The capsule holds a reference to its Python owner until the
// consumer's deleter (or the capsule, never consumed) drops it, so that
// the direct runner sees an export the host function kept as a reference
// to the owner (python_runner.cc).
//
// The structs are DLPack's (dlpack.h, ABI stable since 0.6; the versioned
// one since 1.0), declared here: no DLPack header is needed to build.
// Called with the GIL; a deleter may run on any thread and takes it.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_DLPACK_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_DLPACK_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <vector>

namespace hcb::python {

// What an export describes: C-contiguous memory at `data` on DLPack device
// (`device_type`, `device_id`), of DLPack dtype (`code`, `bits`), lanes 1.
struct DlpackView {
  void* data;
  std::vector<int64_t> shape;
  uint8_t code;
  uint8_t bits;
  int32_t device_type;
  int32_t device_id;
  bool read_only;  // said only by a versioned capsule
};

// A new capsule, "dltensor_versioned" (DLPack 1.0, with its read-only
// flag) when `versioned`, else "dltensor"; it holds `owner`. Null with a
// Python exception set on failure.
PyObject* DlpackCapsule(PyObject* owner, const DlpackView& view,
                        bool versioned);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_DLPACK_H_
