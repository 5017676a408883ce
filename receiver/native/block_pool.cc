// The pool of blocks and the CPU's allocator: see block_pool.h.

#include "block_pool.h"

#include <sys/mman.h>

#include <cstddef>
#include <new>

#include "portability.h"

namespace hcb {
namespace {

constexpr int64_t kHugePage = 2 << 20;
// The pool keeps free blocks up to the queue bound plus this many bytes.
constexpr int64_t kPoolSlack = 64 << 20;

int64_t RoundUp(int64_t n, int64_t grain) {
  return (n + grain - 1) / grain * grain;
}

}  // namespace

uint8_t* MappedAllocator::Map(int64_t capacity) {
  const bool huge = capacity >= kHugePage;
  const size_t mapped = static_cast<size_t>(capacity + (huge ? kHugePage : 0));
  void* at = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (at == MAP_FAILED) throw std::bad_alloc();
  uint8_t* data = static_cast<uint8_t*>(at);
  if (huge) {  // keep the huge-page-aligned part
    const uintptr_t address = reinterpret_cast<uintptr_t>(at);
    const size_t head = RoundUp(static_cast<int64_t>(address), kHugePage) -
                        static_cast<int64_t>(address);
    if (head > 0) munmap(at, head);
    const size_t tail = mapped - head - static_cast<size_t>(capacity);
    if (tail > 0) munmap(data + head + capacity, tail);
    data += head;
#if HCB_LINUX_CALLS && defined(MADV_HUGEPAGE)
    madvise(data, static_cast<size_t>(capacity), MADV_HUGEPAGE);
#endif
  }
  return data;
}

void MappedAllocator::Unmap(uint8_t* data, int64_t capacity) noexcept {
  munmap(data, static_cast<size_t>(capacity));
}

void BlockPool::Unmap(Block* block) noexcept {
  allocator_->Unmap(block->data, block->capacity);
  delete block;
}

Block* BlockPool::Acquire(int64_t bytes) {
  const int64_t capacity = RoundUp(bytes, grain_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = free_blocks_.end();
    for (auto it = free_blocks_.begin(); it != free_blocks_.end(); ++it) {
      const int64_t have = (*it)->capacity;
      if (have >= capacity && have <= 2 * capacity &&
          (best == free_blocks_.end() || have < (*best)->capacity)) {
        best = it;
      }
    }
    if (best != free_blocks_.end()) {
      Block* block = *best;
      free_blocks_.erase(best);
      free_bytes_ -= block->capacity;
      ++blocks_out_;
      return block;
    }
  }
  uint8_t* data = allocator_->Map(capacity);
  Block* block = new (std::nothrow) Block{data, capacity, this};
  if (block == nullptr) {
    allocator_->Unmap(data, capacity);
    throw std::bad_alloc();
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++blocks_out_;
  mapped_bytes_ += capacity;
  return block;
}

void BlockPool::Return(Block* block) noexcept {
  const int64_t limit =
      queue_bound_.load(std::memory_order_acquire) + kPoolSlack;
  std::unique_lock<std::mutex> lock(mu_);
  --blocks_out_;
  while (true) {
    Block* unmapped = nullptr;
    if (block->capacity > limit) {
      unmapped = block;
      block = nullptr;
    } else if (free_bytes_ + block->capacity <= limit) {
      try {
        free_blocks_.push_back(block);
        free_bytes_ += block->capacity;
        return;
      } catch (const std::bad_alloc&) {
        unmapped = block;  // reuse is optional
        block = nullptr;
      }
    } else {  // make room: the oldest free block goes first
      unmapped = free_blocks_.front();
      free_blocks_.pop_front();
      free_bytes_ -= unmapped->capacity;
    }
    mapped_bytes_ -= unmapped->capacity;
    lock.unlock();
    Unmap(unmapped);
    if (block == nullptr) return;
    lock.lock();
  }
}

void BlockPool::Stats(int64_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out[0] = free_bytes_;
  out[1] = static_cast<int64_t>(free_blocks_.size());
  out[2] = blocks_out_;
  out[3] = mapped_bytes_;
}

}  // namespace hcb
