// Data-parallel training on the CPU with Gloo: two processes on localhost (trainer/distributed.h,
// trainer/grad_buckets.h, `vlatune launch`).
//   - the launch environment (torchrun, Slurm) is parsed, or refused with the variable's name;
//   - the default groups cover the tiny model in backward order;
//   - bucketed all-reduce: each rank's gradients equal the mean of the two ranks' single-process gradients
//     (workers are this test binary re-executed with the hidden tag [.dist-worker]);
//   - the copy-free path (gradients all-reduced in place) and the row-sparse path (embedding rows) give exactly
//     the dense mean, and a row bound that is too small is reported with the parameter's name;
//   - a dead rank: the survivor fails with a DistributedError naming the operation (no hang);
//   - `vlatune launch --nproc 2 -- train`: the same weights as one process with grad_accum 2, parameters identical
//     on both ranks, resume on another world size, and a failing rank named by launch.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "dist_test_util.h"
#include "temp_dir.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "formats/profile.h"
#include "formats/run_record.h"
#include "model/pi05.h"
#include "model/safetensors_io.h"
#include "trainer/data_source.h"
#include "trainer/distributed.h"
#include "trainer/grad_buckets.h"
#include "trainer/optimizer.h"
#include "trainer/recipe_apply.h"

namespace {

using vlatune::test::free_port;
using vlatune::test::load_weights;
using vlatune::test::read_text;
using vlatune::test::run_vlatune;
using vlatune::test::self_exe;
using vlatune::trainer::DistEnv;

std::string temp_dir(const std::string& tag) {
  return vlatune::test::make_temp_dir("dist_" + tag);
}

// Runs this test binary's hidden worker case as `world` ranks with torchrun's variables; returns exit codes.
std::vector<int> run_workers(int world, const std::string& mode, const std::string& out_dir) {
  const std::string exe = self_exe();
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("VLATUNE_DIST_TEST_MODE", mode.c_str(), 1);
      ::setenv("VLATUNE_DIST_TEST_OUT", out_dir.c_str(), 1);
      const std::string log = out_dir + "/rank" + std::to_string(rank) + ".log";
      std::freopen(log.c_str(), "w", stdout);
      std::freopen(log.c_str(), "a", stderr);
      ::execl(exe.c_str(), exe.c_str(), "[dist-worker]", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  // A guard against a hang (not a timing check): past two minutes the workers are killed and the case fails.
  std::vector<int> codes(static_cast<size_t>(world), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (codes[r] != -1) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 0; r < pids.size(); ++r)
        if (codes[r] == -1) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          codes[r] = 999;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return codes;
}

std::string worker_logs(const std::string& dir, int world) {
  std::string all;
  for (int r = 0; r < world; ++r)
    all += "--- rank " + std::to_string(r) + "\n" + read_text(dir + "/rank" + std::to_string(r) + ".log");
  return all;
}

// The tiny model and a synthetic source, as `vlatune train --config tiny --device cpu --seed 5 --batch 2` sets
// them up (fp32).
struct TinySetup {
  vlatune::model::Pi05Config cfg = vlatune::model::Pi05Config::named("tiny");
  vlatune::model::Pi05 net{nullptr};
  std::unique_ptr<vlatune::trainer::DataSource> source;
  std::vector<std::pair<std::string, torch::Tensor>> named;
  vlatune::model::ForwardOptions forward;
  explicit TinySetup(torch::Device device = torch::kCPU) {
    net = vlatune::model::Pi05(cfg, device, torch::kFloat32);
    vlatune::model::init_weights(*net, 5);
    vlatune::trainer::LoaderOptions loader;
    loader.workers = 1;
    source = vlatune::trainer::open_data_source("synthetic", cfg, 2, 5, device, loader);
    for (const auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
    forward = vlatune::trainer::apply_recipe(vlatune::formats::Recipe{}, "<defaults>", *net).forward;
  }
  void backward(int64_t micro_index) {
    auto batch = source->next(micro_index, nullptr);
    net->forward(batch, forward).loss.backward();
  }
  std::vector<torch::Tensor> grads() {
    net->fill_missing_grads();
    std::vector<torch::Tensor> out;
    for (auto& [name, p] : named) out.push_back(p.grad().detach().clone());
    for (auto& [name, p] : named) p.mutable_grad().reset();
    return out;
  }
};

void require_close(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b,
                   double atol) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, t] : a) {
    REQUIRE(b.count(name) == 1);
    const double diff = (t.to(torch::kFloat64) - b.at(name).to(torch::kFloat64)).abs().max().item<double>();
    if (diff > worst) {
      worst = diff;
      worst_name = name;
    }
  }
  INFO("largest difference " << worst << " in " << worst_name);
  CHECK(worst <= atol);
}

