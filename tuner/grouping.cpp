#include "tuner/grouping.h"

#include <algorithm>
#include <limits>

namespace vlatune::tuner {

double allreduce_ms(double bytes, const CommOptions& o) {
  if (o.world_size <= 1 || bytes <= 0) return 0;
  const double n = o.world_size;
  return o.latency_ms + 2.0 * (n - 1.0) / n * bytes / (o.bus_gbps * 1e9) * 1e3;
}

GroupPlan simulate_groups(const std::vector<CommPiece>& pieces, std::vector<GroupRange> groups, const CommOptions& o) {
  std::vector<double> end(pieces.size() + 1, 0.0);
  for (size_t i = 0; i < pieces.size(); ++i) end[i + 1] = end[i] + pieces[i].backward_ms;
  GroupPlan plan;
  double finish = 0;
  for (const GroupRange& g : groups) {
    double bytes = 0;
    for (int i = g.begin; i < g.end; ++i) bytes += pieces[static_cast<size_t>(i)].grad_bytes;
    const double c = allreduce_ms(bytes, o);
    plan.comm_ms += c;
    finish = std::max(finish, end[static_cast<size_t>(g.end)]) + c;
  }
  plan.exposed_ms = std::max(0.0, finish - end.back());
  plan.groups = std::move(groups);
  return plan;
}

std::vector<GroupRange> default_groups(const std::vector<CommPiece>& pieces) {
  std::vector<GroupRange> out;
  for (int i = 0; i < static_cast<int>(pieces.size()); ++i) {
    if (!out.empty() && pieces[static_cast<size_t>(i)].unit == pieces[static_cast<size_t>(out.back().begin)].unit)
      out.back().end = i + 1;
    else
      out.push_back({i, i + 1});
  }
  return out;
}

GroupPlan solve_groups(const std::vector<CommPiece>& pieces, const CommOptions& o) {
  const size_t n = pieces.size();
  std::vector<double> end(n + 1, 0.0), bytes(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) {
    end[i + 1] = end[i] + pieces[i].backward_ms;
    bytes[i + 1] = bytes[i] + pieces[i].grad_bytes;
  }
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> finish(n + 1, inf);
  std::vector<int> count(n + 1, 0), from(n + 1, -1);
  finish[0] = 0;
  for (size_t j = 1; j <= n; ++j) {
    for (size_t i = 0; i < j; ++i) {
      const double f = std::max(finish[i], end[j]) + allreduce_ms(bytes[j] - bytes[i], o);
      const bool better = f < finish[j] - 1e-9 || (f <= finish[j] + 1e-9 && count[i] + 1 < count[j]);
      if (better) {
        finish[j] = f;
        count[j] = count[i] + 1;
        from[j] = static_cast<int>(i);
      }
    }
  }
  std::vector<GroupRange> groups;
  for (int j = static_cast<int>(n); j > 0; j = from[static_cast<size_t>(j)])
    groups.push_back({from[static_cast<size_t>(j)], j});
  std::reverse(groups.begin(), groups.end());
  return simulate_groups(pieces, std::move(groups), o);
}

std::string group_name(const std::vector<CommPiece>& pieces, const GroupRange& r) {
  const CommPiece& first = pieces[static_cast<size_t>(r.begin)];
  const CommPiece& last = pieces[static_cast<size_t>(r.end - 1)];
  if (r.end - r.begin == 1 && first.unit != first.name) {
    // One piece of a split unit; the unit's name when the unit has no other piece.
    const bool alone =
        std::count_if(pieces.begin(), pieces.end(), [&](const CommPiece& p) { return p.unit == first.unit; }) == 1;
    return alone ? first.unit : first.name;
  }
  if (r.end - r.begin == 1) return first.name;
  const bool whole_unit = first.unit == last.unit &&
                          std::count_if(pieces.begin(), pieces.end(),
                                        [&](const CommPiece& p) { return p.unit == first.unit; }) == r.end - r.begin;
  return whole_unit ? first.unit : first.name + ".." + last.name;
}

}  // namespace vlatune::tuner
