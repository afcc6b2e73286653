// The profiling session: drives the caller's training step (a callback, so the profiler never depends on the
// trainer) under the tracer and the scope recorder, and assembles profile.json:
//   1. per batch size (requested, then a smaller one): untimed warm-up, timed untraced steps (step_ms, peak, and
//      data_wait_ms from what run_step reports), then traced steps -> per-module and per-kernel tables,
//      attribution coverage, memory by phase;
//   2. at the requested batch: the recompute A/B table (each candidate class added to, or removed from, the
//      profiled recipe's selection), output bytes of every recomputable unit (forward-only probes with the units
//      checkpointed), the GEMM inventory timed in bf16 and FP8, and the tracer overhead;
//   3. trace.json.gz of the first traced steps.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "formats/profile.h"
#include "model/pi05.h"
#include "profiler/comm_stats.h"

namespace vlatune::profiler {

struct StepDriver {
  // One full training step (forward, backward, optimizer) on the data of `step`; returns after the device is
  // synchronized. Must open the pseudo-module scopes "<data>" and "<optimizer>" (the model opens "<loss>").
  // Returns the step's data wait: ms the step blocked waiting for its batch (summed over micro-batches, >= 0; what
  // metrics.jsonl's data_wait_ms holds), so profile.json can tell an input-bound step from a slow model.
  std::function<double(int64_t step)> run_step;
  // Optional: steps [first, first + n) as the trainer runs them (each queued before the previous one is read),
  // each step's {ms, data wait ms}. Set: the timed untraced steps and the recompute A/B rows are timed by it
  // (step_ms is then the trainer's step), and the tracer overhead compares traced steps with as many untraced
  // run_step calls (both read step by step). Unset: run_step timed by the host clock for all of them.
  std::function<std::vector<std::pair<double, double>>(int64_t first, int64_t n)> run_timed_steps;
  // The forward of `step` with autograd on, result dropped (memory probes).
  std::function<void(int64_t step)> forward_only;
  // Switches the micro-batch (data source, ...).
  std::function<void(int64_t batch)> set_batch;
  // Bytes of optimizer state (after at least one step).
  std::function<int64_t()> optimizer_state_bytes;
};

struct ProfileOptions {
  std::vector<int64_t> batches;  // [requested, smaller...]; the session skips sizes that do not fit (degraded)
  int64_t warmup = 2;            // untimed steps per batch size (and per A/B variant)
  int64_t timed_steps = 5;       // untraced timed steps per batch size (step_ms, overhead baseline)
  int64_t steps = 3;             // traced steps per batch size
  int64_t trace_steps = 1;       // traced steps written to trace.json.gz (0: no trace file)
  int64_t ab_steps = 3;          // timed steps per recompute A/B variant (0: no A/B table)
  std::vector<std::pair<std::string, std::vector<std::string>>> extra_candidates;  // user classes (resolved FQNs)
  int gemm_repetitions = 10;    // per GEMM timing (0: no GEMM timing; shapes are still listed)
  std::string tracer = "auto";  // auto (CUPTI on CUDA, CPU tracer on CPU) | cupti | cpu | none
  std::string out_dir;          // profile.json and trace.json.gz go here
  std::string data_label = "synthetic";
  formats::Recipe recipe;  // the recipe profiled (recorded in profile.json)
  formats::Environment environment;
  // Data-parallel (every rank runs the session; only rank 0 sets out_dir): with world_size >= 2 and a tracer, the
  // traced steps at batches[0] fill profile.json's communication section (comm_stats.h). comm_groups: the
  // gradient groups in launch order (GradBuckets::groups(): name, bytes).
  int world_size = 1;
  std::vector<CommGroupInfo> comm_groups;
  // The steps are inference calls (`vlatune profile --inference`: one sampled action chunk each): no gradients,
  // so memory.gradient_bytes is 0.
  bool inference = false;
};

// Runs the whole session and writes out_dir/profile.json (and the trace). Progress lines go to `log`.
formats::Profile run_profile(model::Pi05Impl& model, const StepDriver& driver, const ProfileOptions& options,
                             std::ostream& log);

}  // namespace vlatune::profiler
