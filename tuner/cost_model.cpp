#include "tuner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "formats/fqn_pattern.h"
#include "kernels/adamw.h"
#include "layout/pi05.h"

namespace vlatune::tuner {

bool is_pseudo_row(const formats::ModuleCost& m) {
  return m.kind == "pseudo" || (!m.fqn.empty() && m.fqn.front() == '<');
}

std::vector<int> outermost_rows(const formats::BatchProfile& b, const std::vector<int>& rows) {
  std::vector<int> outermost;
  for (int i : rows) {
    const std::string& fqn = b.modules[static_cast<size_t>(i)].fqn;
    const bool nested = std::any_of(rows.begin(), rows.end(), [&](int j) {
      return j != i && formats::fqn_within(fqn, b.modules[static_cast<size_t>(j)].fqn);
    });
    if (!nested) outermost.push_back(i);
  }
  return outermost;
}

std::vector<int> rows_for(const formats::BatchProfile& b, const std::string& alias) {
  std::vector<int> inside;
  for (size_t i = 0; i < b.modules.size(); ++i) {
    if (is_pseudo_row(b.modules[i])) continue;
    if (b.modules[i].fqn == alias) return {static_cast<int>(i)};
    if (formats::fqn_within(b.modules[i].fqn, alias)) inside.push_back(static_cast<int>(i));
  }
  return outermost_rows(b, inside);
}

bool profiled_in_fp8(const formats::Profile& profile, const formats::GemmEntry& gemm) {
  for (const std::string& member : gemm.members)
    for (const std::string& pattern : profile.recipe.fp8.modules)
      if (formats::fqn_matches(pattern, member)) return true;
  return false;
}

LinearFit fit_linear(double b0, double v0, std::optional<double> b1, std::optional<double> v1) {
  LinearFit f;
  if (b1 && v1 && *b1 != b0) {
    f.per_sample = (v0 - *v1) / (b0 - *b1);
    f.fixed = v0 - f.per_sample * b0;
    if (f.per_sample < 0) return {v0, 0, false};
    if (f.fixed >= 0) return f;
  }
  f.fixed = 0;
  f.per_sample = b0 > 0 ? v0 / b0 : 0;
  f.proportional = true;
  return f;
}

double gemm_ms(const formats::GemmEntry& gemm, bool fp8, bool recomputed, double batch_scale) {
  double t = 0;
  if (fp8 && gemm.fp8) {
    const double quant = gemm.quant_ms.value_or(0.0);
    const double total = gemm.fp8->total();
    t = total + quant;
    // The recomputed forward runs the forward GEMM and its share of the casts again.
    if (recomputed) t += gemm.fp8->forward_ms + (total > 0 ? quant * gemm.fp8->forward_ms / total : 0.0);
  } else {
    t = gemm.bf16.total() + (recomputed ? gemm.bf16.forward_ms : 0.0);
  }
  return t * batch_scale;
}

double root_backward_ms(const CostModel& model, const std::string& root, double batch) {
  const auto& batches = model.profile.batches;
  auto sum = [&](const formats::BatchProfile& b, bool& found) {
    double ms = 0;
    const std::vector<int> rows = rows_for(b, root);
    found = !rows.empty();
    for (int r : rows) ms += b.modules[static_cast<size_t>(r)].backward_ms;
    return ms;
  };
  bool found0 = false, found1 = false;
  const double v0 = sum(batches[0], found0);
  std::optional<double> b1, v1;
  if (batches.size() > 1) {
    const double v = sum(batches[1], found1);
    if (found1) {
      b1 = static_cast<double>(batches[1].batch);
      v1 = v;
    }
  }
  return fit_linear(static_cast<double>(batches[0].batch), v0, b1, v1).at(batch);
}

double root_parameter_bytes(const CostModel& model, const std::string& root) {
  const formats::BatchProfile& b = model.profile.batches[0];
  double bytes = 0;
  for (int r : rows_for(b, root)) bytes += static_cast<double>(b.modules[static_cast<size_t>(r)].parameter_bytes);
  return bytes;
}

bool inside_selection(const CostModel& model, const std::vector<int>& selection, const std::string& fqn) {
  for (int i : selection) {
    for (const std::string& alias : model.units[static_cast<size_t>(i)].spec.aliases)
      if (layout::unit_covers(alias, fqn)) return true;
  }
  return false;
}

double gradient_delta_gib(const CostModel& model, int grad_accum, double batch) {
  const double all = model.gradient_gib;
  const double planned = model.trainable.active ? model.trainable.gradient_gib : all;
  const double held =
      std::clamp(model.backward_over_forward_gib ? model.backward_over_forward_gib->at(batch) : 0.0, 0.0, all);
  const bool profiled_accumulates = model.profiled_grad_accum != 1;
  const double profiled_at_peak = profiled_accumulates ? all : held;
  const double planned_at_peak = grad_accum > 1 || profiled_accumulates ? planned : std::min(held, planned);
  return planned_at_peak - profiled_at_peak;
}

RecomputeAtBatch recompute_problem(const CostModel& model, int64_t batch, double budget_gib, RecomputeProblem& problem,
                                   int grad_accum) {
  const double b = static_cast<double>(batch);
  problem = RecomputeProblem{};
  problem.quantum_bytes = int64_t{1} << 20;  // 1 MiB: at most ~0.1 GiB conservative over 100 segments
  const TrainableChange& t = model.trainable;
  for (size_t i = 0; i < model.units.size(); ++i) {
    const UnitModel& u = model.units[i];
    // Freezing: a unit whose backward no longer runs holds nothing (the rows' bytes leave below); one that keeps part
    // of its backward holds the rest.
    const bool gone = t.active && t.unit_no_backward[i];
    const double removed = t.active ? t.unit_act_removed[i].at(b) : 0.0;
    RecomputeItem item;
    item.parent = u.parent;
    item.act_bytes = gone ? 0 : static_cast<int64_t>(std::llround(std::max(0.0, u.act_bytes.at(b) - removed)));
    item.out_bytes = std::min(item.act_bytes, static_cast<int64_t>(std::llround(std::max(0.0, u.out_bytes.at(b)))));
    item.cost_ms = std::max(0.0, u.recompute_ms.at(b));
    item.forced = u.baseline && !u.size_known && !gone;
    problem.items.push_back(item);
  }
  RecomputeAtBatch at;
  at.batch = b;
  const RecomputeEvaluation base = evaluate_recompute(problem, model.baseline_units);
  for (size_t i = 0; i < problem.items.size(); ++i)
    if (t.active && t.unit_no_backward[i]) problem.items[i].allowed = false;  // after the baseline, which may hold it
  at.baseline_act_peak_bytes = static_cast<double>(base.peak_bytes);
  at.other_gib = model.peak_gib.at(b) - at.baseline_act_peak_bytes / kGiB + model.optimizer_delta_gib +
                 gradient_delta_gib(model, grad_accum, b) +
                 (t.active ? t.fixed_gib - std::max(0.0, t.activation_removed_bytes.at(b)) / kGiB : 0.0);
  const double budget_bytes = (budget_gib - at.other_gib) * kGiB;
  problem.budget_bytes = budget_bytes < 0 ? -1 : static_cast<int64_t>(budget_bytes);
  return at;
}

Prediction predict(const CostModel& model, const Candidate& c, int grad_accum, int world_size) {
  const double b = static_cast<double>(c.micro_batch);
  RecomputeProblem problem;
  const RecomputeAtBatch at = recompute_problem(model, c.micro_batch, 0.0, problem, grad_accum);
  Prediction p;
  for (int i : c.recompute) p.recompute_ms += problem.items[static_cast<size_t>(i)].cost_ms;
  for (int i : model.baseline_units) p.recompute_ms -= problem.items[static_cast<size_t>(i)].cost_ms;
  const RecomputeEvaluation e = evaluate_recompute(problem, c.recompute);
  p.peak_gib = at.other_gib + static_cast<double>(e.peak_bytes) / kGiB;

  // FP8: each GEMM at the precision the candidate gives it minus the one the profiled recipe gave it.
  const double scale = b / static_cast<double>(model.profiled_batch);
  std::set<int> chosen(c.fp8.begin(), c.fp8.end());
  for (size_t g = 0; g < model.profile.gemms.size(); ++g) {
    const formats::GemmEntry& gemm = model.profile.gemms[g];
    const bool profiled_fp8 = profiled_in_fp8(model.profile, gemm);
    const bool planned_fp8 = chosen.count(static_cast<int>(g)) > 0;
    if (planned_fp8 == profiled_fp8) continue;
    const bool recomputed = inside_selection(model, c.recompute, gemm.members[0]);
    p.fp8_ms += gemm_ms(gemm, planned_fp8, recomputed, scale) - gemm_ms(gemm, profiled_fp8, recomputed, scale);
  }
  p.comm_ms = c.comm_exposed_ms;
  const TrainableChange& t = model.trainable;
  const double micro_trainable_ms = t.active ? t.micro_ms(b, static_cast<double>(model.profiled_batch)) : 0.0;
  const double optimizer_ms = t.active ? t.optimizer_ms : model.optimizer_ms;
  // The profiled step holds profiled_grad_accum micro-batches and one optimizer update.
  const double micro_ms = (model.step_ms.at(b) + p.recompute_ms + p.fp8_ms + micro_trainable_ms - model.optimizer_ms) /
                          model.profiled_grad_accum;
  p.trainable_ms = grad_accum * micro_trainable_ms / model.profiled_grad_accum + optimizer_ms - model.optimizer_ms;
  p.step_ms = grad_accum * micro_ms + optimizer_ms + p.comm_ms;
  p.samples_per_s = p.step_ms > 0 ? b * grad_accum * world_size / (p.step_ms / 1e3) : 0;
  return p;
}

double adamw_moment_bytes(double numel, double element_bytes, formats::StateDtype state_dtype) {
  if (state_dtype == formats::StateDtype::kAuto) return 2 * numel * element_bytes;
  const double blocks = std::ceil(numel / static_cast<double>(kernels::kAdamwQuantBlock));
  return 2 * (numel + 4 * blocks);
}

TrainingStateBytes training_state_bytes(const std::vector<ParameterShape>& params, const TrainableSelection& selection,
                                        double element_bytes, formats::StateDtype state_dtype) {
  auto numel_of = [](const std::vector<int64_t>& shape) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    return n;
  };
  std::map<std::string, int64_t> adapted;  // Linear FQN -> rank
  for (const auto& [fqn, rank] : selection.lora) adapted.emplace(fqn, rank);
  TrainingStateBytes out;
  std::vector<double> trainable;  // numel per trainable tensor (AdamW's state is per tensor)
  for (const ParameterShape& p : params) {
    const double n = numel_of(p.shape);
    const auto dot = p.name.rfind('.');
    const bool lora_base = dot != std::string::npos && adapted.count(p.name.substr(0, dot)) != 0;
    const bool frozen = lora_base || formats::fqn_within_any(p.name, selection.frozen);
    (frozen ? out.frozen_numel : out.trainable_numel) += n;
    if (!frozen) trainable.push_back(n);
  }
  for (const auto& [fqn, rank] : adapted) {
    auto it = std::find_if(params.begin(), params.end(),
                           [&fqn](const ParameterShape& p) { return p.name == fqn + ".weight"; });
    if (it == params.end() || it->shape.size() != 2)
      throw PlanInputError("LoRA on " + fqn + ": the model has no Linear weight '" + fqn + ".weight' [out, in]");
    const double a = static_cast<double>(rank) * static_cast<double>(it->shape[1]);  // A [rank, in]
    const double b = static_cast<double>(it->shape[0]) * static_cast<double>(rank);  // B [out, rank]
    out.adapter_numel += a + b;
    trainable.push_back(a);
    trainable.push_back(b);
  }
  out.trainable_numel += out.adapter_numel;
  out.parameter_bytes = (out.trainable_numel + out.frozen_numel) * element_bytes;
  out.gradient_bytes = out.trainable_numel * element_bytes;
  for (double n : trainable) out.optimizer_bytes += adamw_moment_bytes(n, element_bytes, state_dtype);
  return out;
}

