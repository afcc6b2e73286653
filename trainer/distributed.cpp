#include "trainer/distributed.h"

#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#ifdef VLATUNE_HAVE_GLOO
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#ifdef VLATUNE_HAVE_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace vlatune::trainer {

namespace {

int parse_int(const GetEnv& getenv, const char* name, int min_value) {
  const char* text = getenv(name);
  if (text == nullptr || *text == '\0') throw std::invalid_argument(std::string(name) + " is not set");
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < min_value || value > (1 << 30))
    throw std::invalid_argument(std::string(name) + "=" + text +
                                ": expected an integer >= " + std::to_string(min_value));
  return static_cast<int>(value);
}

bool is_set(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0';
}

// Slurm's SLURM_TASKS_PER_NODE looks like "2(x3),1": the first node's count is enough for a uniform job.
std::optional<int> slurm_tasks_per_node(const GetEnv& getenv) {
  const char* text = getenv("SLURM_NTASKS_PER_NODE");
  if (text == nullptr || *text == '\0') text = getenv("SLURM_TASKS_PER_NODE");
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || value < 1) return std::nullopt;
  return static_cast<int>(value);
}

}  // namespace

std::optional<DistEnv> dist_env_from(const GetEnv& getenv) {
  DistEnv env;
  if (is_set(getenv, "WORLD_SIZE") || is_set(getenv, "RANK")) {
    env.launcher = "torchrun";
    env.world_size = parse_int(getenv, "WORLD_SIZE", 1);
    env.rank = parse_int(getenv, "RANK", 0);
    env.local_rank = is_set(getenv, "LOCAL_RANK") ? parse_int(getenv, "LOCAL_RANK", 0) : env.rank;
    env.local_world_size =
        is_set(getenv, "LOCAL_WORLD_SIZE") ? parse_int(getenv, "LOCAL_WORLD_SIZE", 1) : env.world_size;
  } else if (is_set(getenv, "SLURM_NTASKS") && is_set(getenv, "SLURM_PROCID")) {
    env.launcher = "slurm";
    env.world_size = parse_int(getenv, "SLURM_NTASKS", 1);
    env.rank = parse_int(getenv, "SLURM_PROCID", 0);
    env.local_rank = is_set(getenv, "SLURM_LOCALID") ? parse_int(getenv, "SLURM_LOCALID", 0) : 0;
    env.local_world_size = slurm_tasks_per_node(getenv).value_or(env.world_size);
  } else {
    return std::nullopt;
  }
  if (env.world_size == 1) return std::nullopt;
  const std::string rank_var = env.launcher == "slurm" ? "SLURM_PROCID" : "RANK";
  if (env.rank >= env.world_size)
    throw std::invalid_argument(rank_var + "=" + std::to_string(env.rank) + " is not below the world size " +
                                std::to_string(env.world_size));
  if (env.local_rank >= env.local_world_size) env.local_world_size = env.local_rank + 1;
  if (!is_set(getenv, "MASTER_ADDR")) {
    if (env.launcher == "slurm")
      throw std::invalid_argument(
          "MASTER_ADDR is not set: under Slurm export it in the job script, e.g. "
          "`export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)`");
    throw std::invalid_argument(
        "MASTER_ADDR is not set (RANK/WORLD_SIZE are): launch with torchrun or "
        "`vlatune launch --nproc N -- train ...`");
  }
  env.master_addr = getenv("MASTER_ADDR");
  env.master_port = is_set(getenv, "MASTER_PORT") ? parse_int(getenv, "MASTER_PORT", 1) : 29500;
  if (env.master_port > 65535)
    throw std::invalid_argument("MASTER_PORT=" + std::to_string(env.master_port) + ": not a TCP port");
  return env;
}

std::optional<DistEnv> dist_env_from_process() {
  return dist_env_from([](const char* name) { return std::getenv(name); });
}

