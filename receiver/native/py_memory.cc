// The Memory type: see py_memory.h.

#include "py_memory.h"

#include <cstdint>

namespace hcb::python {
namespace {

struct MemoryObject {
  PyObject_HEAD
  void* data;
  Py_ssize_t nbytes;
  Block* block;       // owned, or null
  PyObject* keep;     // owned reference, or null
  PyObject* weakrefs;
};

int GetBuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* memory = reinterpret_cast<MemoryObject*>(self);
  return PyBuffer_FillInfo(view, self, memory->data, memory->nbytes,
                           /*readonly=*/0, flags);
}

PyBufferProcs buffer_procs = {GetBuffer, nullptr};

void Dealloc(PyObject* self) {
  auto* memory = reinterpret_cast<MemoryObject*>(self);
  if (memory->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  if (memory->block != nullptr) ReturnBlock(memory->block);
  Py_XDECREF(memory->keep);
  Py_TYPE(self)->tp_free(self);
}

// Memory(address, nbytes, block=0, keep=None), for the Python receiver:
// `block` is the address of a Block that hcb's take lent, `keep` an object
// that owns the memory at `address`.
PyObject* New(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"address", "nbytes", "block", "keep",
                                   nullptr};
  unsigned long long address = 0, block = 0;
  Py_ssize_t nbytes = 0;
  PyObject* keep = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Kn|KO",
                                   const_cast<char**>(keywords), &address,
                                   &nbytes, &block, &keep)) {
    return nullptr;
  }
  if (nbytes < 0) {
    PyErr_SetString(PyExc_ValueError, "Memory: nbytes must be >= 0");
    return nullptr;
  }
  if (keep == Py_None) keep = nullptr;
  (void)type;
  return NewMemory(reinterpret_cast<void*>(address), nbytes,
                   reinterpret_cast<Block*>(block), keep);
}

}  // namespace

PyTypeObject MemoryType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* NewMemory(void* data, Py_ssize_t nbytes, Block* block,
                    PyObject* keep) {
  auto* memory = PyObject_New(MemoryObject, &MemoryType);
  if (memory == nullptr) {
    if (block != nullptr) ReturnBlock(block);
    return nullptr;
  }
  memory->data = data;
  memory->nbytes = nbytes;
  memory->block = block;
  Py_XINCREF(keep);
  memory->keep = keep;
  memory->weakrefs = nullptr;
  return reinterpret_cast<PyObject*>(memory);
}

bool ReadyMemoryType() {
  MemoryType.tp_name = "host_callback.receiver._native.Memory";
  MemoryType.tp_basicsize = sizeof(MemoryObject);
  MemoryType.tp_flags = Py_TPFLAGS_DEFAULT;
  MemoryType.tp_doc =
      "Memory(address, nbytes, block=0, keep=None): memory lent to host "
      "functions, viewed by NumPy arrays through the buffer protocol; a "
      "pool block goes back to the pool when the last view is gone.";
  MemoryType.tp_as_buffer = &buffer_procs;
  MemoryType.tp_dealloc = Dealloc;
  MemoryType.tp_new = New;
  MemoryType.tp_weaklistoffset = offsetof(MemoryObject, weakrefs);
  return PyType_Ready(&MemoryType) == 0;
}

}  // namespace hcb::python
