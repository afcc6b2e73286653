// Where each rank's part of the optimizer state lies when it is sharded over the data-parallel ranks (ZeRO-1,
// recipe distributed.shard_optimizer_state; trainer/grad_buckets.h reduces and gathers along it, trainer/optimizer.h
// keeps state only for it).
//
// One layout per gradient group: the group's parameters, flattened, one after another in the group's order, each
// starting at a multiple of kShardAlign elements; the whole padded to a multiple of world size x kShardAlign and cut
// into world-size equal shards, rank r holding [r S, (r + 1) S). A shard therefore starts and ends on a multiple of
// kShardAlign within every parameter it touches, so the 256-value blocks of 8-bit AdamW state (kernels/adamw.h
// kAdamwQuantBlock, counted from each parameter's first element) never straddle two ranks, and the shards are
// equal, as reduce-scatter and all-gather need. Each rank holds at most one contiguous range of each parameter.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace vlatune::trainer {

inline constexpr int64_t kShardAlign = 256;  // = kernels::kAdamwQuantBlock (this header stays torch- and CUDA-free)

// The part of one flattened parameter a rank updates: elements [start, start + length); length 0 = none.
struct ParamRange {
  int64_t start = 0;
  int64_t length = 0;
};

struct ShardLayout {
  std::vector<int64_t> offset;  // per parameter of the group: its first element in the padded layout
  int64_t padded_numel = 0;     // world_size x shard_numel
  int64_t shard_numel = 0;      // a multiple of kShardAlign
};

inline int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// `numels`: the group's parameters in its order.
inline ShardLayout shard_layout(const std::vector<int64_t>& numels, int world_size) {
  if (world_size < 1) throw std::invalid_argument("shard layout: world size " + std::to_string(world_size));
  ShardLayout layout;
  int64_t end = 0;
  for (int64_t n : numels) {
    layout.offset.push_back(end);
    end = round_up(end + n, kShardAlign);
  }
  layout.padded_numel = round_up(std::max<int64_t>(end, 1), kShardAlign * world_size);
  layout.shard_numel = layout.padded_numel / world_size;
  return layout;
}

// The range of parameter `i` (of `numel` elements) that `rank`'s shard holds.
inline ParamRange shard_range(const ShardLayout& layout, size_t i, int64_t numel, int rank) {
  const int64_t lo = std::max(layout.offset[i], rank * layout.shard_numel);
  const int64_t hi = std::min(layout.offset[i] + numel, (rank + 1) * layout.shard_numel);
  if (hi <= lo) return {};
  return {lo - layout.offset[i], hi - lo};
}

}  // namespace vlatune::trainer