c10::Device bind_process_device(c10::Device resolved, const DistEnv& env) {
  if (!resolved.is_cuda()) return resolved;
#ifdef VLATUNE_HAVE_NCCL
  const int count = static_cast<int>(c10::cuda::device_count());
  if (env.local_rank >= count)
    throw std::invalid_argument("LOCAL_RANK=" + std::to_string(env.local_rank) + " but " + std::to_string(count) +
                                " GPU(s) are visible to this process: run one process per GPU");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
#else
  (void)env;
  throw std::invalid_argument("--device cuda with several processes needs NCCL, not built into this vlatune");
#endif
}

std::string set_nccl_environment() {
  std::string warning;
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (nvls == nullptr)
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  else if (std::string(nvls) != "0")
    warning = std::string("NCCL_NVLS_ENABLE=") + nvls +
              " is set in the environment: NVLink multicast may be used (vlatune keeps it at 0 otherwise)";
  // Tear down on a collective error or timeout (the watchdog aborts the communicator and ends the process) rather
  // than leaving a rank hanging in a collective whose peer died.
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", 0);
  // No debug dump on a timeout: it can hang the process it was meant to end (StepWatchdog is the backstop).
  ::setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0", 0);
  return warning;
}

struct StepWatchdog::Impl {
  int rank, world_size;
  std::chrono::milliseconds timeout;
  Expire on_expire;
  std::mutex mutex;
  std::condition_variable wake;
  bool done = false;
  int64_t steps = 0;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  std::thread thread;

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!done) {
      const auto limit = steps == 0 ? 3 * timeout : timeout;
      const auto deadline = last + limit;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::ostringstream os;
        os << "distributed: rank " << rank << " of " << world_size << " finished no training step in "
           << std::chrono::duration<double>(limit).count() << " s (--dist-timeout "
           << std::chrono::duration<double>(timeout).count() << " s" << (steps == 0 ? ", x3 for the first step" : "")
           << ", " << steps << " steps done): another rank probably died or stalled; see its log. Exiting.";
        const std::string message = os.str();
        lock.unlock();
        on_expire(message);
        return;
      }
      wake.wait_until(lock, deadline);
    }
  }
};

StepWatchdog::StepWatchdog(int rank, int world_size, std::chrono::milliseconds timeout, Expire on_expire)
    : impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->world_size = world_size;
  impl_->timeout = timeout;
  impl_->on_expire = on_expire ? std::move(on_expire) : [](const std::string& message) {
    std::cerr << message << std::endl;
    std::_Exit(1);  // now: a collective may hold locks that a normal exit would wait on
  };
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->done = true;
  }
  impl_->wake.notify_all();
  impl_->thread.join();
}

void StepWatchdog::step_done() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ++impl_->steps;
    impl_->last = std::chrono::steady_clock::now();
  }
  impl_->wake.notify_all();
}

std::string describe_dist_failure(const std::string& what, int rank, int world_size, const std::string& backend,
                                  std::chrono::milliseconds timeout, const std::string& cause) {
  std::ostringstream os;
  os << "distributed: " << what << " failed on rank " << rank << " of " << world_size << " (" << backend << ", timeout "
     << timeout.count() / 1000.0 << " s; another rank probably exited or stalled: see its log): ";
  // c10 errors carry a multi-line C++ backtrace after the first line; the first line says what happened.
  const size_t newline = cause.find('\n');
  os << (newline == std::string::npos ? cause : cause.substr(0, newline));
  return os.str();
}

struct ProcessGroup::Impl {
  DistEnv env;
  std::string backend;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;

  [[noreturn]] void fail(const std::string& what, const std::string& cause) const {
    throw DistributedError(describe_dist_failure(what, env.rank, env.world_size, backend, timeout, cause));
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const {
    try {
      // NCCL: without a timeout, wait() makes the current stream wait and returns (given one, torch's WorkNCCL
      // blocks the host until the collective completes); NCCL's watchdog enforces the timeout. Gloo: the host
      // waits, up to the timeout.
      const bool done = backend == "nccl" ? work->wait() : work->wait(timeout);
      if (!done) fail(what, "timed out");
    } catch (const DistributedError&) {
      throw;
    } catch (const std::exception& e) {
      fail(what, e.what());
    }
  }

  void host_sync() const {
#ifdef VLATUNE_HAVE_NCCL
    if (backend == "nccl") c10::cuda::getCurrentCUDAStream().synchronize();
#endif
  }
};

namespace {

class PendingWork final : public ProcessGroup::Pending {
 public:
  PendingWork(const ProcessGroup::Impl* impl, c10::intrusive_ptr<c10d::Work> work, std::string what)
      : impl_(impl), work_(std::move(work)), what_(std::move(what)) {}
  void wait() override {
    if (work_) impl_->wait(work_, what_);
    work_.reset();
  }