// Hand-made parameters whose gradients are known per rank and step, for the copy-free and row-sparse cases: a
// plain matrix `a`; `b`, used on rank 0 only (rank 1 has no gradient for it); `q` and `k`, row views of one packed
// buffer as model::pack_rows makes them, read through one cat (autograd hands them views of one gradient); an
// embedding `emb` [64, 4] looked up at per-rank ids; `w`, dense, next to it.
struct HandModel {
  torch::TensorOptions options;
  torch::Tensor a, b, q, k, emb, w;
  std::vector<std::pair<std::string, torch::Tensor>> named;
  explicit HandModel(torch::Device device = torch::kCPU, torch::Dtype dtype = torch::kFloat32)
      : options(torch::TensorOptions().device(device).dtype(dtype)) {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    auto make = [&](const torch::Tensor& values) { return values.to(options).requires_grad_(); };
    a = make(torch::arange(12, f32).reshape({4, 3}) / 7);
    b = make(torch::arange(5, f32) / 3 - 1);
    {
      torch::NoGradGuard no_grad;
      const torch::Tensor packed = (torch::arange(18, f32).reshape({6, 3}) / 11).to(options);
      q = torch::empty({2, 3}, options).requires_grad_();
      k = torch::empty({4, 3}, options).requires_grad_();
      q.set_data(packed.narrow(0, 0, 2));
      k.set_data(packed.narrow(0, 2, 4));
    }
    emb = make(torch::arange(256, f32).reshape({64, 4}) / 13);
    w = make(torch::tensor({0.5f, -1.5f, 2.25f}));
    named = {{"a", a}, {"b", b}, {"q", q}, {"k", k}, {"embed.weight", emb}, {"w", w}};
  }
  // Inputs that differ per rank and step, with values whose sums are not exact in fp32 or bf16.
  torch::Tensor input(int rank, int64_t step, std::vector<int64_t> sizes) const {
    int64_t n = 1;
    for (int64_t d : sizes) n *= d;
    return (torch::arange(n, torch::kFloat32).reshape(sizes) * 0.37 + 0.11 * static_cast<double>(rank + 1) +
            0.013 * static_cast<double>(step))
        .sin()
        .to(options);
  }
  torch::Tensor loss_dense(int rank, int64_t step) const {
    torch::Tensor loss = (a * input(rank, step, {4, 3})).sum() + (torch::cat({q, k}) * input(rank, step, {6, 3})).sum();
    return rank == 0 ? loss + (b * input(rank, step, {5})).sum() : loss;
  }
  static std::vector<int64_t> ids(int rank, int64_t step) {
    static const std::vector<std::vector<int64_t>> table = {
        {1, 5, 9, 5}, {5, 20, 33},   // different and overlapping rows; row 0 untouched (the padding row)
        {0, 2, 63},   {0, 2, 7, 7},  // row 0 touched on both ranks
        {10, 11},     {11, 12, 13, 14}, {3}, {60}, {1, 2, 3}, {4, 5}};  // 5 rows: more than a capacity of 2 x 1
    return table[static_cast<size_t>(step * 2 + rank)];
  }
  torch::Tensor loss_rows(int rank, int64_t step) const {
    const std::vector<int64_t> row_ids = ids(rank, step);
    const auto n = static_cast<int64_t>(row_ids.size());
    const torch::Tensor looked_up = torch::embedding(emb, torch::tensor(row_ids).to(options.device()));
    return (looked_up * input(rank, step, {n, 4})).sum() + (w * input(rank, step, {3})).sum();
  }
  void backward_dense(int rank, int64_t step) { loss_dense(rank, step).backward(); }
  void backward_rows(int rank, int64_t step) { loss_rows(rank, step).backward(); }
  void backward_all(int rank, int64_t step) { (loss_dense(rank, step) + loss_rows(rank, step)).backward(); }
  // The parameters' gradients on the CPU (zeros where there is none), then cleared.
  std::vector<torch::Tensor> take_grads() {
    std::vector<torch::Tensor> out;
    for (auto& [name, p] : named) {
      out.push_back(p.grad().defined() ? p.grad().detach().cpu().clone() : torch::zeros_like(p).cpu());
      p.mutable_grad().reset();
    }
    return out;
  }
};

// The mean of the two ranks' hand-computed gradients at `indices`, per step of 4; the step `bf16_step` as the bf16
// reduction gives it (each rank's gradient rounded to bf16, averaged, back to fp32).
std::vector<torch::Tensor> hand_means(void (HandModel::*backward)(int, int64_t), const std::vector<size_t>& indices,
                                      int64_t bf16_step) {
  HandModel hand;
  std::vector<torch::Tensor> expected;
  for (int64_t step = 0; step < 4; ++step) {
    (hand.*backward)(0, step);
    const auto g0 = hand.take_grads();
    (hand.*backward)(1, step);
    const auto g1 = hand.take_grads();
    for (size_t i : indices) {
      if (step == bf16_step)
        expected.push_back(((g0[i].to(torch::kBFloat16) + g1[i].to(torch::kBFloat16)) / 2).to(torch::kFloat32));
      else
        expected.push_back((g0[i] + g1[i]) / 2);
    }
  }
  return expected;
}

// Bitwise equality of saved gradient lists, naming the first difference.
void require_equal_lists(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& expected,
                         const std::string& label) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(label << ", tensor " << i << ": got " << got[i] << "\nexpected " << expected[i]);
    CHECK(torch::equal(got[i], expected[i]));
  }
}

const char* kTrainArgs =
    "--config tiny --device cpu --data synthetic --batch 2 --lr 1e-4 --warmup-steps 1 --decay-steps 100 "
    "--workers 1 --no-progress --seed 5 --checkpoint-every 0 --timing-warmup 0";

}  // namespace

TEST_CASE("The launch environment: torchrun and Slurm variables, or one process", "[distributed]") {
  auto env_of = [](std::map<std::string, std::string> vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  using vlatune::trainer::dist_env_from;
  CHECK_FALSE(dist_env_from(env_of({})).has_value());
  CHECK_FALSE(dist_env_from(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}})).has_value());
  CHECK_FALSE(dist_env_from(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}})).has_value());

  auto t = dist_env_from(env_of({{"RANK", "3"},
                                 {"WORLD_SIZE", "4"},
                                 {"LOCAL_RANK", "1"},
                                 {"LOCAL_WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "node0"},
                                 {"MASTER_PORT", "29511"}}));
  REQUIRE(t.has_value());
  CHECK(t->rank == 3);
  CHECK(t->world_size == 4);
  CHECK(t->local_rank == 1);
  CHECK(t->local_world_size == 2);
  CHECK(t->master_addr == "node0");
  CHECK(t->master_port == 29511);
  CHECK(t->launcher == "torchrun");

  auto s = dist_env_from(env_of({{"SLURM_PROCID", "5"},
                                 {"SLURM_NTASKS", "8"},
                                 {"SLURM_LOCALID", "1"},
                                 {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                 {"MASTER_ADDR", "10.0.0.1"}}));
  REQUIRE(s.has_value());
  CHECK(s->rank == 5);
  CHECK(s->world_size == 8);
  CHECK(s->local_rank == 1);
  CHECK(s->local_world_size == 4);
  CHECK(s->master_port == 29500);
  CHECK(s->launcher == "slurm");

  CHECK_THROWS_WITH(dist_env_from(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})),
                    Catch::Contains("MASTER_ADDR") && Catch::Contains("scontrol"));
  CHECK_THROWS_WITH(dist_env_from(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}})),
                    Catch::Contains("RANK=2"));
  CHECK_THROWS_WITH(dist_env_from(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}})),
                    Catch::Contains("RANK=x"));
  CHECK_THROWS_WITH(dist_env_from(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}})), Catch::Contains("MASTER_ADDR"));
}

