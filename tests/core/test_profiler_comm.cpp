// profile.json's communication section from kernel records (profiler/comm_stats.h), on synthetic records: per-group
// all-reduce time keyed by the "<comm>:group" scopes, bus bandwidth, exposed communication per step (median), and
// the attribution tables folding the per-group scopes into the one pseudo-module "<comm>".
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "profiler/attribution.h"
#include "profiler/comm_stats.h"

using namespace vlatune::profiler;

namespace {

constexpr uint64_t kMs = 1000000;  // ns

struct Builder {
  TraceData trace;
  uint64_t next_id = 1;
  uint32_t next_correlation = 1;

  int32_t name(const std::string& n) {
    for (size_t i = 0; i < trace.names.size(); ++i)
      if (trace.names[i] == n) return static_cast<int32_t>(i);
    trace.names.push_back(n);
    return static_cast<int32_t>(trace.names.size() - 1);
  }
  uint64_t scope(const std::string& n, Phase phase, int64_t step, uint64_t parent = 0) {
    ScopeRecord s;
    s.id = next_id++;
    s.parent = parent;
    s.fqn = name(n);
    s.phase = phase;
    s.step = step;
    trace.scopes.push_back(s);
    return s.id;
  }
  // A kernel from start to end (ms from the step's origin) launched inside scope instance `id` (0: none), through
  // a CUPTI correlation as on the GPU.
  void kernel(const std::string& n, uint64_t id, int64_t step, double start_ms, double end_ms) {
    ActivityRecord a;
    a.name = n;
    const uint64_t origin = static_cast<uint64_t>(step) * 1000 * kMs;
    a.start_ns = origin + static_cast<uint64_t>(start_ms * kMs);
    a.end_ns = origin + static_cast<uint64_t>(end_ms * kMs);
    a.correlation_id = next_correlation++;
    if (id != 0) trace.correlations.push_back({a.correlation_id, id});
    trace.activities.push_back(a);
  }

  // One data-parallel step: forward, backward until `backward_end`, group heads.out's all-reduce from 16 ms for
  // `heads_ms`, group layer.0's from `layer_start` for `layer_ms`, then the unpack and the optimizer.
  void step(int64_t step, double backward_end, double heads_ms, double layer_start, double layer_ms) {
    const uint64_t fwd = scope("layer.0", Phase::kForward, step);
    kernel("nvjet_tst_128x256_gemm", fwd, step, 0, 10);
    const uint64_t bwd = scope("layer.0", Phase::kBackward, step);
    kernel("nvjet_tst_128x256_gemm", bwd, step, 10, backward_end);
    const uint64_t heads = scope("<comm>:heads.out", Phase::kBackward, step);
    kernel("vectorized_elementwise_kernel", heads, step, 15, 16);  // packing: not NCCL, not compute
    kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", heads, step, 16, 16 + heads_ms);
    const uint64_t layer = scope("<comm>:layer.0", Phase::kBackward, step);
    kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", layer, step, layer_start, layer_start + layer_ms);
    const uint64_t opt = scope("<optimizer>", Phase::kOptimizer, step);
    const uint64_t unpack = scope("<comm>", Phase::kOther, step, opt);
    kernel("vectorized_elementwise_kernel", unpack, step, 60, 61);
    kernel("vlatune_adamw", opt, step, 61, 70);
  }
};

}  // namespace

TEST_CASE("Communication section: per-group all-reduce time, bus bandwidth and exposed time per step",
          "[profiler][distributed]") {
  Builder b;
  b.step(5, 30, 4, 28, 6);                                            // layer.0 ends at 34: 4 ms exposed
  b.step(6, 30, 2, 21, 8);                                            // ends at 29: hidden under backward (0)
  b.step(7, 30, 6, 36, 4);                                            // ends at 40: 10 ms exposed
  b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 7, 80, 81);  // outside any scope: counted, not used
  const std::vector<CommGroupInfo> groups = {{"heads.out", 1000000000}, {"layer.0", 2000000000}, {"vision", 5}};

  const CommStats s = communication_from_trace(b.trace, groups, 2);
  CHECK(s.steps == 3);
  CHECK(s.unattributed_nccl == 1);
  REQUIRE(s.exposed_ms_per_step.size() == 3);
  CHECK(s.exposed_ms_per_step[0] == Approx(4));
  CHECK(s.exposed_ms_per_step[1] == Approx(0));
  CHECK(s.exposed_ms_per_step[2] == Approx(10));
  const auto& c = s.communication;
  CHECK(c.world_size == 2);
  CHECK(c.exposed_ms == Approx(4));  // median of 4, 0, 10
  REQUIRE(c.groups.size() == 3);
  CHECK(c.groups[0].name == "heads.out");
  CHECK(c.groups[0].bytes == 1000000000);
  CHECK(c.groups[0].allreduce_ms == Approx(4));  // median of 4, 2, 6
  CHECK(c.groups[1].allreduce_ms == Approx(6));  // median of 6, 8, 4
  CHECK(c.groups[2].allreduce_ms == 0);          // no kernel: 0
  // 3e9 + 5 bytes x 2 (n-1)/n over 10 ms: ~300 GB/s.
  CHECK(c.allreduce_gbps == Approx(3000000005.0 / (10.0 * 1e6)));

  SECTION("four ranks: the ring factor 2 (n-1)/n = 1.5") {
    const CommStats four = communication_from_trace(b.trace, groups, 4);
    CHECK(four.communication.allreduce_gbps == Approx(3000000005.0 * 1.5 / (10.0 * 1e6)));
  }
  SECTION("no NCCL kernel: no steps, bandwidth 0") {
    Builder none;
    const uint64_t bwd = none.scope("layer.0", Phase::kBackward, 0);
    none.kernel("nvjet_gemm", bwd, 0, 0, 5);
    const CommStats empty = communication_from_trace(none.trace, groups, 2);
    CHECK(empty.steps == 0);
    CHECK(empty.communication.allreduce_gbps == 0);
    CHECK(empty.communication.exposed_ms == 0);
  }
}

TEST_CASE("Attribution counts every per-group \"<comm>:group\" scope as the one pseudo-module <comm>",
          "[profiler][distributed]") {
  CHECK(comm_scope_name("layer.3") == "<comm>:layer.3");
  CHECK(attribution_module_name("<comm>:layer.3") == "<comm>");
  CHECK(attribution_module_name("<comm>") == "<comm>");
  CHECK(attribution_module_name("<optimizer>") == "<optimizer>");

  Builder b;
  b.step(0, 30, 4, 28, 6);
  const AttributionResult a = attribute(b.trace, 1, {});
  std::vector<std::string> rows;
  for (const auto& m : a.modules) rows.push_back(m.fqn);
  CHECK(rows == std::vector<std::string>{"layer.0", "<comm>", "<optimizer>"});
  const auto& comm = a.modules[1];
  CHECK(comm.kind == "pseudo");
  // Packing 1 + heads.out 4 + layer.0 6 (backward), unpack 1 (nested in <optimizer>: forward column).
  CHECK(comm.self_ms == Approx(12));
  CHECK(comm.backward_ms == Approx(11));
  CHECK(comm.forward_ms == Approx(1));
  CHECK(a.modules[2].forward_ms == Approx(10));  // <optimizer> includes the unpack nested in it
  CHECK(a.attribution.attributed_fraction == Approx(1.0));
}
