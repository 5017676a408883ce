// DLPack capsules over lent memory: see python_dlpack.h.

#include "python_dlpack.h"

#include <new>
#include <type_traits>

#include "python_gil.h"

namespace hcb::python {
namespace {

// dlpack.h's structs, as its ABI has them.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kReadOnlyFlag = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY

constexpr char kName[] = "dltensor";
constexpr char kVersionedName[] = "dltensor_versioned";

// What a capsule's tensor owns: its shape, and a reference to the owner.
struct Context {
  PyObject* owner;
  std::vector<int64_t> shape;
};

template <typename Managed>
void Delete(Managed* managed) {
  if (managed == nullptr) return;
  auto* context = static_cast<Context*>(managed->manager_ctx);
  {
    GilHeld gil;
    Py_DECREF(context->owner);
  }
  delete context;
  delete managed;
}

template <typename Managed>
constexpr const char* NameOf() {
  return std::is_same_v<Managed, DLManagedTensor> ? kName : kVersionedName;
}

// A capsule never consumed deletes its tensor; a consumed one was renamed
// ("used_...") and its consumer calls the deleter.
template <typename Managed>
void DestroyCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, NameOf<Managed>())) return;
  auto* managed = static_cast<Managed*>(
      PyCapsule_GetPointer(capsule, NameOf<Managed>()));
  if (managed != nullptr) managed->deleter(managed);
}

DLTensor Tensor(const DlpackView& view, Context* context) {
  DLTensor tensor{};
  tensor.data = view.data;
  tensor.device = {view.device_type, view.device_id};
  tensor.ndim = static_cast<int32_t>(context->shape.size());
  tensor.dtype = {view.code, view.bits, 1};
  tensor.shape = context->shape.data();
  tensor.strides = nullptr;  // C-contiguous
  return tensor;
}

// The capsule of a `Managed` tensor that takes `context` (and its
// reference to the owner) in all cases.
template <typename Managed>
PyObject* NewCapsule(Context* context, const DlpackView& view) {
  auto* managed = new (std::nothrow) Managed{};
  if (managed == nullptr) {
    Py_DECREF(context->owner);
    delete context;
    return PyErr_NoMemory();
  }
  managed->manager_ctx = context;
  managed->deleter = Delete<Managed>;
  managed->dl_tensor = Tensor(view, context);
  if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) {
    managed->version = {1, 0};
    managed->flags = view.read_only ? kReadOnlyFlag : 0;
  }
  PyObject* capsule =
      PyCapsule_New(managed, NameOf<Managed>(), DestroyCapsule<Managed>);
  if (capsule == nullptr) managed->deleter(managed);
  return capsule;
}

}  // namespace

PyObject* DlpackCapsule(PyObject* owner, const DlpackView& view,
                        bool versioned) {
  auto* context = new (std::nothrow) Context{owner, view.shape};
  if (context == nullptr) return PyErr_NoMemory();
  Py_INCREF(owner);
  return versioned ? NewCapsule<DLManagedTensorVersioned>(context, view)
                   : NewCapsule<DLManagedTensor>(context, view);
}

}  // namespace hcb::python
