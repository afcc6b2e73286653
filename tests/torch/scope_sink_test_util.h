// A profiler ScopeSink that records every scope push with its phase: what the recompute and exactness tests observe
// (which module ran, and whether as forward, backward or recompute).
#pragma once

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "profiler/scope.h"

namespace vlatune::test {

struct RecordingScopeSink : vlatune::profiler::ScopeSink {
  std::mutex mu;
  std::vector<std::pair<std::string, vlatune::profiler::Phase>> pushes;
  void push(const std::string& fqn, vlatune::profiler::Phase phase) override {
    std::lock_guard<std::mutex> lock(mu);
    pushes.emplace_back(fqn, phase);
  }
  void pop() override {}
  long count(const std::string& fqn, vlatune::profiler::Phase phase) {
    std::lock_guard<std::mutex> lock(mu);
    return std::count_if(pushes.begin(), pushes.end(),
                         [&](const auto& p) { return p.first == fqn && p.second == phase; });
  }
};

}  // namespace vlatune::test
