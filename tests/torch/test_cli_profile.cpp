// `vlatune profile` end to end on the tiny model with the CPU tracer (profile.json reads back; the trace holds
// scopes and ops). The torch-free pieces are tested in tests/core/test_profiler_records.cpp.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "temp_dir.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "formats/fqn_pattern.h"
#include "formats/profile.h"
#include "kernels/fp8_ops.h"
#include "profiler/attribution.h"
#include "profiler/cupti_api.h"
#include "profiler/gemm_timing.h"
#include "profiler/session.h"
#include "profiler/tracer.h"

using namespace vlatune::profiler;

namespace {}  // namespace

TEST_CASE("vlatune profile on the tiny model writes a readable profile and a trace", "[profiler][cli]") {
  // One intra-op thread, restored after: the op-count baseline ([baseline]) is taken at the default, whichever
  // cases ran before it.
  struct Threads {
    int before = at::get_num_threads();
    Threads() { torch::set_num_threads(1); }
    ~Threads() { torch::set_num_threads(before); }
  } one_thread;
  const std::string dir = vlatune::test::make_temp_dir("profile");
  std::vector<std::string> args = {"vlatune",
                                   "profile",
                                   "--config",
                                   "tiny",
                                   "--device",
                                   "cpu",
                                   "--data",
                                   "synthetic",
                                   "--batch",
                                   "2",
                                   "--warmup",
                                   "0",
                                   "--timed-steps",
                                   "1",
                                   "--steps",
                                   "1",
                                   "--ab-steps",
                                   "1",
                                   "--recompute-candidate",
                                   "paligemma_with_expert.paligemma.model.language_model.layers.*.mlp",
                                   "--out",
                                   dir};
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  REQUIRE(vlatune::cli::run(static_cast<int>(argv.size()), argv.data(), out, err) == 0);
  const auto p = vlatune::formats::read_profile(dir + "/profile.json");
  CHECK(p.settings.tracer == "cpu");
  REQUIRE(p.batches.size() == 2);
  CHECK(p.batches[1].batch == 1);
  const auto& b = p.batches[0];
  // Every ATen op of the step runs inside some scope: backward ones through their forward's sequence number,
  // the engine's work after a node through the node's trailing id; only stray host-side ops stay outside. Counted
  // by calls (about 10 of 2,900): their share of the time moves with the machine's load (0.5% here, once 1.1%).
  double calls = 0, stray_calls = 0;
  for (const auto& k : b.kernels) calls += k.calls;
  for (const auto& u : b.attribution.unattributed) stray_calls += u.calls;
  CHECK(stray_calls <= 0.01 * calls);
  CHECK(b.attribution.attributed_fraction > 0.95);
  bool mlp_backward = false, optimizer = false, loss = false;
  for (const auto& m : b.modules) {
    if (m.fqn == "paligemma_with_expert.paligemma.model.language_model.layers.0.mlp") mlp_backward = m.backward_ms > 0;
    optimizer = optimizer || (m.fqn == "<optimizer>" && m.self_ms > 0);
    loss = loss || (m.fqn == "<loss>" && m.backward_ms > 0);
  }
  CHECK(mlp_backward);
  CHECK(optimizer);
  CHECK(loss);
  // Each kernel (here: an ATen op) lists where it ran: module rows and phases, largest first, within the kernel's
  // own time; GEMMs run in forward and in backward.
  REQUIRE_FALSE(b.kernels.empty());
  CHECK_FALSE(b.kernels.front().sites.empty());
  bool gemm_forward = false, gemm_backward = false;
  for (const auto& k : b.kernels) {
    INFO(k.name);
    CHECK(k.sites.size() <= vlatune::formats::kMaxKernelSites);
    double site_ms = 0;
    for (size_t i = 0; i < k.sites.size(); ++i) {
      site_ms += k.sites[i].ms;
      if (i > 0) CHECK(k.sites[i].ms <= k.sites[i - 1].ms);
      // A module, its layer indices folded: the site names every layer of a stack at once.
      CHECK(k.sites[i].module.find(".0.") == std::string::npos);
      CHECK(std::any_of(b.modules.begin(), b.modules.end(),
                        [&](const auto& m) { return vlatune::formats::fqn_matches(k.sites[i].module, m.fqn); }));
      if (k.category == "gemm") {
        gemm_forward = gemm_forward || k.sites[i].phase == "forward";
        gemm_backward = gemm_backward || k.sites[i].phase == "backward";
      }
    }
    CHECK(site_ms <= k.ms * (1 + 1e-9) + 1e-12);
  }
  CHECK(gemm_forward);
  CHECK(gemm_backward);
  CHECK(b.recompute.size() == 7);                  // six classes and the user's pattern
  CHECK(b.recompute.back().patterns.size() == 1);  // the last layer's prefix MLP is dead work (skip_dead)
  CHECK_FALSE(p.gemms.empty());
  CHECK(p.recomputable.size() > 0);
  // The backbone MLP's merged gate+up output is a unit of its own (named by its GEMM) with an A/B class.
  const std::string gate_up = "paligemma_with_expert.paligemma.model.language_model.layers.0.mlp.gate_proj+up_proj";
  CHECK(std::count(p.recomputable.begin(), p.recomputable.end(), gate_up) == 1);
  CHECK(std::any_of(b.recompute.begin(), b.recompute.end(), [&](const auto& c) {
    return c.name == "backbone_mlp_gate_up" && c.patterns == std::vector<std::string>{gate_up};
  }));

  // The trace: scopes and ops on one timeline, ops tagged with their module.
  std::string text;
  FILE* pipe = ::popen(("gzip -dc " + dir + "/trace.json.gz 2>/dev/null || cat " + dir + "/trace.json").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  ::pclose(pipe);
  const auto trace = nlohmann::json::parse(text);
  size_t scopes = 0, tagged_ops = 0, steps = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const std::string name = e.at("name");
    if (e.at("cat") == "user_annotation") ++(name.rfind("ProfilerStep#", 0) == 0 ? steps : scopes);
    if (e.at("cat") == "cpu_op" && e.at("args").contains("module")) ++tagged_ops;
  }
  CHECK(steps == 1);  // --trace-steps 1 (the default)
  CHECK(scopes > 50);
  CHECK(tagged_ops > 50);
  CHECK(trace.at("schemaVersion") == 1);

  // A pattern that names nothing recomputable is bad input, naming the flag.
  std::vector<std::string> bad = {
      "vlatune", "profile", "--config", "tiny", "--device", "cpu", "--data", "synthetic", "--recompute-candidate",
      "nope.*",  "--out",   dir};
  argv.clear();
  for (const auto& a : bad) argv.push_back(a.c_str());
  std::ostringstream out2, err2;
  CHECK(vlatune::cli::run(static_cast<int>(argv.size()), argv.data(), out2, err2) == 4);
  CHECK_THAT(err2.str(), Catch::Contains("--recompute-candidate"));
}

