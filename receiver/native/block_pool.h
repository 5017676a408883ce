// The pool of blocks: the memory of large packets (and of a large direct
// request's arguments), mapped once and reused, so that a device writes into
// pages it has touched before (no page faults).
//
// A block belongs to one owner at a time: the device writing it, its queue
// while the packet waits, then the consumer, whose host function's arrays
// view it (a Memory, python_memory.h) until the last view is gone and the block
// goes back to its pool (BlockPool::Return). The pool keeps free blocks up
// to the queue bound plus kPoolSlack bytes and unmaps the rest.
//
// Where a pool's memory comes from is its BlockAllocator: MappedAllocator
// (pages mapped with mmap, transparent huge pages) for the CPU; another kind
// of memory (pinned host memory for a GPU) is another allocator and another
// pool, and the queue that uses it does not change. The allocator is called
// only when a block is mapped or unmapped, never per packet.
//
// Any thread calls a pool. `mu_` guards the free list and the counts; no
// other lock is taken under it, and the allocator runs outside it.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_BLOCK_POOL_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_BLOCK_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>

namespace hcb {

class BlockPool;

// The memory of one large packet.
struct Block {
  uint8_t* data;
  int64_t capacity;
  BlockPool* pool;  // where it goes back to
};

// Maps and unmaps the memory of blocks.
class BlockAllocator {
 public:
  virtual ~BlockAllocator() = default;
  // `capacity` bytes of new memory; throws std::bad_alloc without.
  virtual uint8_t* Map(int64_t capacity) = 0;
  virtual void Unmap(uint8_t* data, int64_t capacity) noexcept = 0;
};

// Anonymous pages (mmap); a block of at least a huge page starts at a huge
// page boundary, with transparent huge pages asked for: a fault then maps
// 2 MiB instead of 4 KiB.
class MappedAllocator final : public BlockAllocator {
 public:
  uint8_t* Map(int64_t capacity) override;
  void Unmap(uint8_t* data, int64_t capacity) noexcept override;
};

// The CPU's blocks are allocated in multiples of this; see MappedAllocator
// for huge pages.
constexpr int64_t kBlockGrain = 64 << 10;

class BlockPool {
 public:
  // `queue_bound`: the bytes that the queues may hold (see SetQueueBound);
  // blocks are allocated in multiples of `grain` bytes.
  BlockPool(BlockAllocator* allocator, int64_t queue_bound,
            int64_t grain = kBlockGrain)
      : allocator_(allocator), grain_(grain), queue_bound_(queue_bound) {}

  // A block of at least `bytes`: the smallest free one that fits and wastes
  // at most half of itself, or a new one. Throws std::bad_alloc when the
  // system has no memory for it.
  Block* Acquire(int64_t bytes);
  // Takes a block back once nothing views it: kept for reuse while the free
  // blocks are at most the queue bound plus kPoolSlack bytes, else unmapped
  // (the oldest free blocks first).
  void Return(Block* block) noexcept;
  // A receiver attached with this queue bound.
  void SetQueueBound(int64_t queue_bound) {
    queue_bound_.store(queue_bound, std::memory_order_release);
  }
  // Writes the free bytes, free blocks, blocks out of the pool (in queues
  // or lent) and bytes mapped in all.
  void Stats(int64_t* out);

 private:
  void Unmap(Block* block) noexcept;

  BlockAllocator* const allocator_;
  const int64_t grain_;
  std::atomic<int64_t> queue_bound_;
  std::mutex mu_;
  std::deque<Block*> free_blocks_;  // oldest first
  int64_t free_bytes_ = 0;
  int64_t blocks_out_ = 0;
  int64_t mapped_bytes_ = 0;
};

// Gives `block` back to the pool it came from.
inline void ReturnBlock(Block* block) noexcept { block->pool->Return(block); }

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_BLOCK_POOL_H_
