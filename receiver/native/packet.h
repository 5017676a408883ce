// The packet layout that device threads write and the Python decoder reads
// (receiver/native_wire.py reads its sizes from the module), and the index
// that Take writes for the decoder. Header only: plain data and functions,
// no state, no locks.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PACKET_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PACKET_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hcb {

// Every packet starts with this header; array data follows, each array
// starting at a multiple of kAlign from the packet start.
struct PacketHeader {
  int64_t size;        // bytes of the whole packet, a multiple of kAlign
  int64_t site;        // which callback site (Python knows its layout)
  int64_t request_id;  // 0 for a tap, the reply slot's id for a call
  int64_t unused[5];
};
constexpr int64_t kAlign = 16;
constexpr int64_t kHeaderBytes = sizeof(PacketHeader);
static_assert(kHeaderBytes % kAlign == 0, "header must keep data aligned");

// One entry per packet written by DeviceQueue::Take for the Python decoder.
struct IndexEntry {
  int64_t offset;      // of the packet in the destination buffer
  int64_t site;
  int64_t request_id;
  int64_t size;
  // A large packet is not copied into the destination: `block` is its Block
  // (lent to the consumer, see BlockPool::Return) and `address` its first
  // byte. Both 0 for a packet in the destination buffer.
  int64_t block;
  int64_t address;
};

// Packets of at least this many bytes are large: each is written into a
// Block of its own, which the host function's arrays then view, instead of
// being copied a second time into the receiver's batch buffer. Smaller ones
// are written back to back into chunks and copied in batches.
constexpr int64_t kLargePacket = 256 << 10;

inline int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A byte span to copy from (a device buffer) or into (a device result).
struct Span {
  void* data;
  int64_t bytes;
};

// The size of a packet that carries `arrays`.
inline int64_t PacketSize(const Span* arrays, size_t num_arrays) {
  int64_t size = kHeaderBytes;
  for (size_t i = 0; i < num_arrays; ++i) size += AlignUp(arrays[i].bytes);
  return size;
}

inline PacketHeader ReadHeader(const uint8_t* at) {
  PacketHeader header;
  std::memcpy(&header, at, sizeof(header));
  return header;
}

// Writes a packet (header, then each array at its aligned offset) at `at`.
inline void WritePacket(uint8_t* at, int64_t size, int64_t site,
                        int64_t request_id, const Span* arrays,
                        size_t num_arrays) {
  const PacketHeader header{size, site, request_id, {}};
  std::memcpy(at, &header, sizeof(header));
  int64_t offset = kHeaderBytes;
  for (size_t i = 0; i < num_arrays; ++i) {
    if (arrays[i].bytes > 0) {
      std::memcpy(at + offset, arrays[i].data, arrays[i].bytes);
    }
    offset += AlignUp(arrays[i].bytes);
  }
}

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PACKET_H_
