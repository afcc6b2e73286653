// `vlatune profile`: real training steps under the CUPTI tracer (CPU tracer on the CPU) -> DIR/profile.json and
// DIR/trace.json.gz. Wiring only: the trainer builds the step, the profiler drives it through StepDriver.
#include <CLI/CLI.hpp>

#include <chrono>
#include <memory>
#include <optional>

#include "cli/cli.h"
#include "cli/policy_options.h"
#include "cli/torch_options.h"
#include "cli/validators.h"
#include "formats/fqn_pattern.h"
#include "formats/json_error.h"
#include "formats/recipe.h"
#include "model/sample.h"
#include "profiler/session.h"
#include "trainer/distributed.h"
#include "trainer/environment.h"
#include "trainer/file_util.h"
#include "trainer/train_step.h"

namespace vlatune::cli {

struct ProfileOptions {
  std::string config;  // empty: full on a GPU, tiny on the CPU
  std::string data;    // required: a dataset directory or "synthetic"
  std::string device = "auto";
  int batch = 32;
  int second_batch = 0;  // 0: batch / 2 (none when batch is 1)
  int steps = 3;
  int warmup = 2;
  int timed_steps = 5;
  int trace_steps = 1;
  int ab_steps = 3;
  int gemm_reps = 10;
  std::string tracer = "auto";
  std::vector<std::string> candidates;
  std::string recipe;
  std::string out;
  uint64_t seed = 42;
  std::string dist_buckets = "groups";
  double dist_timeout_s = 600;
  // --inference: sampled action chunks at batch 1 instead of training steps.
  bool inference = false;
  bool batch_given = false;
  std::string weights;
  std::string dtype = "auto";
  int64_t sample_steps = 10;
  int64_t cameras = 2;
  int64_t text_len = 200;
  int64_t prompt_len = 20;
  int64_t horizon = 10;
};

static int profile(const ProfileOptions& o, std::ostream& log);
static int profile_inference(const ProfileOptions& o, std::ostream& log);

// Bad input anywhere (a recipe, a pattern, an option the trainer rejects) exits 4 with its message.
static int run_profile(const ProfileOptions& o, std::ostream& log) {
  try {
    return o.inference ? profile_inference(o, log) : profile(o, log);
  } catch (const trainer::TrainInputError& e) {
    throw BadInput(e.what());
  } catch (const formats::FormatError& e) {
    throw BadInput(e.what());
  }
}

// Under `vlatune launch --nproc N` (or torchrun/Slurm): every rank runs the same session (its steps all-reduce
// gradients, so all ranks must run them), rank 0 alone logs and writes profile.json with the communication
// section; the GEMM timing (no collectives) runs on rank 0 only.
static int profile(const ProfileOptions& o, std::ostream& caller_log) {
  const std::optional<trainer::DistEnv> env = trainer::job_environment();
  const bool writer = !env || env->rank == 0;
  std::ostream null_log(nullptr);  // ranks other than 0: output discarded (errors still end the process)
  std::ostream& log = writer ? caller_log : null_log;
  if (o.data.empty())
    throw BadInput(
        "--data is required: a dataset directory (vlatune data synth|import), or --data synthetic for batches "
        "generated on the device");
  std::shared_ptr<trainer::ProcessGroup> dist =
      env ? trainer::join_job(*env, o.device, o.dist_timeout_s, log) : nullptr;
  trainer::TrainOptions topt;
  topt.config = o.config;
  topt.data = o.data;
  topt.device = o.device;
  topt.batch = o.batch;  // the profiled recipe is what ran
  topt.seed = o.seed;
  topt.recipe_path = o.recipe;
  topt.dist_buckets = o.dist_buckets;
  topt.dist_timeout_s = o.dist_timeout_s;
  formats::Recipe recipe;
  if (!o.recipe.empty()) recipe = formats::read_recipe(o.recipe);
  const std::string label = o.recipe.empty() ? std::string("<default recipe>") : o.recipe;

  trainer::TrainingParts parts =
      trainer::build_training_parts(topt, recipe, label, /*load_init_weights=*/true, log, dist);
  const bool cuda = parts.device.is_cuda();
  if (parts.step_graph) {
    // Attribution needs the kernels launched from their modules: replays would hide them.
    parts.step_graph.reset();
    log << "profile: the recipe's model_options.cuda_graph \"step\" is for `vlatune train`; profiled steps run "
           "eagerly\n";
  }

  profiler::ProfileOptions popt;
  popt.batches.push_back(o.batch);
  const int second = o.second_batch > 0 ? o.second_batch : o.batch / 2;
  if (second >= o.batch)
    throw BadInput("--second-batch " + std::to_string(second) + " must be below --batch " + std::to_string(o.batch));
  if (second >= 1) popt.batches.push_back(second);
  popt.warmup = o.warmup;
  popt.timed_steps = o.timed_steps;
  popt.steps = o.steps;
  popt.trace_steps = o.trace_steps;
  popt.ab_steps = o.ab_steps;
  popt.gemm_repetitions = writer ? o.gemm_reps : 0;
  popt.tracer = o.tracer;
  popt.out_dir = writer ? o.out : std::string();
  popt.data_label = o.data;
  popt.recipe = parts.applied.effective;
  popt.environment = trainer::capture_environment(
      parts.device, parts.config_name, formats::recipe_hash(parts.applied.effective), dist ? dist->size() : 1);
  if (dist) {
    popt.world_size = dist->size();
    for (const auto& g : parts.buckets->groups()) popt.comm_groups.push_back({g.name, g.bytes});
  }
  const std::vector<std::string> recomputable = parts.net->recomputable_fqns();
  for (size_t i = 0; i < o.candidates.size(); ++i) {
    // The user's pattern must name recomputable units (the trainer can recompute nothing else).
    popt.extra_candidates.emplace_back(
        o.candidates[i], formats::resolve_patterns({o.candidates[i]}, recomputable, "--recompute-candidate",
                                                   "[" + std::to_string(i) + "]"));
  }

  profiler::StepDriver driver;
  driver.run_step = [&](int64_t step) {
    const trainer::StepOutcome outcome = trainer::run_train_step(parts, step, topt.lr, topt.clip_norm);
    if (cuda) torch::cuda::synchronize();
    return outcome.wait_ms;  // the data source's wait, as `vlatune train` logs it (~0 for synthetic data)
  };
  if (!dist) {
    // The trainer's own step timing (queued before the previous step is read), so plans predict `vlatune train`.
    driver.run_timed_steps = [&](int64_t first, int64_t n) {
      std::vector<std::pair<double, double>> out;
      for (const trainer::TimedStep& t : trainer::run_timed_steps(parts, first, n, topt.lr, topt.clip_norm))
        out.emplace_back(t.ms, t.wait_ms);
      return out;
    };
  }
  driver.forward_only = [&](int64_t step) {
    double wait = 0;
    auto batch = parts.source->next(step, &wait);
    parts.net->forward(batch, parts.applied.forward);
    if (cuda) torch::cuda::synchronize();
  };
  driver.set_batch = [&](int64_t batch) {
    if (batch != parts.batch) trainer::open_training_data(parts, topt, batch);
  };
  driver.optimizer_state_bytes = [&] { return parts.optimizer->state_bytes(); };  // this rank's, when sharded
  if (writer) trainer::make_directories(o.out);
  log << "vlatune profile: " << parts.config_name << " Pi0.5 on " << parts.device << ", " << parts.source->describe()
      << ", batches";
  for (auto b : popt.batches) log << " " << b;
  log << ", recompute " << parts.applied.recompute.size() << " module(s)";
  if (dist)
    log << ", " << dist->size() << " processes (" << dist->backend_name() << "), gradients in "
        << parts.buckets->groups().size() << " bucket(s)"
        << (o.dist_buckets == "one" ? ", one all-reduce after backward" : ", all-reduced per group during backward");
  log << std::endl;
  profiler::run_profile(*parts.net, driver, popt, log);
  // The last step's row-sparse gradients fitted their capacity (set for --batch, the largest profiled batch).
  if (dist) parts.buckets->check_row_bounds();
  if (dist) dist->barrier("end-of-profile barrier");  // rank 0 times GEMMs alone; the others wait for it
  return kExitOk;
}

// --inference: one "step" is one action chunk (model::Sampler: the prefix pass into the K/V cache, then the Euler
// steps of the suffix) at batch 1 on a random LIBERO-shaped observation, eagerly (attribution needs the kernels
// launched from their modules; a replayed CUDA graph would hide them), through the same session and attribution.
static int profile_inference(const ProfileOptions& o, std::ostream& log) {
  if (o.batch_given) throw BadInput("--batch: an --inference profile samples one chunk at a time (batch 1)");
  if (!o.recipe.empty() || !o.candidates.empty())
    throw BadInput("--recipe and --recompute-candidate apply to training profiles, not --inference");
  if (o.prompt_len > o.text_len)
    throw BadInput("--prompt-len " + std::to_string(o.prompt_len) + " exceeds --text-len " +
                   std::to_string(o.text_len));
  const torch::Device device = parse_device("--device", o.device);
  const std::string config = policy_config_name(o.config, device);
  const auto cfg = model::Pi05Config::named(config);
  const torch::Dtype dtype =
      o.dtype == "auto" ? (device.is_cuda() ? torch::kBFloat16 : torch::kFloat32) : parse_dtype("--dtype", o.dtype);
  model::Pi05 net = load_policy_model(cfg, o.weights, o.seed, device, dtype);
  torch::Generator gen = at::detail::createCPUGenerator(o.seed);
  model::Pi05Batch batch = model::make_random_batch(cfg, 1, /*slots=*/3, o.cameras, o.text_len, o.prompt_len,
                                                    o.prompt_len, o.horizon, &gen, torch::kCPU);
  for (torch::Tensor* t : model::batch_tensors(batch)) *t = t->to(device);
  model::SampleOptions so;
  so.num_steps = o.sample_steps;
  model::Sampler sampler(*net, so);

  profiler::StepDriver driver;
  driver.run_step = [&](int64_t) {
    sampler.sample(batch, batch.noise);
    if (device.is_cuda()) torch::cuda::synchronize();
    return 0.0;
  };
  driver.set_batch = [](int64_t) {};
  profiler::ProfileOptions popt;
  popt.batches = {1};
  popt.warmup = o.warmup;
  popt.timed_steps = o.timed_steps;
  popt.steps = o.steps;
  popt.trace_steps = o.trace_steps;
  popt.ab_steps = 0;
  popt.gemm_repetitions = o.gemm_reps;
  popt.tracer = o.tracer;
  popt.out_dir = o.out;
  popt.inference = true;
  popt.data_label = "inference: one action chunk per step (batch 1, " + std::to_string(o.cameras) + " cameras, " +
                    std::to_string(o.prompt_len) + " prompt tokens padded to " + std::to_string(o.text_len) +
                    ", horizon " + std::to_string(o.horizon) + ", " + std::to_string(o.sample_steps) + " Euler steps)";
  formats::Recipe recipe;
  recipe.batch.micro_batch = 1;
  popt.recipe = recipe;
  popt.environment = trainer::capture_environment(device, config, formats::recipe_hash(recipe), 1);
  trainer::make_directories(o.out);
  log << "vlatune profile --inference: " << config << " Pi0.5 on " << device << " (" << c10::toString(dtype) << "), "
      << popt.data_label << std::endl;
  profiler::run_profile(*net, driver, popt, log);
  return kExitOk;
}

void setup_profile(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<ProfileOptions>();
  auto* cmd = app.add_subcommand("profile",
                                 "Profile training steps: per-module GPU time, memory, recompute "
                                 "cost and bf16/FP8 GEMM times -> DIR/profile.json");
  cmd->option_defaults()->always_capture_default();  // --help shows the default of every flag
  cmd->add_option("--config", opts->config, "Model size")
      ->check(CLI::IsMember({"tiny", "full"}))
      ->default_str("full on a GPU, tiny on the CPU");
  cmd->add_option("--data", opts->data,
                  "Dataset directory (vlatune data synth|import), or 'synthetic' (batches generated on the device)")
      ->default_str("required");
  cmd->add_option("--device", opts->device, "auto: the GPU when visible")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--batch", opts->batch, "Micro-batch size")
      ->check(CLI::Range(1, 1 << 20))
      ->each([opts](const std::string&) { opts->batch_given = true; });
  cmd->add_option("--second-batch", opts->second_batch, "Smaller micro-batch also profiled, for extrapolation")
      ->check(CLI::Range(1, 1 << 20))
      ->default_str("--batch / 2");
  cmd->add_option("--steps", opts->steps, "Traced steps per batch size")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--warmup", opts->warmup, "Warm-up steps before timing")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--timed-steps", opts->timed_steps, "Untraced timed steps (step time, tracer overhead)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--trace-steps", opts->trace_steps, "Traced steps kept in trace.json.gz (0: no trace)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--ab-steps", opts->ab_steps, "Timed steps per recompute A/B variant (0: skip the A/B table)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--recompute-candidate", opts->candidates,
                  "Extra recompute candidate (FQN pattern, '*' = one segment) measured A/B; repeatable");
  cmd->add_option("--gemm-reps", opts->gemm_reps, "Repetitions per GEMM timing (0: list shapes only)")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--tracer", opts->tracer, "auto | cupti | cpu | none")
      ->check(CLI::IsMember({"auto", "cupti", "cpu", "none"}));
  cmd->add_option("--recipe", opts->recipe, "recipe.json to profile under (--batch overrides its micro_batch)")
      ->check(regular_file())
      ->default_str("the default recipe");
  cmd->add_option("--seed", opts->seed, "Seed of the weights and the synthetic data")->check(unsigned_integer());
  cmd->add_option("--out", opts->out, "Output directory")->required()->default_str("required");
  // Data-parallel (under `vlatune launch --nproc N`): profile.json gets the communication section.
  cmd->add_option("--dist-buckets", opts->dist_buckets,
                  "groups: all-reduce each recipe group as its backward ends; one: one bucket after backward")
      ->check(CLI::IsMember({"groups", "one"}));
  cmd->add_option("--dist-timeout", opts->dist_timeout_s,
                  "Seconds a collective or the rendezvous may take before the run fails")
      ->check(finite_range(0.1, 86400.0));
  // Inference: per-module time of one sampled action chunk (vision, prefix pass, the Euler steps) at batch 1.
  cmd->add_flag("--inference", opts->inference,
                "Profile sampling (one action chunk per step, batch 1) instead of training steps");
  cmd->add_option("--weights", opts->weights, "--inference: weights (file or final/ directory; default: random)")
      ->check(file_or_directory());
  cmd->add_option("--dtype", opts->dtype, "--inference: auto (bf16 on a GPU, fp32 on the CPU), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  cmd->add_option("--sample-steps", opts->sample_steps, "--inference: Euler steps per chunk")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--cameras", opts->cameras, "--inference: cameras of the observation (of 3 slots)")
      ->check(CLI::Range(1, 3));
  cmd->add_option("--text-len", opts->text_len, "--inference: padded prompt length")->check(CLI::Range(1, 4096));
  cmd->add_option("--prompt-len", opts->prompt_len, "--inference: real prompt tokens")->check(CLI::Range(1, 4096));
  cmd->add_option("--horizon", opts->horizon, "--inference: action chunk length (pi05_libero: 10)")
      ->check(CLI::Range(1, 4096));
  cmd->callback([&ctx, opts] { ctx.action = [opts, &ctx] { return run_profile(*opts, ctx.err); }; });
}

}  // namespace vlatune::cli