TEST_CASE("The step watchdog fires when no step finishes in time, and not while steps keep finishing",
          "[distributed]") {
  using namespace std::chrono_literals;
  std::mutex m;
  std::vector<std::string> fired;
  auto record = [&](const std::string& message) {
    std::lock_guard<std::mutex> lock(m);
    fired.push_back(message);
  };
  {
    vlatune::trainer::StepWatchdog dog(1, 2, 40ms, record);
    for (int i = 0; i < 10; ++i) {  // steps every 10 ms: never 40 ms apart (the first may take 120 ms)
      std::this_thread::sleep_for(10ms);
      dog.step_done();
    }
  }
  CHECK(fired.empty());
  {
    vlatune::trainer::StepWatchdog dog(1, 2, 40ms, record);
    dog.step_done();
    std::this_thread::sleep_for(300ms);  // a peer died: no step finishes
  }
  REQUIRE(fired.size() == 1);
  CHECK_THAT(fired[0], Catch::Contains("rank 1 of 2") && Catch::Contains("no training step in 0.04 s") &&
                           Catch::Contains("another rank probably died"));
}

TEST_CASE("Default gradient groups: the named units in backward order, covering every parameter", "[distributed]") {
  TinySetup tiny;
  const auto groups = vlatune::trainer::default_group_modules(vlatune::trainer::module_fqns(*tiny.net));
  std::vector<std::string> names;
  for (const auto& g : groups) names.push_back(g.name);
  CHECK(names == std::vector<std::string>{"heads.out", "layer.1", "layer.0", "heads.in", "vision"});

  std::vector<std::string> params;
  for (const auto& [name, p] : tiny.named) params.push_back(name);
  const auto buckets = vlatune::trainer::assign_parameters(params, groups);
  size_t total = 0;
  for (const auto& b : buckets) {
    INFO(b.name);
    CHECK(b.name != "<rest>");
    total += b.params.size();
  }
  CHECK(total == params.size());

  // Recipe groups in forward order come back in backward order; overlapping groups are refused.
  auto ordered = vlatune::trainer::backward_ordered({groups[4], groups[3], groups[0]});
  CHECK(ordered[0].name == "heads.out");
  CHECK(ordered[2].name == "vision");
  CHECK_THROWS_WITH(vlatune::trainer::assign_parameters(params, {{"a", {"action_in_proj"}}, {"b", {"action_in_proj"}}}),
                    Catch::Contains("two groups"));
}

// GPU (NCCL, two GPUs; scripts/multi-gpu-check.sh runs it): two ranks at micro-batch 2 take the same steps as one
// process with grad_accum 2 on the same micro-batches: the same loss and gradient norm every step (the norm is
// measured after the all-reduce, so a sum instead of a mean or a missing group shows there), identical parameters
// on both ranks.
TEST_CASE("vlatune launch --nproc 2 -- train on two GPUs (NCCL) matches one GPU with grad_accum 2",
          "[.gpu][distributed]") {
  if (torch::cuda::device_count() < 2) FAIL("needs two GPUs, found " << static_cast<int>(torch::cuda::device_count()));
  const std::string dir = temp_dir("gpu");
  const std::string two = dir + "/two", one = dir + "/one";
  const std::string args =
      "--config tiny --device cuda --data synthetic --batch 2 --lr 1e-3 --warmup-steps 1 --decay-steps 100 "
      "--workers 1 --no-progress --seed 5 --checkpoint-every 0 --timing-warmup 0 --steps 4 --precision fp32-master "
      "--no-save";
  int rc = run_vlatune("launch --nproc 2 -- train " + args + " --reduce-dtype fp32 --out " + two, dir + "/two.log");
  const std::string two_log = read_text(dir + "/two.log");
  INFO(two_log);
  REQUIRE(rc == 0);
  CHECK_THAT(two_log, Catch::Contains("nccl") && Catch::Contains("parameters identical on all 2 ranks"));
  rc = run_vlatune("train " + args + " --grad-accum 2 --out " + one, dir + "/one.log");
  INFO(read_text(dir + "/one.log"));
  REQUIRE(rc == 0);
  const auto a = vlatune::formats::read_run_record(two + "/run.json");
  const auto b = vlatune::formats::read_run_record(one + "/run.json");
  CHECK(a.environment.world_size == 2);
  CHECK(a.batch == b.batch);
  REQUIRE(a.loss.size() == 4);
  REQUIRE(b.loss.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    INFO("step " << i << ": loss " << a.loss[i] << " vs " << b.loss[i] << ", grad norm " << a.grad_norm[i] << " vs "
                 << b.grad_norm[i]);
    CHECK(a.loss[i] == Approx(b.loss[i]).epsilon(2e-3));
    CHECK(a.grad_norm[i] == Approx(b.grad_norm[i]).epsilon(1e-2));
  }
}