 private:
  const ProcessGroup::Impl* impl_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
};

}  // namespace

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() {
  if (impl_ && impl_->pg) {
    try {
      impl_->pg->shutdown();
    } catch (...) {
      // Shutting down after a failure: the error that matters was already reported.
    }
  }
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(const DistEnv& env, c10::Device device,
                                                   std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->timeout = timeout;
  impl->backend = device.is_cuda() ? "nccl" : "gloo";
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);

  // 1. Rendezvous: rank 0 serves the store and waits (up to the timeout) for the other ranks to connect.
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.isServer = env.rank == 0;
    options.numWorkers = static_cast<std::size_t>(env.world_size);
    options.waitWorkers = true;
    options.timeout = timeout;
    impl->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    impl->fail("rendezvous at " + where, e.what());
  }

  // 2. The process group.
  try {
    if (device.is_cuda()) {
#ifdef VLATUNE_HAVE_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl->store, env.rank, env.world_size, options);
      if (device.has_index()) nccl->setBoundDeviceId(device);
      impl->pg = nccl;
#else
      throw DistributedError("distributed: NCCL is not built into this vlatune (configured without CUDA)");
#endif
    } else {
#ifdef VLATUNE_HAVE_GLOO
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      const std::string& addr = env.master_addr;
      const bool loopback = addr == "localhost" || addr.rfind("127.", 0) == 0;
      if (loopback)
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      else if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0')
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else
        options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      options->threads = 2;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, env.rank, env.world_size, options);
#else
      throw DistributedError(
          "distributed: the CPU (Gloo) process group is not built into this vlatune (configure with Gloo's "
          "headers, Debian libgloo-dev, to get it); multi-process training needs --device cuda here");
#endif
    }
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    impl->fail("creating the " + impl->backend + " process group (rendezvous at " + where + ")", e.what());
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

int ProcessGroup::rank() const {
  return impl_->env.rank;
}
int ProcessGroup::size() const {
  return impl_->env.world_size;
}
const DistEnv& ProcessGroup::env() const {
  return impl_->env;
}
std::string ProcessGroup::backend_name() const {
  return impl_->backend;
}
std::chrono::milliseconds ProcessGroup::timeout() const {
  return impl_->timeout;
}

namespace {

std::unique_ptr<ProcessGroup::Pending> allreduce_op(ProcessGroup::Impl* impl, at::Tensor& tensor,
                                                    c10d::ReduceOp::RedOpType op, const std::string& what);
std::unique_ptr<ProcessGroup::Pending> allreduce_coalesced_op(ProcessGroup::Impl* impl,
                                                              std::vector<at::Tensor>& tensors,
                                                              c10d::ReduceOp::RedOpType op, const std::string& what);

}  // namespace

std::unique_ptr<ProcessGroup::Pending> ProcessGroup::allreduce_sum(at::Tensor& tensor, const std::string& what) {
  return allreduce_op(impl_.get(), tensor, c10d::ReduceOp::SUM, what);
}

bool ProcessGroup::supports_average() const {
  return impl_->backend == "nccl";
}

std::unique_ptr<ProcessGroup::Pending> ProcessGroup::allreduce_average(at::Tensor& tensor, const std::string& what) {
  if (!supports_average())
    throw std::logic_error("ProcessGroup::allreduce_average: the " + impl_->backend + " backend has no AVG");
  return allreduce_op(impl_.get(), tensor, c10d::ReduceOp::AVG, what);
}

std::unique_ptr<ProcessGroup::Pending> ProcessGroup::allreduce_coalesced_sum(std::vector<at::Tensor>& tensors,
                                                                             const std::string& what) {
  return allreduce_coalesced_op(impl_.get(), tensors, c10d::ReduceOp::SUM, what);
}

std::unique_ptr<ProcessGroup::Pending> ProcessGroup::allreduce_coalesced_average(std::vector<at::Tensor>& tensors,
                                                                                 const std::string& what) {
  if (!supports_average())
    throw std::logic_error("ProcessGroup::allreduce_coalesced_average: the " + impl_->backend + " backend has no AVG");
  return allreduce_coalesced_op(impl_.get(), tensors, c10d::ReduceOp::AVG, what);
}

std::unique_ptr<ProcessGroup::Pending> ProcessGroup::allreduce_max(at::Tensor& tensor, const std::string& what) {
  return allreduce_op(impl_.get(), tensor, c10d::ReduceOp::MAX, what);
}

std::unique_ptr<ProcessGroup::Pending> ProcessGroup::reduce_scatter(at::Tensor& output, at::Tensor& input, bool average,
                                                                    const std::string& what) {
  if (average && !supports_average())
    throw std::logic_error("ProcessGroup::reduce_scatter: the " + impl_->backend + " backend has no AVG");
  c10::intrusive_ptr<c10d::Work> work;
  try {
    c10d::ReduceScatterOptions options;
    options.reduceOp = average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    work = impl_->pg->_reduce_scatter_base(output, input, options);
  } catch (const std::exception& e) {
    impl_->fail(what, e.what());
  }
  return std::make_unique<PendingWork>(impl_.get(), std::move(work), what);
}

std::unique_ptr<ProcessGroup::Pending> ProcessGroup::allgather(at::Tensor& output, at::Tensor& input,
                                                               const std::string& what) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = impl_->pg->_allgather_base(output, input, c10d::AllgatherOptions());
  } catch (const std::exception& e) {
    impl_->fail(what, e.what());
  }
  return std::make_unique<PendingWork>(impl_.get(), std::move(work), what);
}

