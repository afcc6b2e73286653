// Data-parallel training through torch's c10d (DESIGN.md "distributed"): an existing engine that already runs
// across nodes, not a home-made transport.
//
//   environment   torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT (also
//                 what `vlatune launch --nproc N` sets), or Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID with
//                 MASTER_ADDR / MASTER_PORT exported by the job script. Neither (or a world of 1): one process.
//   rendezvous    c10d::TCPStore on MASTER_ADDR:MASTER_PORT; rank 0 is the server.
//   process group c10d::ProcessGroupNCCL on CUDA (collectives on NCCL's own stream), ProcessGroupGloo on the CPU
//                 (the CPU tests: two processes on localhost). Built without NCCL/Gloo headers, the backend is
//                 refused with a message saying so.
//   failure       every collective and the rendezvous run under `timeout`. A dead peer ends the others with a
//                 DistributedError naming the operation, the rank and the cause: Gloo notices a closed socket at
//                 once, otherwise the timeout fires; NCCL's watchdog aborts the communicator and the process
//                 (TORCH_NCCL_ASYNC_ERROR_HANDLING=1, set unless the user set it) when a collective passes the
//                 timeout. `vlatune launch` then kills the remaining ranks and names the one that failed first.
//   NVLink multicast is never switched on by vlatune: NCCL_NVLS_ENABLE=0 is exported before NCCL initializes
//   unless the user exported it (a non-zero user value is reported in the log).
//
// Profiler: each group's all-reduce is launched inside profiler::Scope("<comm>:<group>") (grad_buckets.cpp), so
// CUPTI attributes its NCCL kernels to the group; the attribution tables count those scopes as the pseudo-module
// "<comm>". profile.json's `communication` section (formats/profile.h Communication) is filled by `vlatune
// profile` under `vlatune launch --nproc N` (every rank runs the steps, rank 0 writes), from the traced steps at
// the requested batch (profiler/comm_stats.h communication_from_trace):
//   - groups[i].name / bytes: GradBuckets::groups() (name, the bytes all-reduced per step: dense gradients in the
//     reduce dtype, row-sparse ones as their row capacity plus the row mask; grad_buckets.h).
//   - groups[i].allreduce_ms: the median over the traced steps of the NCCL kernel time launched in the group's
//     scope.
//   - allreduce_gbps: bus bandwidth = sum(bytes) x 2 (n-1)/n / sum(allreduce_ms), the same ring formula the tuner
//     inverts (tuner/grouping.h allreduce_ms).
//   - exposed_ms: per step, the time between the end of the last backward compute kernel and the end of the last
//     NCCL kernel (0 when communication finished first), median over steps. With the tracer off the same number
//     is step_ms(world 2) - step_ms(world 1) at equal per-rank batch, which scripts/multi-gpu-check.sh reports.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace vlatune::trainer {

// A collective or the rendezvous failed (peer died, timeout, mismatch). The message names what and why.
class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher;  // "torchrun" (also `vlatune launch`) or "slurm"
};

// The process's place in a multi-process job, from the environment (`getenv` is injectable for tests).
// nullopt: not launched as part of a job, or a job of one process. Malformed values: std::invalid_argument
// naming the variable.
using GetEnv = std::function<const char*(const char*)>;
std::optional<DistEnv> dist_env_from(const GetEnv& getenv);
std::optional<DistEnv> dist_env_from_process();

// The device of this process: the CPU stays the CPU; CUDA becomes cuda:LOCAL_RANK, made current (one process
// per GPU). std::invalid_argument when LOCAL_RANK has no GPU.
c10::Device bind_process_device(c10::Device resolved, const DistEnv& env);

// Exports NCCL_NVLS_ENABLE=0 (unless set) and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (unless set). Returns a warning
// line when the user's own NCCL_NVLS_ENABLE is non-zero, else "".
std::string set_nccl_environment();

// The backstop against a rank that hangs after a peer died: ends the process when no training step finishes
// within `timeout` (the first within 3 x timeout: start-up and first-step work). NCCL's own watchdog notices a
// stuck collective but can then hang in its debug dump (seen on the H200 pair), so the trainer does not rely on it.
// On expiry: `on_expire(message)`; the default prints the message and ends the process with exit code 1 at once.
class StepWatchdog {
 public:
  using Expire = std::function<void(const std::string& message)>;
  StepWatchdog(int rank, int world_size, std::chrono::milliseconds timeout, Expire on_expire = {});
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;
  void step_done();  // a step finished: the clock starts again

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class ProcessGroup {
 public:
  // Rendezvous and process group: NCCL when `device` is CUDA (the caller has made cuda:local_rank current),
  // Gloo when it is the CPU. Throws DistributedError (rendezvous timeout, backend not built).
  static std::shared_ptr<ProcessGroup> create(const DistEnv& env, c10::Device device,
                                              std::chrono::milliseconds timeout);
  ~ProcessGroup();

  int rank() const;
  int size() const;
  const DistEnv& env() const;
  std::string backend_name() const;  // "nccl" | "gloo"
  std::chrono::milliseconds timeout() const;

  // An all-reduce in flight. wait() blocks the host on Gloo; on NCCL it makes the current CUDA stream wait for
  // the collective (host returns at once: no host synchronization, the timeout is NCCL's watchdog's). Failures:
  // DistributedError naming `what`.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  // Sum over ranks, in place, asynchronously. `what` names the operation in errors ("all-reduce of group X").
  std::unique_ptr<Pending> allreduce_sum(at::Tensor& tensor, const std::string& what);
  // The mean over ranks inside the collective (NCCL's ReduceOp::AVG: no separate division pass). Gloo has no AVG:
  // there supports_average() is false and callers sum and divide.
  bool supports_average() const;
  std::unique_ptr<Pending> allreduce_average(at::Tensor& tensor, const std::string& what);
  // The same over several tensors in one coalesced collective (one NCCL group; Gloo flattens them itself), each
  // reduced in place: no caller-side copy into a bucket. The tensors share dtype and device and are contiguous.
  std::unique_ptr<Pending> allreduce_coalesced_sum(std::vector<at::Tensor>& tensors, const std::string& what);
  std::unique_ptr<Pending> allreduce_coalesced_average(std::vector<at::Tensor>& tensors, const std::string& what);
  // Element-wise maximum over ranks, in place, asynchronously (the union of uint8 row masks).
  std::unique_ptr<Pending> allreduce_max(at::Tensor& tensor, const std::string& what);
  // Sharded optimizer state (trainer/shard_layout.h): `input` holds world-size equal parts; `output` (one part)
  // receives this rank's part summed (averaged: NCCL's AVG, only where supports_average()) over ranks. One
  // contiguous tensor each (c10d's _reduce_scatter_base, which Gloo implements as an all-reduce and a copy).
  std::unique_ptr<Pending> reduce_scatter(at::Tensor& output, at::Tensor& input, bool average, const std::string& what);
  // Every rank's `input` (one part) concatenated in rank order into `output` (world-size parts).
  std::unique_ptr<Pending> allgather(at::Tensor& output, at::Tensor& input, const std::string& what);
  // Blocking helpers (the host waits, also on NCCL).
  void allreduce_sum_blocking(at::Tensor& tensor, const std::string& what);
  void broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& what);
  void barrier(const std::string& what);

  struct Impl;

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "distributed: <what> failed on rank R of W (<backend>, timeout T s; a peer may have exited — see its log): <cause>"
std::string describe_dist_failure(const std::string& what, int rank, int world_size, const std::string& backend,
                                  std::chrono::milliseconds timeout, const std::string& cause);

}  // namespace vlatune::trainer