// The worker behind the two-process cases: this binary, run by run_workers with torchrun's variables. Modes
// "gpu..." run on cuda:LOCAL_RANK with NCCL, the others on the CPU with Gloo.
TEST_CASE("distributed worker (run by the two-process cases)", "[.dist-worker]") {
  const char* mode_env = std::getenv("VLATUNE_DIST_TEST_MODE");
  const char* out_env = std::getenv("VLATUNE_DIST_TEST_OUT");
  REQUIRE(mode_env != nullptr);
  REQUIRE(out_env != nullptr);
  const std::string mode = mode_env, out = out_env;
  auto env = vlatune::trainer::dist_env_from_process();
  if (!env && mode == "gpu-scatter") {  // a world of one (one GPU): the launch variables say "one process"
    env = DistEnv{};
    env->master_port = std::stoi(std::getenv("MASTER_PORT"));
  }
  REQUIRE(env.has_value());
  torch::Device device = torch::kCPU;
  if (mode.rfind("gpu", 0) == 0) {
    vlatune::trainer::set_nccl_environment();
    device = vlatune::trainer::bind_process_device(torch::Device(torch::kCUDA), *env);
  }
  auto pg = vlatune::trainer::ProcessGroup::create(*env, device, std::chrono::seconds(60));
  const int rank = pg->rank();

  if (mode == "die") {
    pg->barrier("start-up barrier");
    if (rank == 1) ::_exit(3);  // a rank that dies after the rendezvous
    torch::Tensor t = torch::ones({1000});
    try {
      for (int i = 0; i < 100; ++i) pg->allreduce_sum_blocking(t, "all-reduce of test tensor");
      FAIL("the all-reduce with a dead peer did not fail");
    } catch (const vlatune::trainer::DistributedError& e) {
      std::ofstream(out + "/error.txt") << e.what();
    }
    return;
  }

  using vlatune::trainer::BucketAssignment;
  using vlatune::trainer::GradBuckets;
  using vlatune::trainer::GradBucketsOptions;
  auto save_info = [&](const std::string& name, const std::string& text) {
    std::ofstream(out + "/" + name + std::to_string(rank) + ".txt") << text;
  };

  if (mode == "in-place") {
    // Parameters a, b in one group and the packed views q, k in another (indices into HandModel::named); the
    // embedding and w get no gradient here.
    HandModel hand;
    const std::vector<BucketAssignment> assignment = {{"packed", {2, 3}}, {"plain", {0, 1}}, {"unused", {4, 5}}};
    std::vector<torch::Tensor> saved;
    std::ostringstream info;
    auto keep = [&](std::vector<torch::Tensor> grads) { saved.insert(saved.end(), grads.begin(), grads.begin() + 4); };
    {
      // Steps 0 and 1: fp32 gradients reduced in fp32, in place, groups launched during backward where complete;
      // rank 1 never has b's gradient (zero-filled by the buckets: no fill_missing_grads here).
      GradBucketsOptions options;
      options.reduce_fp32 = true;
      GradBuckets buckets(pg, hand.named, assignment, options);
      for (const auto& g : buckets.groups()) info << "in_place " << g.name << " " << g.in_place << "\n";
      for (int64_t step = 0; step < 2; ++step) {
        buckets.arm_last_backward();
        hand.backward_dense(rank, step);
        const void* a_before = hand.a.grad().data_ptr();
        const bool views_before = hand.q.grad().storage().is_alias_of(hand.k.grad().storage());
        buckets.finish();
        info << "step " << step << " a_kept " << (hand.a.grad().data_ptr() == a_before) << " qk_views " << views_before
             << " " << hand.q.grad().storage().is_alias_of(hand.k.grad().storage()) << "\n";
        keep(hand.take_grads());
      }
      info << "launched_in_backward " << buckets.launched_during_backward() << "\n";
    }
    {
      // Step 2: one bucket after backward, a's gradient handed over non-contiguous (same values).
      GradBucketsOptions options;
      options.reduce_fp32 = true;
      options.overlap = false;
      GradBuckets one(pg, hand.named, assignment, options);
      info << "one in_place " << one.groups().at(0).in_place << "\n";
      one.arm_last_backward();
      hand.backward_dense(rank, 2);
      hand.a.mutable_grad() = hand.a.grad().t().contiguous().t();
      info << "a contiguous before " << hand.a.grad().is_contiguous();
      one.finish();
      info << " after " << hand.a.grad().is_contiguous() << "\n";
      keep(hand.take_grads());
    }
    {
      // Step 3: fp32 gradients reduced in bf16: the flat buffer path (cast in, cast back).
      GradBuckets cast(pg, hand.named, assignment, GradBucketsOptions{});
      for (const auto& g : cast.groups()) info << "cast in_place " << g.name << " " << g.in_place << "\n";
      cast.arm_last_backward();
      hand.backward_dense(rank, 3);
      cast.finish();
      keep(hand.take_grads());
    }
    torch::save(saved, out + "/grads" + std::to_string(rank) + ".pt");
    save_info("info", info.str());
    return;
  }

  if (mode == "rows") {
    // The embedding (index 4) row-sparse at 4 rows per rank (capacity 8 of 64 rows), in one group with w (5).
    HandModel hand;
    const std::vector<BucketAssignment> assignment = {{"dense", {0, 1, 2, 3}}, {"embed", {4, 5}}};
    std::vector<torch::Tensor> saved;
    std::ostringstream info;
    auto keep = [&](std::vector<torch::Tensor> grads) {
      saved.push_back(grads[4]);
      saved.push_back(grads[5]);
    };
    auto describe = [&](const std::string& label, const GradBuckets& buckets) {
      const auto& g = buckets.groups().back();
      info << label << " rows " << g.row_sparse.size() << " bytes " << g.bytes << " dense " << g.dense_bytes << "\n";
    };
    auto step_with = [&](GradBuckets& buckets, int64_t step) {
      buckets.arm_last_backward();
      hand.backward_rows(rank, step);
      buckets.finish();
      keep(hand.take_grads());
    };
    GradBucketsOptions options;
    options.reduce_fp32 = true;
    options.row_sparse = {{4, 4}};
    {
      GradBuckets buckets(pg, hand.named, assignment, options);  // steps 0, 1: fp32 rows
      describe("fp32", buckets);
      step_with(buckets, 0);
      step_with(buckets, 1);
      buckets.check_row_bounds();
    }
    {
      GradBucketsOptions cast = options;  // step 2: rows gathered in bf16, written back in fp32
      cast.reduce_fp32 = false;
      GradBuckets buckets(pg, hand.named, assignment, cast);
      describe("bf16", buckets);
      step_with(buckets, 2);
    }
    {
      GradBucketsOptions one = options;  // step 3: one bucket: dense
      one.overlap = false;
      GradBuckets buckets(pg, hand.named, assignment, one);
      describe("one", buckets);
      step_with(buckets, 3);
    }
    GradBucketsOptions half = options;  // a capacity of half the rows (2 x 16 of 64): dense
    half.row_sparse = {{4, 16}};
    describe("half", GradBuckets(pg, hand.named, assignment, half));
    torch::save(saved, out + "/grads" + std::to_string(rank) + ".pt");
    save_info("info", info.str());
    return;
  }

  if (mode == "gpu") {
    // NCCL (AVG in the collective, the comm stream, launches during backward): steps 0, 1 with bf16 parameters
    // reduced in bf16 (in place; the embedding row-sparse at 4 rows per rank), step 2 with fp32 parameters reduced
    // in bf16 (the flat buffer; rows gathered in bf16). Gradients of all six parameters saved per step.
    const std::vector<BucketAssignment> assignment = {{"packed", {2, 3}}, {"plain", {0, 1}}, {"embed", {4, 5}}};
    std::vector<torch::Tensor> saved;
    std::ostringstream info;
    GradBucketsOptions options;
    options.row_sparse = {{4, 4}};
    {
      HandModel hand(device, torch::kBFloat16);
      GradBuckets buckets(pg, hand.named, assignment, options);
      for (int64_t step = 0; step < 2; ++step) {
        buckets.arm_last_backward();
        hand.backward_all(rank, step);
        buckets.finish();
        for (auto& g : hand.take_grads()) saved.push_back(g);
      }
      buckets.check_row_bounds();
      for (const auto& g : buckets.groups())
        info << g.name << " in_place " << g.in_place << " rows " << g.row_sparse.size() << "\n";
      info << "launched_in_backward " << buckets.launched_during_backward() << "\n";
    }
    {
      HandModel hand(device, torch::kFloat32);
      GradBuckets buckets(pg, hand.named, assignment, options);
      buckets.arm_last_backward();
      hand.backward_all(rank, 2);
      buckets.finish();
      for (auto& g : hand.take_grads()) saved.push_back(g);
      buckets.check_row_bounds();
    }
    torch::save(saved, out + "/grads" + std::to_string(rank) + ".pt");
    save_info("info", info.str());
    return;
  }

  if (mode == "row-bound") {
    // Capacity 2 x 1 rows; step 4 of HandModel::ids touches 5 rows over the ranks.
    HandModel hand;
    GradBucketsOptions options;
    options.reduce_fp32 = true;
    options.row_sparse = {{4, 1}};
    GradBuckets buckets(pg, hand.named, {{"all", {0, 1, 2, 3, 4, 5}}}, options);
    std::ostringstream info;
    buckets.arm_last_backward();
    hand.backward_rows(rank, 4);
    buckets.finish();  // the count stays on the device: no error yet
    hand.take_grads();
    try {
      buckets.arm_last_backward();  // the next step reads it
      info << "next step: no error\n";
    } catch (const vlatune::trainer::DistributedError& e) {
      info << "next step: " << e.what() << "\n";
    }
    hand.backward_rows(rank, 4);
    buckets.finish();
    hand.take_grads();
    try {
      buckets.check_row_bounds();
      info << "check: no error\n";
    } catch (const vlatune::trainer::DistributedError& e) {
      info << "check: " << e.what() << "\n";
    }
    save_info("info", info.str());
    return;
  }

  if (mode == "scatter" || mode == "gpu-scatter") {
    // The sharded step as NCCL runs it (a reduce-scatter, the norm summed over the ranks' ranges), here over Gloo,
    // against the unsharded step from the same start: three steps of the tiny model without clipping, on
    // micro-batches step * world + rank; each run's parameters, gradient norms and optimizer state bytes saved.
    const int world = pg->size();
    for (const bool shard : {false, true}) {
      TinySetup tiny(device);
      std::vector<std::string> names;
      for (const auto& [name, p] : tiny.named) names.push_back(name);
      const auto assignment = vlatune::trainer::assign_parameters(
          names, vlatune::trainer::default_group_modules(vlatune::trainer::module_fqns(*tiny.net)));
      GradBucketsOptions options;
      options.shard = shard;
      options.shard_reduction = vlatune::trainer::ShardReduction::kReduceScatter;
      GradBuckets buckets(pg, tiny.named, assignment, options);
      vlatune::trainer::ShardedGradients gradients;
      gradients.range_gradient = [&](size_t i) { return buckets.range_gradient(i); };
      gradients.whole_gradients = buckets.whole_gradients();
      gradients.sum_over_ranks = [&](torch::Tensor& t) { pg->allreduce_sum(t, "norm")->wait(); };
      auto optimizer = shard ? vlatune::trainer::AdamW(tiny.named, {}, buckets.ranges(), gradients)
                             : vlatune::trainer::AdamW(tiny.named, {});
      std::ostringstream info;
      info << std::setprecision(17) << "whole " << buckets.whole_gradients() << " bytes " << optimizer.state_bytes();
      for (int64_t step = 0; step < 3; ++step) {
        buckets.arm_last_backward();
        tiny.backward(step * world + rank);
        buckets.finish();
        const auto result = optimizer.step(1e-3, /*max_grad_norm=*/0.0);
        if (shard) buckets.gather_parameters();
        optimizer.zero_grad();
        info << " norm " << result.grad_norm;
      }
      std::vector<torch::Tensor> params;
      for (const auto& [name, p] : tiny.named) params.push_back(p.detach().cpu().clone());
      const std::string tag = shard ? "sharded" : "whole";
      torch::save(params, out + "/" + tag + std::to_string(rank) + ".pt");
      save_info(tag, info.str());
    }
    return;
  }

  // mode == "buckets": steps 0 and 1 on micro-batches step * 2 + rank, through GradBuckets (fp32, overlap),
  // then step 2 with one bucket after backward (fp32); gradients saved per step.
  TinySetup tiny;
  std::vector<std::string> names;
  for (const auto& [name, p] : tiny.named) names.push_back(name);
  const auto assignment = vlatune::trainer::assign_parameters(
      names, vlatune::trainer::default_group_modules(vlatune::trainer::module_fqns(*tiny.net)));
  std::vector<torch::Tensor> saved;
  int launched_in_backward = 0;
  {
    vlatune::trainer::GradBucketsOptions options;
    options.reduce_fp32 = true;
    vlatune::trainer::GradBuckets buckets(pg, tiny.named, assignment, options);
    for (int64_t step = 0; step < 2; ++step) {
      buckets.arm_last_backward();
      tiny.backward(step * 2 + rank);
      tiny.net->fill_missing_grads();
      buckets.finish();
      for (auto& g : tiny.grads()) saved.push_back(g);
    }
    launched_in_backward = buckets.launched_during_backward();
  }
  {
    vlatune::trainer::GradBucketsOptions options;
    options.reduce_fp32 = true;
    options.overlap = false;
    vlatune::trainer::GradBuckets one(pg, tiny.named, assignment, options);
    CHECK(one.groups().size() == 1);
    one.arm_last_backward();
    tiny.backward(2 * 2 + rank);
    tiny.net->fill_missing_grads();
    one.finish();
    for (auto& g : tiny.grads()) saved.push_back(g);
  }
  torch::save(saved, out + "/grads" + std::to_string(rank) + ".pt");
  std::ofstream(out + "/launched" + std::to_string(rank) + ".txt") << launched_in_backward;
}

