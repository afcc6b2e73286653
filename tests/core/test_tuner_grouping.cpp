// Communication groups: the DP partition is the brute-force best over every split of the pieces, the named units
// are the default, and names say what a group holds.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "layout/pi05.h"
#include "tuner/grouping.h"

using namespace vlatune::tuner;
using vlatune::layout::group_pieces;
using vlatune::layout::GroupPiece;

namespace {

std::vector<CommPiece> random_pieces(std::mt19937& rng, int n) {
  std::uniform_real_distribution<double> ms(0.1, 5.0), bytes(1e6, 4e8);
  std::vector<CommPiece> out;
  for (int i = 0; i < n; ++i) {
    const std::string name = "p" + std::to_string(i);
    out.push_back({name, i % 3 == 2 ? "u" + std::to_string(i - 1) : name, {name}, ms(rng), bytes(rng)});
  }
  return out;
}

}  // namespace

TEST_CASE("the group partition DP matches brute force over every split", "[tuner][groups]") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 9;
    const auto pieces = random_pieces(rng, n);
    CommOptions o;
    o.world_size = 2 + trial % 7;
    o.bus_gbps = 5 + trial % 50;
    double best = 1e300;
    for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
      std::vector<GroupRange> groups;
      int begin = 0;
      for (int i = 1; i <= n; ++i) {
        if (i == n || (cuts & (1u << (i - 1)))) {
          groups.push_back({begin, i});
          begin = i;
        }
      }
      best = std::min(best, simulate_groups(pieces, groups, o).exposed_ms);
    }
    const GroupPlan got = solve_groups(pieces, o);
    INFO("trial " << trial);
    CHECK(got.exposed_ms == Approx(best).margin(1e-9));
    // The groups cover the pieces in order, without gaps.
    int next = 0;
    for (const auto& g : got.groups) {
      CHECK(g.begin == next);
      CHECK(g.end > g.begin);
      next = g.end;
    }
    CHECK(next == n);
  }
}

TEST_CASE("all-reduce time follows the ring formula and one GPU communicates nothing", "[tuner][groups]") {
  CommOptions o;
  o.world_size = 4;
  o.bus_gbps = 100;
  o.latency_ms = 0;
  CHECK(allreduce_ms(1e9, o) == Approx(2.0 * 3 / 4 * 10.0));  // 1 GB at 100 GB/s = 10 ms of bus time, x 2(n-1)/n
  o.world_size = 1;
  CHECK(allreduce_ms(1e9, o) == 0);
}

TEST_CASE("default groups follow the named units and names describe the group", "[tuner][groups]") {
  const std::vector<std::string> fqns = {
      "paligemma_with_expert.paligemma.model.language_model.layers.0",
      "paligemma_with_expert.paligemma.model.language_model.layers.1",
      "paligemma_with_expert.gemma_expert.model.layers.0",
      "paligemma_with_expert.gemma_expert.model.layers.1",
      "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0",
      "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.1",
      "paligemma_with_expert.paligemma.model.multi_modal_projector",
      "action_out_proj",
      "action_in_proj",
  };
  const std::vector<GroupPiece> gp = group_pieces(fqns);
  std::vector<std::string> names;
  for (const auto& p : gp) names.push_back(p.name);
  // Backward order: output head, layers from the last, input heads, then the vision tower from its end.
  CHECK(names == std::vector<std::string>{"heads.out", "layer.1", "layer.0", "heads.in", "vision.head",
                                          "vision.layer.1", "vision.layer.0"});
  std::vector<CommPiece> pieces;
  for (const auto& p : gp) pieces.push_back({p.name, p.unit, p.roots, 1.0, 1e6});
  const auto groups = default_groups(pieces);
  REQUIRE(groups.size() == 5);
  CHECK(group_name(pieces, groups.back()) == "vision");
  CHECK(group_name(pieces, {1, 3}) == "layer.1..layer.0");
  CHECK(group_name(pieces, {5, 6}) == "vision.layer.1");
}
