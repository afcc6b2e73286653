// Steps of `vlatune plan` (plan_steps.h) that need no cost model: the GPU planned for and its memory budget (1),
// and the global batch the plan keeps.
#include <algorithm>

#include "formats/numbers.h"
#include "tuner/plan_steps.h"

namespace vlatune::tuner {

namespace {

using formats::fixed;

std::string gib_of_gb(double bytes) {
  return fixed(bytes / 1e9, 0) + " GB (the vendor's figure: " + fixed(bytes / kGiB, 2) + " GiB)";
}

}  // namespace

TargetStep target_step(const formats::Profile& profile, const PlanOptions& o) {
  const formats::ProfileSettings& settings = profile.settings;
  const std::string profiled_gpu = profile.environment.gpu.value_or(settings.device == "cpu" ? "the CPU" : "the GPU");
  TargetStep out;
  if (o.gpu) out.gpu = find_gpu(*o.gpu);
  std::string capability_source;
  if (out.gpu) {
    out.capability = out.gpu->capability;
    capability_source = out.gpu->name + "'s";
  } else if (settings.compute_capability) {
    out.capability = settings.compute_capability;
    capability_source = "the profile's (settings.compute_capability)";
  } else if (settings.device == "cuda" && profile.environment.gpu) {
    out.capability = capability_from_device_name(*profile.environment.gpu);
    capability_source = "the profiled GPU's, by its name";
  }
  if (out.capability && !has_fp8(*out.capability))
    out.fp8_unavailable = (out.gpu ? out.gpu->name : profiled_gpu) + " has compute capability " +
                          out.capability->to_string() + " (" + capability_source + "); FP8 GEMMs need " +
                          kFp8Capability.to_string() + " or newer";

  if (o.memory_budget_gib) {
    // The budget is the memory the caching allocator may hold (`vlatune train --max-memory` caps exactly that), and
    // it holds freed blocks for reuse beside the live tensors the peak counts: 0.4-1.2 GiB at 22-40 GiB on the H200.
    out.budget_gib = *o.memory_budget_gib * kDefaultBudgetFraction;
    out.why.push_back({"memory budget " + fixed(out.budget_gib, 1) + " GiB",
                       "--memory-budget " + fixed(*o.memory_budget_gib, 1) +
                           " GiB minus 5% for the allocator's cached blocks, which a cap of that size counts",
                       {{"budget_gib", out.budget_gib}, {"memory_budget_gib", *o.memory_budget_gib}}});
  } else if (out.gpu) {
    const double gpu_gib = out.gpu->memory_bytes / kGiB;
    out.budget_gib = gpu_gib * kDefaultBudgetFraction;
    out.why.push_back({"memory budget " + fixed(out.budget_gib, 1) + " GiB",
                       "--gpu " + out.gpu->name + ": " + gib_of_gb(out.gpu->memory_bytes) +
                           " minus 5% (allocator fragmentation, CUDA context); --memory-budget overrides",
                       {{"budget_gib", out.budget_gib}, {"gpu_memory_gib", gpu_gib}}});
  } else if (settings.gpu_memory_gib) {
    out.budget_gib = *settings.gpu_memory_gib * kDefaultBudgetFraction;
    out.why.push_back({"memory budget " + fixed(out.budget_gib, 1) + " GiB",
                       "the profiled GPU's " + fixed(*settings.gpu_memory_gib, 1) +
                           " GiB minus 5% (allocator fragmentation, CUDA context); --memory-budget overrides",
                       {{"budget_gib", out.budget_gib}, {"gpu_memory_gib", *settings.gpu_memory_gib}}});
  } else if (settings.device == "cpu" && o.host_memory_gib) {
    out.budget_gib = *o.host_memory_gib * kDefaultBudgetFraction;
    out.why.push_back({"memory budget " + fixed(out.budget_gib, 1) + " GiB",
                       "a CPU profile records no device memory: this machine's " + fixed(*o.host_memory_gib, 1) +
                           " GiB of main memory minus 5%; --memory-budget overrides",
                       {{"budget_gib", out.budget_gib}, {"host_memory_gib", *o.host_memory_gib}}});
  } else {
    throw PlanInputError(
        "--memory-budget: the profile does not record the GPU's memory (settings.gpu_memory_gib is "
        "null); pass the budget in GiB, or --gpu NAME");
  }
  if (out.gpu) {
    out.timed_on = profiled_gpu;
    out.why.push_back(
        {"target GPU " + out.gpu->name + " (profiled on " + profiled_gpu + ")",
         "memory transfers: the predicted peak counts bytes (parameters, gradients, optimizer state, activations), "
         "the same on any GPU running the same build (kernel workspaces aside). Time does not: the predicted step "
         "time and samples/s are " +
             profiled_gpu + "'s; profile on the " + out.gpu->name + " for its own",
         {{"gpu_memory_gib", out.gpu->memory_bytes / kGiB},
          {"compute_capability", out.gpu->capability.major + 0.1 * out.gpu->capability.minor}}});
  }
  return out;
}

GlobalBatch stated_global_batch(const formats::Profile& profile, const PlanOptions& o, bool strict) {
  GlobalBatch g;
  if (o.global_batch) {
    g.samples = *o.global_batch;
    g.source = "--global-batch " + std::to_string(g.samples);
  } else {
    const formats::Recipe::Batch& b = profile.recipe.batch;
    const int processes = std::max(1, profile.environment.world_size);
    g.samples = static_cast<int64_t>(b.micro_batch) * b.grad_accum * processes;
    g.source = "the profiled recipe's global batch " + std::to_string(g.samples) + " (micro-batch " +
               std::to_string(b.micro_batch) + " x grad_accum " + std::to_string(b.grad_accum) + " x " +
               std::to_string(processes) + " process" + (processes > 1 ? "es" : "") + ")";
  }
  if (!strict) return g;
  const std::string hint = o.global_batch ? "" : "; state another with --global-batch N";
  if (g.samples % o.world_size != 0)
    throw PlanInputError("--world-size " + std::to_string(o.world_size) + " does not divide " + g.source + hint +
                         ", or --allow global-batch");
  const int64_t per_gpu = g.samples / o.world_size;
  if (o.batch && per_gpu % *o.batch != 0)
    throw PlanInputError("--batch " + std::to_string(*o.batch) + " does not divide " + g.source +
                         (o.world_size > 1 ? " / --world-size " + std::to_string(o.world_size) + " = " +
                                                 std::to_string(per_gpu) + " samples per GPU"
                                           : "") +
                         ": the micro-batch must divide it (grad_accum = " + std::to_string(per_gpu) +
                         " / micro-batch)" + hint + ", or --allow global-batch");
  return g;
}

}  // namespace vlatune::tuner