// GPU (NCCL, two GPUs; scripts/multi-gpu-check.sh runs it): the in-place and row-sparse reductions on the device,
// launched from the backward hooks on the comm stream, give the mean of the ranks' gradients (to rounding: NCCL's
// AVG), with missing gradients (b on rank 1), views of one packed buffer (q, k) and overlapping embedding rows.
TEST_CASE("Copy-free and row-sparse all-reduce on two GPUs (NCCL) give the mean of the ranks' gradients",
          "[.gpu][distributed]") {
  if (torch::cuda::device_count() < 2) FAIL("needs two GPUs, found " << static_cast<int>(torch::cuda::device_count()));
  const std::string dir = temp_dir("gpu-buckets");
  const auto codes = run_workers(2, "gpu", dir);
  INFO(worker_logs(dir, 2));
  REQUIRE(codes == std::vector<int>{0, 0});
  // Reference on the CPU, per dtype, each rank's gradients computed alone.
  std::vector<torch::Tensor> expected;
  for (int64_t step = 0; step < 3; ++step) {
    HandModel hand(torch::kCPU, step < 2 ? torch::kBFloat16 : torch::kFloat32);
    hand.backward_all(0, step);
    const auto g0 = hand.take_grads();
    hand.backward_all(1, step);
    const auto g1 = hand.take_grads();
    for (size_t i = 0; i < g0.size(); ++i)
      expected.push_back((g0[i].to(torch::kFloat32) + g1[i].to(torch::kFloat32)) / 2);
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<torch::Tensor> got;
    torch::load(got, dir + "/grads" + std::to_string(rank) + ".pt");
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      // Reduced in bf16 throughout: a relative bf16 rounding (2^-8) of the largest value; a sum instead of a mean,
      // a lost row or a group reduced twice is far off.
      const double scale = std::max(1.0, expected[i].abs().max().item<double>());
      const double diff = (got[i].to(torch::kFloat32) - expected[i]).abs().max().item<double>();
      INFO("rank " << rank << ", step " << i / 6 << ", parameter " << i % 6 << ": largest difference " << diff);
      CHECK(diff <= scale / 128);
    }
    const std::string info = read_text(dir + "/info" + std::to_string(rank) + ".txt");
    INFO(info);
    CHECK_THAT(info, Catch::Contains("packed in_place 1 rows 0") && Catch::Contains("embed in_place 1 rows 1"));
  }
  CHECK_THAT(read_text(dir + "/info0.txt"), !Catch::Contains("launched_in_backward 0"));
}