namespace {

std::unique_ptr<ProcessGroup::Pending> allreduce_coalesced_op(ProcessGroup::Impl* impl,
                                                              std::vector<at::Tensor>& tensors,
                                                              c10d::ReduceOp::RedOpType op, const std::string& what) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    c10d::AllreduceCoalescedOptions options;
    options.reduceOp = op;
    work = impl->pg->allreduce_coalesced(tensors, options);
  } catch (const std::exception& e) {
    impl->fail(what, e.what());
  }
  return std::make_unique<PendingWork>(impl, std::move(work), what);
}

std::unique_ptr<ProcessGroup::Pending> allreduce_op(ProcessGroup::Impl* impl, at::Tensor& tensor,
                                                    c10d::ReduceOp::RedOpType op, const std::string& what) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    work = impl->pg->allreduce(tensors, options);
  } catch (const std::exception& e) {
    impl->fail(what, e.what());
  }
  return std::make_unique<PendingWork>(impl, std::move(work), what);
}

}  // namespace

void ProcessGroup::allreduce_sum_blocking(at::Tensor& tensor, const std::string& what) {
  allreduce_sum(tensor, what)->wait();
  impl_->host_sync();
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& what) {
  for (at::Tensor& t : tensors) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      std::vector<at::Tensor> one{t};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      work = impl_->pg->broadcast(one, options);
    } catch (const std::exception& e) {
      impl_->fail(what, e.what());
    }
    impl_->wait(work, what);
  }
  impl_->host_sync();
}

void ProcessGroup::barrier(const std::string& what) {
  // An all-reduce of one element: the same path as the gradients (and no device guessing in NCCL's barrier).
  at::Tensor one =
      at::ones({1}, at::TensorOptions()
                        .dtype(at::kFloat)
                        .device(impl_->backend == "nccl" ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU)));
  allreduce_sum_blocking(one, what);
}

}  // namespace vlatune::trainer
