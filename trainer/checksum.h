// XXH64 (Yann Collet's xxHash, 64-bit, seed 0): the per-shard checksum of packed datasets. Chosen over zlib's
// crc32 because it runs at memory speed (four independent 64-bit lanes), so verifying every shard on open costs
// about as much as reading the files once, and because it needs no extra library on the GPU machine.
// Streaming, so the writer hashes records as it writes them and never reads a shard back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vlatune::trainer {

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t bytes);
  uint64_t digest() const;  // does not change the state: more updates may follow

 private:
  uint64_t acc_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buf_[32];
  size_t buffered_ = 0;
};

// One-shot hash of a buffer.
uint64_t xxh64(const void* data, size_t bytes, uint64_t seed = 0);

// "xxh64:" + 16 lower-case hex digits: the form stored in manifest.json.
std::string format_checksum(uint64_t hash);

}  // namespace vlatune::trainer