#ifdef VLATUNE_HAVE_GLOO

TEST_CASE("Bucketed all-reduce over Gloo: each rank's gradients are the mean of the ranks' gradients",
          "[distributed][gloo]") {
  const std::string dir = temp_dir("buckets");
  const auto codes = run_workers(2, "buckets", dir);
  INFO(worker_logs(dir, 2));
  REQUIRE(codes == std::vector<int>{0, 0});

  // Reference: one process, each micro-batch's gradients separately, averaged.
  TinySetup tiny;
  std::vector<torch::Tensor> expected;
  for (int64_t step = 0; step < 3; ++step) {
    tiny.backward(step * 2);
    auto g0 = tiny.grads();
    tiny.backward(step * 2 + 1);
    auto g1 = tiny.grads();
    for (size_t i = 0; i < g0.size(); ++i) expected.push_back((g0[i] + g1[i]) / 2);
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<torch::Tensor> got;
    torch::load(got, dir + "/grads" + std::to_string(rank) + ".pt");
    REQUIRE(got.size() == expected.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double scale = std::max(1.0, expected[i].abs().max().item<double>());
      worst = std::max(worst, (got[i] - expected[i]).abs().max().item<double>() / scale);
    }
    INFO("rank " << rank << ": largest relative difference " << worst);
    CHECK(worst < 1e-5);
  }
  // The second step (after the first has shown which parameters get gradients) starts reductions mid-backward.
  const int launched = std::stoi(read_text(dir + "/launched0.txt"));
  CHECK(launched > 0);
}

TEST_CASE("Copy-free all-reduce over Gloo: gradients reduced in place equal the mean, bit for bit",
          "[distributed][gloo]") {
  const std::string dir = temp_dir("in-place");
  const auto codes = run_workers(2, "in-place", dir);
  INFO(worker_logs(dir, 2));
  REQUIRE(codes == std::vector<int>{0, 0});

  // Reference by hand: each rank's gradients of a, b, q, k (b zero on rank 1), averaged; step 3 in bf16.
  const auto expected = hand_means(&HandModel::backward_dense, {0, 1, 2, 3}, /*bf16_step=*/3);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<torch::Tensor> got;
    torch::load(got, dir + "/grads" + std::to_string(rank) + ".pt");
    require_equal_lists(got, expected, "rank " + std::to_string(rank));
    const std::string info = read_text(dir + "/info" + std::to_string(rank) + ".txt");
    INFO(info);
    // fp32 gradients in fp32: in place (the .grad keeps its memory; q and k stay views of one gradient buffer).
    CHECK_THAT(info, Catch::Contains("in_place packed 1") && Catch::Contains("in_place plain 1") &&
                         Catch::Contains("one in_place 1"));
    CHECK_THAT(info,
               Catch::Contains("step 0 a_kept 1 qk_views 1 1") && Catch::Contains("step 1 a_kept 1 qk_views 1 1"));
    CHECK_THAT(info, Catch::Contains("a contiguous before 0 after 1"));
    // fp32 gradients in bf16: the flat buffer.
    CHECK_THAT(info, Catch::Contains("cast in_place packed 0") && Catch::Contains("cast in_place plain 0"));
  }
  // In the second step the "packed" group (complete on both ranks) is launched during backward; "plain" waits for
  // b on rank 1 until finish().
  CHECK_THAT(read_text(dir + "/info1.txt"), Catch::Contains("launched_in_backward 1"));
}

