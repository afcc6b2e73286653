// trace.json.gz in Kineto's conventions (profiler/trace_export.h), on synthetic records: three steps of scopes on
// two threads, runtime and driver launches, kernels and a copy on two streams. Torch-free (it lives in the torch
// binary only because the profiler's library does). The last case opens the trace with Holistic Trace Analysis
// (tests/core/analyze_trace_hta.py, in the venv scripts/setup.sh makes); the [.gpu] case checks a real CUPTI
// trace of the tiny model.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "profiler/records.h"
#include "profiler/trace_export.h"
#include "tests/core/trace_readers.h"

using vlatune::profiler::ActivityKind;
using vlatune::profiler::ActivityRecord;
using vlatune::profiler::Phase;
using vlatune::profiler::ScopeRecord;
using vlatune::profiler::TraceData;
using vlatune::profiler::TraceMetadata;

namespace {

constexpr uint64_t kMs = 1000000;
constexpr uint64_t kT0 = 5000 * kMs;  // the records' clock at the first step
constexpr int64_t kUnixMinusClock = 1700000000000000000 - static_cast<int64_t>(kT0);
constexpr uint64_t kMainThread = 1001, kBackwardThread = 1002;

// Step s: <data> (a copy), the model with one layer (a GEMM launched through the runtime), its backward on the
// autograd thread (a kernel launched through the driver), <optimizer>; plus a runtime call that launched nothing.
TraceData synthetic_trace(int steps) {
  TraceData t;
  t.names = {"<data>", "model", "model.layer", "<optimizer>"};
  t.unix_minus_clock_ns = kUnixMinusClock;
  uint64_t id = 0;
  uint32_t corr = 100;
  auto scope = [&](int32_t fqn, Phase phase, int64_t step, uint64_t parent, uint64_t forward_of, uint64_t thread,
                   uint64_t begin, uint64_t end) {
    ScopeRecord s;
    s.id = ++id;
    s.parent = parent;
    s.forward_of = forward_of;
    s.fqn = fqn;
    s.phase = phase;
    s.step = step;
    s.thread = thread == kMainThread ? 0 : 1;
    s.os_thread = thread;
    s.begin_ns = begin;
    s.end_ns = end;
    t.scopes.push_back(s);
    return s.id;
  };
  auto api = [&](ActivityKind kind, const char* name, uint32_t cbid, uint64_t thread, uint64_t at, uint64_t scope_id) {
    ActivityRecord a;
    a.kind = kind;
    a.name = name;
    a.cbid = cbid;
    a.thread = thread;
    a.start_ns = at;
    a.end_ns = at + kMs / 20;
    a.correlation_id = ++corr;
    t.activities.push_back(a);
    t.correlations.push_back({a.correlation_id, scope_id});
    return a.correlation_id;
  };
  auto device = [&](ActivityKind kind, const char* name, uint32_t stream, uint64_t begin, uint64_t end, uint32_t c) {
    ActivityRecord a;
    a.kind = kind;
    a.name = name;
    a.stream = stream;
    a.start_ns = begin;
    a.end_ns = end;
    a.correlation_id = c;
    if (kind == ActivityKind::kKernel) {
      a.grid = {132, 1, 1};
      a.block = {384, 1, 1};
      a.registers_per_thread = 168;
      a.shared_memory_bytes = 197632;
    } else {
      a.bytes = 4096;
    }
    t.activities.push_back(a);
  };
  for (int s = 0; s < steps; ++s) {
    const uint64_t t0 = kT0 + static_cast<uint64_t>(s) * 10 * kMs;
    const uint64_t data = scope(0, Phase::kForward, s, 0, 0, kMainThread, t0, t0 + kMs);
    device(ActivityKind::kMemcpy, "memcpy HtoD", 13, t0 + kMs * 3 / 10, t0 + kMs / 2,
           api(ActivityKind::kRuntime, "cudaMemcpyAsync", 41, kMainThread, t0 + kMs / 5, data));
    const uint64_t model = scope(1, Phase::kForward, s, 0, 0, kMainThread, t0 + kMs, t0 + 5 * kMs);
    const uint64_t layer = scope(2, Phase::kForward, s, model, 0, kMainThread, t0 + 2 * kMs, t0 + 4 * kMs);
    device(ActivityKind::kKernel, "sm90_xmma_gemm_bf16bf16_bf16f32", 7, t0 + 23 * kMs / 10, t0 + 33 * kMs / 10,
           api(ActivityKind::kRuntime, "cudaLaunchKernel", 211, kMainThread, t0 + 21 * kMs / 10, layer));
    api(ActivityKind::kRuntime, "cudaGetDevice", 17, kMainThread, t0 + 4 * kMs + kMs / 2, model);
    const uint64_t backward = scope(1, Phase::kBackward, s, 0, model, kBackwardThread, t0 + 5 * kMs, t0 + 8 * kMs);
    device(ActivityKind::kKernel, "elementwise_kernel", 7, t0 + 6 * kMs, t0 + 7 * kMs,
           api(ActivityKind::kDriver, "cuLaunchKernel", 307, kBackwardThread, t0 + 55 * kMs / 10, backward));
    scope(3, Phase::kOptimizer, s, 0, 0, kMainThread, t0 + 8 * kMs, t0 + 9 * kMs);
  }
  return t;
}

TraceMetadata synthetic_metadata(int world_size) {
  TraceMetadata meta;
  meta.process_id = 4242;
  meta.world_size = world_size;
  meta.backend = "nccl";
  vlatune::profiler::DeviceProperties d;
  d.name = "NVIDIA H200";
  d.total_global_mem = 150754820096;
  d.compute_major = 9;
  d.num_sms = 132;
  d.warp_size = 32;
  meta.devices.push_back(d);
  return meta;
}

std::vector<nlohmann::json> events_of(const nlohmann::json& trace, const std::string& cat) {
  std::vector<nlohmann::json> out;
  for (const auto& e : trace.at("traceEvents"))
    if (e.value("cat", "") == cat) out.push_back(e);
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/vlatune_trace_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

}  // namespace

TEST_CASE("The trace carries Kineto's top level: schema, base time, device properties, distributed info",
          "[profiler][trace]") {
  const auto trace = vlatune::profiler::chrome_trace(synthetic_trace(2), synthetic_metadata(2));
  CHECK(trace.at("schemaVersion") == 1);
  CHECK(trace.at("displayTimeUnit") == "ms");
  // ts 0 is the first record (the first step's <data> scope), whose Unix time is its clock time plus the offset.
  CHECK(trace.at("baseTimeNanoseconds").get<int64_t>() == static_cast<int64_t>(kT0) + kUnixMinusClock);
  REQUIRE(trace.at("deviceProperties").size() == 1);
  CHECK(trace.at("deviceProperties")[0].at("name") == "NVIDIA H200");
  CHECK(trace.at("deviceProperties")[0].at("numSms") == 132);
  CHECK(trace.at("deviceProperties")[0].at("computeMajor") == 9);
  CHECK(trace.at("distributedInfo") == nlohmann::json({{"backend", "nccl"}, {"rank", 0}, {"world_size", 2}}));
  CHECK_FALSE(vlatune::profiler::chrome_trace(synthetic_trace(1), synthetic_metadata(1)).contains("distributedInfo"));
}

TEST_CASE("Each step is a ProfilerStep#N annotation spanning its scopes on the thread that opened it",
          "[profiler][trace]") {
  const auto trace = vlatune::profiler::chrome_trace(synthetic_trace(3), synthetic_metadata(1));
  std::map<std::string, nlohmann::json> steps;
  size_t scopes = 0;
  for (const auto& e : events_of(trace, "user_annotation")) {
    const std::string name = e.at("name");
    if (name.rfind("ProfilerStep#", 0) == 0)
      steps[name] = e;
    else
      ++scopes;
  }
  CHECK(scopes == 3 * 5);
  REQUIRE(steps.size() == 3);
  for (int s = 0; s < 3; ++s) {
    const auto& e = steps.at("ProfilerStep#" + std::to_string(s));
    CHECK(e.at("ph") == "X");
    CHECK(e.at("pid") == 4242);
    CHECK(e.at("tid") == kMainThread);
    CHECK(e.at("ts").get<double>() == Approx(s * 10000.0));  // us from the base time
    CHECK(e.at("dur").get<double>() == Approx(9000.0));      // <data> to the end of <optimizer>
  }
  // The backward scope is on its own thread, named by its FQN, with its instance as External id.
  bool backward = false;
  for (const auto& e : events_of(trace, "user_annotation"))
    if (e.at("tid") == kBackwardThread) {
      backward = true;
      CHECK(e.at("name") == "model");
      CHECK(e.at("args").at("phase") == "backward");
      CHECK(e.at("args").contains("External id"));
    }
  CHECK(backward);
}

TEST_CASE("Kernels, copies and their launches carry Kineto's categories and args", "[profiler][trace]") {
  const auto trace = vlatune::profiler::chrome_trace(synthetic_trace(2), synthetic_metadata(1));
  const auto kernels = events_of(trace, "kernel");
  REQUIRE(kernels.size() == 4);
  const auto& gemm = kernels[0];
  CHECK(gemm.at("name") == "sm90_xmma_gemm_bf16bf16_bf16f32");
  CHECK(gemm.at("pid") == 0);
  CHECK(gemm.at("tid") == 7);
  const auto& args = gemm.at("args");
  CHECK(args.at("device") == 0);
  CHECK(args.at("stream") == 7);
  CHECK(args.at("correlation").get<uint32_t>() > 100);
  CHECK(args.at("grid") == nlohmann::json::array({132, 1, 1}));
  CHECK(args.at("block") == nlohmann::json::array({384, 1, 1}));
  CHECK(args.at("registers per thread") == 168);
  CHECK(args.at("shared memory") == 197632);
  CHECK(args.at("module") == "model.layer");
  CHECK(args.at("phase") == "forward");
  CHECK(kernels[1].at("args").at("module") == "model");
  CHECK(kernels[1].at("args").at("phase") == "backward");

  const auto copies = events_of(trace, "gpu_memcpy");
  REQUIRE(copies.size() == 2);
  CHECK(copies[0].at("name") == "Memcpy HtoD");
  CHECK(copies[0].at("tid") == 13);
  CHECK(copies[0].at("args").at("bytes") == 4096);
  CHECK(copies[0].at("args").at("module") == "<data>");

  // The launching calls: on their host thread, with cbid and correlation; cudaGetDevice launched nothing.
  const auto runtime = events_of(trace, "cuda_runtime");
  const auto driver = events_of(trace, "cuda_driver");
  CHECK(runtime.size() == 4);
  REQUIRE(driver.size() == 2);
  for (const auto& e : runtime) CHECK(e.at("name") != "cudaGetDevice");
  CHECK(driver[0].at("name") == "cuLaunchKernel");
  CHECK(driver[0].at("pid") == 4242);
  CHECK(driver[0].at("tid") == kBackwardThread);
  CHECK(driver[0].at("args").at("cbid") == 307);
  CHECK(driver[0].at("args").at("correlation") == kernels[1].at("args").at("correlation"));
}

TEST_CASE("Flow events link each launching call to its work by correlation id", "[profiler][trace]") {
  const auto trace = vlatune::profiler::chrome_trace(synthetic_trace(2), synthetic_metadata(1));
  std::map<uint32_t, nlohmann::json> calls, work, starts, finishes;
  for (const auto& e : trace.at("traceEvents")) {
    const std::string cat = e.value("cat", "");
    if (cat == "cuda_runtime" || cat == "cuda_driver") calls[e.at("args").at("correlation")] = e;
    if (cat == "kernel" || cat == "gpu_memcpy") work[e.at("args").at("correlation")] = e;
    if (cat == "ac2g") {
      CHECK(e.at("name") == "ac2g");
      (e.at("ph") == "s" ? starts : finishes)[e.at("id")] = e;
    }
  }
  REQUIRE(work.size() == 6);
  CHECK(starts.size() == 6);
  CHECK(finishes.size() == 6);
  for (const auto& [corr, w] : work) {
    INFO("correlation " << corr);
    REQUIRE(starts.count(corr) == 1);
    REQUIRE(finishes.count(corr) == 1);
    const auto& call = calls.at(corr);
    CHECK(starts[corr].at("pid") == call.at("pid"));
    CHECK(starts[corr].at("tid") == call.at("tid"));
    CHECK(starts[corr].at("ts") == call.at("ts"));
    CHECK(finishes[corr].at("pid") == w.at("pid"));
    CHECK(finishes[corr].at("tid") == w.at("tid"));
    CHECK(finishes[corr].at("ts") == w.at("ts"));
    CHECK(finishes[corr].at("bp") == "e");
  }
}

TEST_CASE("On the CPU the traced ATen ops are cpu_op events on their host thread", "[profiler][trace]") {
  TraceData t = synthetic_trace(1);
  t.activities.clear();
  ActivityRecord op;
  op.name = "aten::mm";
  op.start_ns = kT0 + 2 * kMs + kMs / 10;
  op.end_ns = kT0 + 3 * kMs;
  op.external_id = 3;  // the layer's scope
  op.thread = kMainThread;
  t.activities.push_back(op);
  TraceMetadata meta = synthetic_metadata(1);
  meta.host_ops = true;
  meta.devices.clear();
  const auto trace = vlatune::profiler::chrome_trace(t, meta);
  const auto ops = events_of(trace, "cpu_op");
  REQUIRE(ops.size() == 1);
  CHECK(ops[0].at("pid") == 4242);
  CHECK(ops[0].at("tid") == kMainThread);
  CHECK(ops[0].at("args").at("module") == "model.layer");
  CHECK(events_of(trace, "kernel").empty());
  CHECK(events_of(trace, "ac2g").empty());
  CHECK(events_of(trace, "user_annotation").size() == 6);  // ProfilerStep#0 and five scopes
}

TEST_CASE("The written trace spells the rank as HTA looks for it", "[profiler][trace]") {
  TempDir dir;
  const std::string written = vlatune::profiler::write_chrome_trace(
      vlatune::profiler::chrome_trace(synthetic_trace(1), synthetic_metadata(2)), dir.path + "/trace.json");
  const std::string text = slurp(written);
  CHECK(text.find("\"rank\": 0") != std::string::npos);
  CHECK(nlohmann::json::parse(text).at("traceEvents").size() > 10);
}

TEST_CASE("Holistic Trace Analysis opens the trace and runs its temporal and kernel breakdowns",
          "[profiler][trace][readers]") {
  const std::string python = vlatune::test::trace_readers_python();
  if (python.empty()) {
    WARN("no .vlatune/trace-readers-python (scripts/setup.sh makes it): Holistic Trace Analysis not run");
    return;
  }
  TempDir dir;
  const std::string written = vlatune::profiler::write_chrome_trace(
      vlatune::profiler::chrome_trace(synthetic_trace(3), synthetic_metadata(2)), dir.path + "/trace.json.gz");
  std::ofstream(dir.path + "/profile.json") << "{\"schema\": \"vlatune.profile/1\"}\n";  // beside it, as profile writes
  const auto run = vlatune::test::run_reader(python, "analyze_trace_hta.py", written);
  INFO(run.output);
  REQUIRE(run.status == 0);
  const auto j = nlohmann::json::parse(run.output.substr(run.output.rfind("{\"temporal\"")));
  for (const auto& w : j.at("warnings")) {
    CHECK(w.get<std::string>().find("ProfilerStep") == std::string::npos);
    CHECK(w.get<std::string>().find("only one iteration") == std::string::npos);
  }
  // HTA keeps the steps before the last: 0 and 1.
  CHECK(j.at("iterations") == nlohmann::json::array({0, 1}));
  REQUIRE(j.at("temporal").size() == 1);
  const auto& row = j.at("temporal")[0];
  CHECK(row.at("rank") == 0);
  // Steps 0 and 1: two compute kernels of 1 ms each per step, a 0.2 ms copy per step (non-compute).
  CHECK(row.at("compute_time(us)").get<double>() == Approx(4000.0));
  CHECK(row.at("non_compute_time(us)").get<double>() == Approx(400.0));
  CHECK(row.at("kernel_time(us)").get<double>() == Approx(16700.0));  // first copy's start to the last kernel's end
  bool gemm = false;
  for (const auto& k : j.at("kernels")) gemm = gemm || k.value("name", "") == "sm90_xmma_gemm_bf16bf16_bf16f32";
  CHECK(gemm);
  bool memory = false;
  for (const auto& k : j.at("kernel_types")) memory = memory || k.value("kernel_type", "") == "MEMORY";
  CHECK(memory);
}

TEST_CASE("On the GPU the trace links every kernel to the call that launched it, on the scopes' threads",
          "[profiler][trace][.gpu]") {
  TempDir dir;
  const std::vector<std::string> args = {"vlatune",       "profile", "--config",   "tiny", "--device", "cuda",
                                         "--batch",       "2",       "--warmup",   "1",    "--steps",  "2",
                                         "--trace-steps", "2",       "--ab-steps", "0",    "--data",   "synthetic",
                                         "--out",         dir.path};
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int rc = vlatune::cli::run(static_cast<int>(argv.size()), argv.data(), out, err);
  INFO(err.str());
  REQUIRE(rc == 0);
  std::string text;
  FILE* pipe = ::popen(("gzip -dc " + dir.path + "/trace.json.gz").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  ::pclose(pipe);
  const auto trace = nlohmann::json::parse(text);
  REQUIRE(trace.at("deviceProperties").size() == 1);
  CHECK_FALSE(trace.at("deviceProperties")[0].at("name").get<std::string>().empty());
  size_t kernels = 0, with_geometry = 0, steps = 0;
  std::set<int64_t> scope_threads;
  std::vector<int64_t> launch_threads;
  std::map<int64_t, int> flows;  // id -> 1 per 's', 2 per 'f'
  for (const auto& e : trace.at("traceEvents")) {
    const std::string cat = e.value("cat", "");
    if (cat == "kernel") {
      ++kernels;
      CHECK(e.at("tid") == e.at("args").at("stream"));
      if (e.at("args").contains("grid")) ++with_geometry;
    } else if (cat == "user_annotation") {
      if (e.at("name").get<std::string>().rfind("ProfilerStep#", 0) == 0) ++steps;
      scope_threads.insert(e.at("tid").get<int64_t>());
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      launch_threads.push_back(e.at("tid").get<int64_t>());
    } else if (cat == "ac2g") {
      flows[e.at("id").get<int64_t>()] += e.at("ph") == "s" ? 1 : 2;
    }
  }
  CHECK(steps == 2);
  CHECK(kernels > 100);
  CHECK(with_geometry == kernels);
  REQUIRE_FALSE(launch_threads.empty());
  // CUPTI's thread ids are gettid's: the launches sit on the rows of the scopes they were made in.
  size_t on_scope_rows = 0;
  for (int64_t t : launch_threads) on_scope_rows += scope_threads.count(t);
  CHECK(on_scope_rows * 10 >= launch_threads.size() * 9);
  size_t paired = 0;
  for (const auto& [id, seen] : flows) paired += seen == 3 ? 1 : 0;
  CHECK(paired == flows.size());
  CHECK(paired * 10 >= kernels * 9);  // (almost) every kernel has its launch: graphs launch several per call
}
