// The CPU regression check of CI: one tiny-config training step, counted instead of timed (counts cannot flake).
// Every ATen op dispatched on the training thread is seen by a global RecordFunction callback; per step we keep
// the ops launched (total and by name), the GEMM FLOPs (2mkn of mm/addmm/bmm/baddbmm, from the input shapes)
// and the bytes those GEMMs read and write. One step = a 3-step run minus a 2-step run (set-up, data and the
// final checkpoint cancel out), compared exactly with reports/baselines/cpu/tiny_train_step_ops.json.
// An intended change (a fused kernel, a new op) updates the baseline:
//   VLATUNE_UPDATE_BASELINES=1 build/tests/vlatune_tests_torch "[baseline]"   and commit the file.
#include <ATen/record_function.h>
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "temp_dir.h"
#include "tiny_train_options.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "formats/json_io.h"
#include "trainer/train_loop.h"

namespace {

const std::string kBaseline = std::string(VLATUNE_SOURCE_DIR) + "/reports/baselines/cpu/tiny_train_step_ops.json";

struct Counts {
  std::map<std::string, int64_t> by_op;
  int64_t ops = 0;
  int64_t gemm_flops = 0;
  int64_t gemm_bytes = 0;
};

// RecordFunction takes plain function pointers: the counter is a global, armed for one thread at a time.
std::mutex g_mutex;
Counts g_counts;
std::atomic<bool> g_armed{false};
std::thread::id g_thread;

int64_t tensor_bytes(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

void count_gemm(const at::RecordFunction& fn, Counts& c) {
  // (a, b) operand positions: mm(a, b), bmm(a, b), addmm(self, a, b), baddbmm(self, a, b). The name first:
  // inputs() is only touched for GEMMs.
  const std::string name = fn.name();
  size_t ia = 0;
  if (name == "aten::addmm" || name == "aten::baddbmm") {
    ia = 1;
  } else if (name != "aten::mm" && name != "aten::bmm") {
    return;
  }
  const auto inputs = fn.inputs();
  auto tensor = [&](size_t i) -> const at::Tensor* {
    return i < inputs.size() && inputs[i].isTensor() ? &inputs[i].toTensor() : nullptr;
  };
  const at::Tensor *a = tensor(ia), *b = tensor(ia + 1);
  if (!a || !b || a->dim() < 2 || b->dim() < 2) return;
  const int64_t m = a->size(-2), k = a->size(-1), n = b->size(-1);
  const int64_t batch = a->dim() == 3 ? a->size(0) : 1;
  c.gemm_flops += 2 * batch * m * k * n;
  c.gemm_bytes += tensor_bytes(*a) + tensor_bytes(*b) + batch * m * n * static_cast<int64_t>(a->element_size());
}

std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
  if (!g_armed.load(std::memory_order_relaxed) || std::this_thread::get_id() != g_thread) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_counts.ops;
  ++g_counts.by_op[fn.name()];
  count_gemm(fn, g_counts);
  return nullptr;
}

// The baseline's run: only the final checkpoint (so the 2- and 3-step runs differ by exactly one step) and every
// step timed.
vlatune::trainer::TrainOptions tiny(const std::string& out, int64_t steps) {
  auto o = vlatune::test::tiny_train_options(out, steps);
  o.checkpoint_every = 0;
  o.timing_warmup = 0;
  return o;
}

Counts count_run(int64_t steps) {
  const vlatune::test::TempDir dir("opcount");
  const std::string out = dir / "run";
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_counts = Counts{};
    g_thread = std::this_thread::get_id();
  }
  std::ostringstream log;
  g_armed = true;
  vlatune::trainer::run_training(tiny(out, steps), log);
  g_armed = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_counts;
}

nlohmann::json to_json(const Counts& step) {
  nlohmann::json by_op = nlohmann::json::object();
  for (const auto& [name, n] : step.by_op) {
    if (n != 0) by_op[name] = n;
  }
  return {{"schema", "vlatune.op-counts/1"},
          {"what",
           "ATen ops dispatched on the training thread in one steady-state optimizer step of `vlatune train "
           "--config tiny --data synthetic --device cpu --batch 2 --seed 5` (step 3 of 3), with GEMM FLOPs and "
           "bytes; written by tests/torch/test_trainer_op_counts.cpp"},
          {"ops_per_step", step.ops},
          {"gemm_flops_per_step", step.gemm_flops},
          {"gemm_bytes_per_step", step.gemm_bytes},
          {"by_op", by_op}};
}

}  // namespace

TEST_CASE("One tiny CPU training step launches the ops, FLOPs and bytes of the checked-in baseline",
          "[train][baseline]") {
  // One run first, uncounted: what a process does once (lazily built tables and caches) is then done whichever
  // tests ran before this one, so the count does not depend on the test order.
  count_run(1);
  const auto handle =
      at::addGlobalCallback(at::RecordFunctionCallback(&on_op).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  const Counts two = count_run(2), three = count_run(3);
  at::removeCallback(handle);

  Counts step;
  step.ops = three.ops - two.ops;
  step.gemm_flops = three.gemm_flops - two.gemm_flops;
  step.gemm_bytes = three.gemm_bytes - two.gemm_bytes;
  for (const auto& [name, n] : three.by_op) step.by_op[name] += n;
  for (const auto& [name, n] : two.by_op) step.by_op[name] -= n;
  REQUIRE(step.ops > 0);
  REQUIRE(step.gemm_flops > 0);  // the callback saw the model's GEMMs with their shapes
  const nlohmann::json now = to_json(step);

  if (std::getenv("VLATUNE_UPDATE_BASELINES")) {
    vlatune::formats::write_file_atomic(kBaseline, vlatune::formats::dump_json_file(now));
    WARN("wrote " << kBaseline << " (" << step.ops << " ops per step): commit it");
    SUCCEED("baseline updated");
    return;
  }
  nlohmann::json base;
  try {
    base = vlatune::formats::read_json_file(kBaseline);
  } catch (const std::exception& e) {
    FAIL(e.what() << "\n(create it: VLATUNE_UPDATE_BASELINES=1 vlatune_tests_torch \"[baseline]\")");
  }
  // Name every op whose count moved, so the message says what the change did.
  std::ostringstream diff;
  std::map<std::string, int64_t> old_ops = base.at("by_op").get<std::map<std::string, int64_t>>();
  std::map<std::string, std::pair<int64_t, int64_t>> all;
  for (const auto& [name, n] : old_ops) all[name].first = n;
  for (const auto& [name, n] : now.at("by_op").get<std::map<std::string, int64_t>>()) all[name].second = n;
  for (const auto& [name, counts] : all) {
    if (counts.first != counts.second) diff << "  " << name << ": " << counts.first << " -> " << counts.second << "\n";
  }
  INFO("baseline " << kBaseline << "\nops per step: " << base.at("ops_per_step") << " -> " << step.ops
                   << "\nGEMM FLOPs per step: " << base.at("gemm_flops_per_step") << " -> " << step.gemm_flops
                   << "\nGEMM bytes per step: " << base.at("gemm_bytes_per_step") << " -> " << step.gemm_bytes
                   << "\nops whose count changed:\n"
                   << diff.str()
                   << "If the change is intended: VLATUNE_UPDATE_BASELINES=1 vlatune_tests_torch \"[baseline]\" and "
                      "commit the file.");
  CHECK(step.ops == base.at("ops_per_step").get<int64_t>());
  CHECK(step.gemm_flops == base.at("gemm_flops_per_step").get<int64_t>());
  CHECK(step.gemm_bytes == base.at("gemm_bytes_per_step").get<int64_t>());
  CHECK(diff.str().empty());
}