TEST_CASE("Row-sparse all-reduce over Gloo: the embedding's union of rows gives the dense mean, bit for bit",
          "[distributed][gloo]") {
  const std::string dir = temp_dir("rows");
  const auto codes = run_workers(2, "rows", dir);
  INFO(worker_logs(dir, 2));
  REQUIRE(codes == std::vector<int>{0, 0});

  const auto expected = hand_means(&HandModel::backward_rows, {4, 5}, /*bf16_step=*/2);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<torch::Tensor> got;
    torch::load(got, dir + "/grads" + std::to_string(rank) + ".pt");
    require_equal_lists(got, expected, "rank " + std::to_string(rank));
    const std::string info = read_text(dir + "/info" + std::to_string(rank) + ".txt");
    INFO(info);
    // Communicated: capacity 8 rows x 4 x element size + the 64-byte row mask + w; dense: 64 x 4 + 3 elements.
    CHECK_THAT(info, Catch::Contains("fp32 rows 1 bytes " + std::to_string(8 * 4 * 4 + 64 + 3 * 4) + " dense " +
                                     std::to_string((256 + 3) * 4)));
    CHECK_THAT(info, Catch::Contains("bf16 rows 1 bytes " + std::to_string(8 * 4 * 2 + 64 + 3 * 2) + " dense " +
                                     std::to_string((256 + 3) * 2)));
    CHECK_THAT(info, Catch::Contains("one rows 0"));
    CHECK_THAT(info, Catch::Contains("half rows 0 bytes " + std::to_string((256 + 3) * 4)));
  }
}

TEST_CASE("Row-sparse all-reduce over Gloo: too many rows for the capacity fail the next step, naming the parameter",
          "[distributed][gloo]") {
  const std::string dir = temp_dir("row-bound");
  const auto codes = run_workers(2, "row-bound", dir);
  INFO(worker_logs(dir, 2));
  REQUIRE(codes == std::vector<int>{0, 0});
  for (int rank = 0; rank < 2; ++rank) {
    const std::string info = read_text(dir + "/info" + std::to_string(rank) + ".txt");
    INFO(info);
    const std::string error =
        "distributed: the row-sparse gradient of embed.weight had 5 non-zero rows over the ranks, more than its "
        "capacity 2 (2 ranks x 1 rows per rank)";
    CHECK_THAT(info, Catch::Contains("next step: " + error));
    CHECK_THAT(info, Catch::Contains("check: " + error));
  }
}

TEST_CASE("Sharded AdamW through a reduce-scatter over Gloo: the unsharded parameters bit for bit, 1/2 of the state",
          "[distributed][gloo][zero]") {
  const std::string dir = temp_dir("scatter");
  const auto codes = run_workers(2, "scatter", dir);
  INFO(worker_logs(dir, 2));
  REQUIRE(codes == std::vector<int>{0, 0});
  // Each info file: "whole W bytes B norm n0 norm n1 norm n2".
  auto fields = [&](const std::string& file) {
    std::istringstream in(read_text(dir + "/" + file));
    std::string word;
    std::vector<double> values;
    while (in >> word) {
      double v = 0;
      in >> v;
      values.push_back(v);
    }
    return values;
  };
  int64_t sharded_bytes = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    std::vector<torch::Tensor> whole, sharded;
    torch::load(whole, dir + "/whole" + r + ".pt");
    torch::load(sharded, dir + "/sharded" + r + ".pt");
    // Two ranks sum each element in one order whatever the collective (a + b == b + a), and without clipping the
    // norm does not enter the update: the parameters are the unsharded ones exactly, on both ranks.
    require_equal_lists(sharded, whole, "rank " + r);
    const auto w = fields("whole" + r + ".txt"), s = fields("sharded" + r + ".txt");
    REQUIRE(w.size() == 5);
    REQUIRE(s.size() == 5);
    CHECK(w[0] == 1);  // the unsharded buckets leave whole gradients
    CHECK(s[0] == 0);  // the reduce-scatter leaves this rank's ranges
    // The norm from the ranks' ranges: the same sum of squares in another order of fp32 additions.
    for (size_t i = 2; i < 5; ++i) CHECK(s[i] == Approx(w[i]).epsilon(1e-6));
    sharded_bytes += static_cast<int64_t>(s[1]);
    // Each rank holds half of the state, give or take the layout's padding: under 256 values per parameter and
    // per group (fewer than 10), fp32 moments.
    const double padding_bytes = 2.0 * 4 * 256 * static_cast<double>(TinySetup().named.size() + 10);
    CHECK(std::abs(s[1] - w[1] / 2) <= padding_bytes);
  }
  CHECK(sharded_bytes == static_cast<int64_t>(fields("whole0.txt")[1]));  // the ranges partition every parameter
}

#endif  // VLATUNE_HAVE_GLOO

// GPU (NCCL; one GPU runs it as a world of one, which still takes the reduce-scatter, the norm over ranks and the
// all-gather on the device): the sharded step against the unsharded one from the same start, without clipping.
TEST_CASE("Sharded AdamW through a reduce-scatter on the GPU (NCCL) gives the unsharded parameters",
          "[.gpu][distributed][zero]") {
  const int world = torch::cuda::device_count() >= 2 ? 2 : 1;
  const std::string dir = temp_dir("gpu-scatter");
  const auto codes = run_workers(world, "gpu-scatter", dir);
  INFO(worker_logs(dir, world));
  REQUIRE(codes == std::vector<int>(static_cast<size_t>(world), 0));
  for (int rank = 0; rank < world; ++rank) {
    std::vector<torch::Tensor> whole, sharded;
    torch::load(whole, dir + "/whole" + std::to_string(rank) + ".pt");
    torch::load(sharded, dir + "/sharded" + std::to_string(rank) + ".pt");
    // NCCL's AVG over one or two ranks sums in one order whatever the collective: expected bit for bit.
    require_equal_lists(sharded, whole, "rank " + std::to_string(rank));
  }
}

