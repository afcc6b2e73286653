// Communication groups for data-parallel training: a group's gradient all-reduce starts when its backward ends
// (DESIGN.md "The recipe"), and all-reduces run one after another on the communication stream. A partition of
// the pieces (layout/pi05.h group_pieces, in backward order) into contiguous groups finishes communicating at
//   F_g = max(F_{g-1}, end of g's backward) + latency + 2 (n-1)/n x bytes_g / bus bandwidth      (ring all-reduce)
// and exposes max(0, F_last - end of backward) per step. solve_groups minimizes that exactly by dynamic
// programming over the split points (O(pieces^2)): F is monotone in the previous group's finish, so the best
// prefix partition is part of a best partition. Ties go to fewer groups.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlatune::tuner {

struct CommPiece {
  std::string name;                // "layer.17", "vision.layer.3", ...
  std::string unit;                // its named unit ("vision", "layer.17", ...)
  std::vector<std::string> roots;  // module FQNs
  double backward_ms = 0;          // its backward (recomputation included), per step
  double grad_bytes = 0;           // gradient bytes all-reduced
};

struct CommOptions {
  int world_size = 2;
  double bus_gbps = 0;       // all-reduce bus bandwidth, GB/s (1e9 bytes/s)
  double latency_ms = 0.02;  // fixed cost of one all-reduce
};

struct GroupRange {
  int begin = 0, end = 0;  // pieces [begin, end)
};

struct GroupPlan {
  std::vector<GroupRange> groups;
  double exposed_ms = 0;
  double comm_ms = 0;  // total all-reduce time
};

double allreduce_ms(double bytes, const CommOptions& options);

// Exposed communication of a given partition.
GroupPlan simulate_groups(const std::vector<CommPiece>& pieces, std::vector<GroupRange> groups,
                          const CommOptions& options);

// The named units of DESIGN.md: consecutive pieces of one unit form one group.
std::vector<GroupRange> default_groups(const std::vector<CommPiece>& pieces);

// The exact best partition (see above).
GroupPlan solve_groups(const std::vector<CommPiece>& pieces, const CommOptions& options);

// A group's recipe name: the unit's name when it is exactly one whole unit, the piece's when one piece, else
// "<first piece>..<last piece>".
std::string group_name(const std::vector<CommPiece>& pieces, const GroupRange& range);

}  // namespace vlatune::tuner