double plan_optimizer_state(CostModel& model, formats::StateDtype planned, int planned_shards) {
  model.optimizer_delta_gib = 0;
  const formats::Recipe& profiled = model.profile.recipe;
  const int profiled_shards =
      profiled.distributed.shard_optimizer_state ? std::max(1, model.profile.environment.world_size) : 1;
  planned_shards = std::max(1, planned_shards);
  if (planned == profiled.optimizer.state_dtype && planned_shards == profiled_shards) return 0;
  const std::optional<int64_t> parameter_bytes = model.profile.batches[0].memory.parameter_bytes;
  if (!parameter_bytes || *parameter_bytes <= 0)
    throw PlanInputError(std::string("--optimizer-state ") + formats::to_string(planned) + " sharded over " +
                         std::to_string(planned_shards) +
                         " GPU(s): the profile has no parameter bytes (batches[0].memory.parameter_bytes) to size "
                         "the optimizer state from");
  // Parameters are bf16 under precision bf16 and fp32 under fp32-master (the trainer's model dtype on the GPU).
  const double element_bytes = profiled.model_options.precision == formats::Precision::kBf16 ? 2 : 4;
  const double numel = static_cast<double>(*parameter_bytes) / element_bytes;
  // A sharded state: each GPU holds its 1/N (trainer/shard_layout.h; the padding to 256-value blocks is noise).
  model.optimizer_delta_gib =
      (adamw_moment_bytes(numel, element_bytes, planned) / planned_shards -
       adamw_moment_bytes(numel, element_bytes, profiled.optimizer.state_dtype) / profiled_shards) /
      kGiB;
  return model.optimizer_delta_gib;
}

}  // namespace vlatune::tuner
