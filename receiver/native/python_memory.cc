// The Memory type: see python_memory.h.

#include "python_memory.h"

#include <cstddef>
#include <cstdint>

#include <structmember.h>

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

void Dealloc(PyObject* self) {
  auto* memory = reinterpret_cast<MemoryObject*>(self);
  if (memory->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  if (memory->block != nullptr) ReturnBlock(memory->block);
  Py_XDECREF(memory->keep);
  // A heap type: each instance holds a reference to it.
  PyTypeObject* type = Py_TYPE(self);
  PyObject_Free(self);
  Py_DECREF(type);
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

PyMemberDef members[] = {
    // How the limited API (3.11) sets tp_weaklistoffset.
    {"__weaklistoffset__", T_PYSSIZET, offsetof(MemoryObject, weakrefs),
     READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot slots[] = {
    {Py_tp_doc, const_cast<char*>(
        "Memory(address, nbytes, block=0, keep=None): memory lent to host "
        "functions, viewed by NumPy arrays through the buffer protocol; a "
        "pool block goes back to the pool when the last view is gone.")},
    {Py_bf_getbuffer, reinterpret_cast<void*>(GetBuffer)},
    {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc)},
    {Py_tp_new, reinterpret_cast<void*>(New)},
    {Py_tp_members, members},
    {0, nullptr},
};

PyType_Spec spec = {
    "host_callback.receiver._native.Memory", sizeof(MemoryObject), 0,
    Py_TPFLAGS_DEFAULT, slots,
};

}  // namespace

PyTypeObject* MemoryType = nullptr;

PyObject* NewMemory(void* data, Py_ssize_t nbytes, Block* block,
                    PyObject* keep) {
  auto* memory = PyObject_New(MemoryObject, MemoryType);
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
  MemoryType = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
  return MemoryType != nullptr;
}

}  // namespace hcb::python