#ifdef VLATUNE_HAVE_GLOO

TEST_CASE("A rank that dies makes the other fail with a clear error instead of hanging", "[distributed][gloo]") {
  const std::string dir = temp_dir("die");
  const auto codes = run_workers(2, "die", dir);
  INFO(worker_logs(dir, 2));
  CHECK(codes[1] == 3);
  CHECK(codes[0] == 0);
  const std::string error = read_text(dir + "/error.txt");
  CHECK_THAT(error, Catch::Contains("all-reduce of test tensor failed on rank 0 of 2") && Catch::Contains("gloo"));
}

TEST_CASE("vlatune launch --nproc 2 -- train: the same weights as one process with grad_accum 2",
          "[distributed][gloo][cli]") {
  const std::string dir = temp_dir("train");
  const std::string two = dir + "/two", one = dir + "/one";
  const std::string port = std::to_string(free_port());
  int rc = run_vlatune("launch --nproc 2 --master-port " + port + " -- train " + kTrainArgs +
                           " --steps 3 --reduce-dtype fp32 --out " + two,
                       dir + "/two.log");
  INFO(read_text(dir + "/two.log"));
  REQUIRE(rc == 0);
  CHECK_THAT(read_text(dir + "/two.log"),
             Catch::Contains("parameters identical on all 2 ranks") && Catch::Contains("batch 2 x 1 x 2 processes"));
  rc = run_vlatune(std::string("train ") + kTrainArgs + " --steps 3 --grad-accum 2 --out " + one, dir + "/one.log");
  INFO(read_text(dir + "/one.log"));
  REQUIRE(rc == 0);
  require_close(load_weights(two + "/final/model.safetensors"), load_weights(one + "/final/model.safetensors"), 1e-5);
  CHECK_THAT(read_text(two + "/run.json"), Catch::Contains("\"world_size\": 2"));

  // Resume the two-process run in one process (grad_accum 1 x 2 -> 2): the same as continuing the 1-process run.
  rc = run_vlatune(std::string("train --resume ") + two + " --steps 4 --no-progress", dir + "/two-resume.log");
  INFO(read_text(dir + "/two-resume.log"));
  REQUIRE(rc == 0);
  CHECK_THAT(read_text(dir + "/two-resume.log"), Catch::Contains("grad_accum 1 -> 2"));
  rc = run_vlatune(std::string("train --resume ") + one + " --steps 4 --no-progress", dir + "/one-resume.log");
  REQUIRE(rc == 0);
  require_close(load_weights(two + "/final/model.safetensors"), load_weights(one + "/final/model.safetensors"), 1e-5);

  // A world size that does not divide the global batch (2 micro-batches) is refused, before any rendezvous.
  rc = run_vlatune("launch --nproc 3 -- train --resume " + one + " --steps 5 --no-progress", dir + "/bad.log");
  INFO(read_text(dir + "/bad.log"));
  CHECK(rc == 4);
  CHECK_THAT(read_text(dir + "/bad.log"), Catch::Contains("cannot share them evenly"));
}

TEST_CASE("A multi-process recipe's prediction is compared with the measured step, its sign spelled out",
          "[distributed][gloo][cli]") {
  const std::string dir = temp_dir("planned");
  // A plan for 2 processes at micro-batch 2: the per-process batch (not the global one) is the plan's.
  std::ofstream(dir + "/x2.json") << R"({"schema": "vlatune.recipe/1", "batch": {"micro_batch": 2},
    "distributed": {"world_size": 2}, "predicted": {"step_ms": 100000.0}})";
  const std::string port = std::to_string(free_port());
  const int rc = run_vlatune("launch --nproc 2 --master-port " + port + " -- train " + kTrainArgs +
                                 " --steps 1 --recipe " + dir + "/x2.json --out " + dir + "/run",
                             dir + "/run.log");
  const std::string log = read_text(dir + "/run.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK_THAT(log, Catch::Contains("plan: step time measured") &&
                      Catch::Contains("predicted 100000.00 ms (the prediction is") &&
                      Catch::Contains("% above the measurement)"));
}

TEST_CASE("vlatune launch --nproc 2 -- profile: every rank steps, rank 0 writes profile.json",
          "[distributed][gloo][cli]") {
  const std::string dir = temp_dir("profile");
  const int rc = run_vlatune(
      "launch --nproc 2 -- profile --config tiny --device cpu --data synthetic --batch 2 --steps 1 --warmup 0 "
      "--timed-steps 1 "
      "--trace-steps 0 --ab-steps 0 --gemm-reps 0 --out " +
          dir + "/prof",
      dir + "/profile.log");
  const std::string log = read_text(dir + "/profile.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK_THAT(log, Catch::Contains("2 processes (gloo)") && Catch::Contains("wrote " + dir + "/prof/profile.json"));
  const auto profile = vlatune::formats::read_profile(dir + "/prof/profile.json");
  CHECK(profile.environment.world_size == 2);
  // The CPU tracer sees no NCCL kernel: no communication section, and the profile says why.
  CHECK_FALSE(profile.communication.has_value());
  bool said = false;
  for (const auto& d : profile.settings.degraded) said = said || d.find("no NCCL kernel") != std::string::npos;
  CHECK(said);
  // The per-group all-reduce scopes are counted as the one pseudo-module "<comm>".
  bool comm = false;
  for (const auto& m : profile.batches.at(0).modules) {
    CHECK(m.fqn.rfind("<comm>:", 0) != 0);
    comm = comm || m.fqn == "<comm>";
  }
  CHECK(comm);
}

TEST_CASE("vlatune launch: a failing rank stops the others and is named", "[distributed][gloo][cli]") {
  const std::string dir = temp_dir("fail");
  const int rc =
      run_vlatune("launch --nproc 2 -- train --resume " + dir + " --steps 2 --no-progress", dir + "/fail.log");
  const std::string log = read_text(dir + "/fail.log");
  INFO(log);
  CHECK(rc == 4);  // the ranks' own exit code (bad input)
  CHECK_THAT(log, Catch::Contains("launch: failed: rank") && Catch::Contains("exited with code 4"));
}

#endif  // VLATUNE_HAVE_GLOO