TEST_CASE("The profile's GEMM table times the FP8 GEMMs as the FP8 Linear runs them", "[.gpu][fp8]") {
  REQUIRE(torch::cuda::is_available());
  // A shape no other test runs, so its three FP8 problems are new to the process's timed-algorithm records.
  const int64_t m = 1136, k = 720, n = 1504;
  const size_t before = vlatune::kernels::fp8_timed_gemms().size();
  const GemmTiming t = time_gemm(m, k, n, 2);
  REQUIRE(t.fp8);
  CHECK(t.bf16.forward_ms > 0);
  CHECK(t.fp8->forward_ms > 0);
  CHECK(t.fp8->grad_input_ms > 0);
  CHECK(t.fp8->grad_weight_ms > 0);
  REQUIRE(t.quant_ms);
  CHECK(*t.quant_ms > 0);
  // Forward (e4m3 x e4m3, fast accumulation), input gradient (e5m2 gradient, W^T), weight gradient (dy^T x): each
  // on a timed algorithm, and only the forward with fast accumulation, as model/float8_linear.cpp calls them.
  const std::vector<vlatune::kernels::Fp8TimedGemm> timed = vlatune::kernels::fp8_timed_gemms();
  REQUIRE(timed.size() == before + 3);
  const auto has = [](const std::string& problem, const char* word) { return problem.find(word) != std::string::npos; };
  for (size_t i = before; i < timed.size(); ++i) {
    INFO(timed[i].problem);
    CHECK(timed[i].chosen >= 0);
    CHECK(timed[i].calls >= 3);  // the warm-up (which timed the candidates) and two repetitions
    CHECK(has(timed[i].problem, "fast-accum") == (i == before));
    CHECK(has(timed[i].problem, "e5m2") == (i != before));
    CHECK(has(timed[i].problem, "-> bf16"));
  }
}
