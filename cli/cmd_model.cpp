// `vlatune model init|batch`: random Pi0.5 weights under the openpi names; random batches in the forward format.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/torch_options.h"
#include "cli/validators.h"
#include "model/batch_io.h"
#include "model/pi05.h"
#include "model/state_dict.h"
#include "trainer/synthetic.h"

namespace vlatune::cli {

struct ModelInitOptions {
  std::string config = "tiny";
  uint64_t seed = 0;
  std::string dtype = "fp32";
  std::string device = "auto";
  std::string out;
};

struct ModelBatchOptions {
  std::string config = "tiny";
  int64_t batch = 2;
  int64_t slots = 3;
  int64_t cameras = 2;
  int64_t text_len = 200;
  std::string prompt_len = "20:199";
  int64_t horizon = 50;
  uint64_t seed = 0;
  std::string out;
};

// One line of JSON (a path with quotes or bytes that are not UTF-8 stays valid JSON).
static std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

static int run_model_init(const ModelInitOptions& o, Context& ctx) {
  const auto cfg = model::Pi05Config::named(o.config);
  const auto device = parse_device("--device", o.device);
  const auto dtype = parse_dtype("--dtype", o.dtype);
  model::Pi05 net(cfg, device, dtype);
  model::init_weights(*net, o.seed);
  model::save_state_dict(*net, o.out,
                         {{"format", "pt"}, {"vlatune.config", o.config}, {"vlatune.seed", std::to_string(o.seed)}});
  ctx.out << json_line({{"out", o.out}, {"parameters", model::count_parameters(*net)}});
  return kExitOk;
}

static int run_model_batch(const ModelBatchOptions& o, Context& ctx) {
  const auto cfg = model::Pi05Config::named(o.config);
  std::pair<int64_t, int64_t> prompt;
  try {
    prompt = trainer::parse_prompt_range(o.prompt_len);
  } catch (const std::invalid_argument& e) {
    throw BadInput(std::string("--prompt-len: ") + e.what());
  }
  if (prompt.second > o.text_len)
    throw BadInput("--prompt-len " + o.prompt_len + ": MAX exceeds --text-len (" + std::to_string(o.text_len) + ")");
  if (o.cameras > o.slots)
    throw BadInput("--cameras " + std::to_string(o.cameras) + " exceeds --slots " + std::to_string(o.slots));
  torch::Generator gen = at::detail::createCPUGenerator(o.seed);
  model::Pi05Batch batch;
  try {
    batch = model::make_random_batch(cfg, o.batch, o.slots, o.cameras, o.text_len, prompt.first, prompt.second,
                                     o.horizon, &gen, torch::kCPU);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  model::write_batch(o.out, batch);
  ctx.out << json_line({{"out", o.out}});
  return kExitOk;
}

void setup_model(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("model", "Model utilities: random weights and batches");
  cmd->require_subcommand(1);

  auto init_opts = std::make_shared<ModelInitOptions>();
  auto* init = cmd->add_subcommand("init", "Write randomly initialized weights (openpi names) to safetensors");
  init->option_defaults()->always_capture_default();
  init->add_option("--config", init_opts->config, "Model size")->check(CLI::IsMember({"tiny", "full"}));
  init->add_option("--seed", init_opts->seed, "Random seed")->check(unsigned_integer());
  init->add_option("--dtype", init_opts->dtype, "Parameter dtype")->check(CLI::IsMember({"fp32", "bf16", "fp64"}));
  init->add_option("--device", init_opts->device, "Where to initialize (auto: GPU when visible)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  init->add_option("--out", init_opts->out, "Weights file (.safetensors)")->required();
  init->callback([&ctx, init_opts] { ctx.action = [&ctx, init_opts] { return run_model_init(*init_opts, ctx); }; });

  auto batch_opts = std::make_shared<ModelBatchOptions>();
  auto* batch = cmd->add_subcommand("batch", "Write a random LIBERO-shaped batch in the `forward` format");
  batch->option_defaults()->always_capture_default();
  batch->add_option("--config", batch_opts->config, "Model size")->check(CLI::IsMember({"tiny", "full"}));
  batch->add_option("--batch", batch_opts->batch, "Samples")->check(CLI::Range(1, 1 << 16));
  batch->add_option("--slots", batch_opts->slots, "Camera slots")->check(CLI::Range(0, 16));
  batch->add_option("--cameras", batch_opts->cameras, "Valid cameras (the rest are empty slots)")
      ->check(CLI::Range(0, 16));
  batch->add_option("--text-len", batch_opts->text_len, "Padded prompt length")->check(CLI::Range(1, 4096));
  batch->add_option("--prompt-len", batch_opts->prompt_len, "MIN:MAX real prompt tokens (padded to --text-len)");
  batch->add_option("--horizon", batch_opts->horizon, "Action chunk length")->check(CLI::Range(1, 4096));
  batch->add_option("--seed", batch_opts->seed, "Random seed")->check(unsigned_integer());
  batch->add_option("--out", batch_opts->out, "Batch file (.safetensors)")->required();
  batch->callback(
      [&ctx, batch_opts] { ctx.action = [&ctx, batch_opts] { return run_model_batch(*batch_opts, ctx); }; });
}

}  // namespace vlatune::cli
