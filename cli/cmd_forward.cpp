// `vlatune forward`: one forward + flow-matching loss (+ backward with --out) on a fixed batch, for parity
// checks against other implementations (openpi, LeRobot). Prints {"loss": ...} on stdout.
#include <CLI/CLI.hpp>

#include <cmath>
#include <iomanip>
#include <memory>

#include "cli/cli.h"
#include "cli/torch_options.h"
#include "cli/validators.h"
#include "model/batch_io.h"
#include "model/pi05.h"
#include "model/state_dict.h"

namespace vlatune::cli {

struct ForwardOptions {
  std::string config = "tiny";
  std::string weights;
  uint64_t seed = 0;
  std::string batch;
  std::string dtype = "fp32";
  std::string device = "auto";
  bool no_prune = false;
  bool no_trim = false;
  bool no_skip_dead = false;
  std::string attention = "lean";
  int64_t action_dim = 32;
  std::string out;
};

namespace {

// Elements of a floating tensor that are NaN or infinite.
int64_t non_finite_count(const torch::Tensor& t) {
  if (!t.is_floating_point() || t.numel() == 0) return 0;
  return (~torch::isfinite(t)).sum().item<int64_t>();
}

// Non-finite inputs would make the loss NaN (and the printed JSON invalid) without saying which input was bad.
void require_finite_weights(model::Pi05Impl& net, const std::string& file) {
  for (const auto& item : net.named_parameters()) {
    if (const int64_t n = non_finite_count(item.value()); n > 0)
      throw BadInput("--weights " + file + ": tensor '" + item.key() + "' has " + std::to_string(n) +
                     " non-finite value(s) (NaN or inf)");
  }
}

void require_valid_batch(const model::Pi05Batch& b, const std::string& file) {
  if (b.images.size(0) == 0) throw BadInput("--batch " + file + ": empty batch (0 samples)");
  for (const auto& [name, t] : {std::make_pair("images", &b.images), std::make_pair("actions", &b.actions),
                                std::make_pair("noise", &b.noise), std::make_pair("time", &b.time)}) {
    if (const int64_t n = non_finite_count(*t); n > 0)
      throw BadInput("--batch " + file + ": '" + name + "' has " + std::to_string(n) +
                     " non-finite value(s) (NaN or inf)");
  }
}

}  // namespace

static int run_forward(const ForwardOptions& o, Context& ctx) {
  require_distinct_output("--out", o.out, {{"--weights", o.weights}, {"--batch", o.batch}});
  const auto cfg = model::Pi05Config::named(o.config);
  const auto device = parse_device("--device", o.device);
  const auto dtype = parse_dtype("--dtype", o.dtype);
  model::Pi05Batch batch;
  try {
    batch = model::read_batch(o.batch, cfg);
  } catch (const std::exception& e) {
    throw BadInput(std::string("--batch: ") + e.what());
  }
  require_valid_batch(batch, o.batch);
  model::Pi05 net(cfg, device, dtype);
  if (o.weights.empty()) {
    model::init_weights(*net, o.seed);
  } else {
    try {
      model::load_state_dict(*net, o.weights, /*strict=*/true);
    } catch (const model::SafetensorsError& e) {
      throw BadInput(std::string("--weights: ") + e.what());
    }
    require_finite_weights(*net, o.weights);
  }
  for (torch::Tensor* t : {&batch.images, &batch.image_masks, &batch.tokens, &batch.token_masks, &batch.actions,
                           &batch.noise, &batch.time})
    *t = t->to(device);

  model::ForwardOptions fo;
  fo.prune_slots = !o.no_prune;
  fo.trim_text = !o.no_trim;
  fo.skip_dead = !o.no_skip_dead;
  fo.skip_padded_rows = !o.no_skip_dead;
  fo.attention = o.attention == "materialized" ? model::Attention::kMaterialized : model::Attention::kLean;
  fo.loss_action_dim = o.action_dim;

  const bool want_grads = !o.out.empty();
  torch::AutoGradMode grad_mode(want_grads);
  auto result = net->forward(batch, fo);
  const double loss = result.loss.item<double>();
  if (!std::isfinite(loss)) {
    // JSON has no NaN: the line stays valid, and the exit code says the forward failed.
    ctx.out << "{\"loss\": null}\n";
    ctx.err << "vlatune: error: forward: the loss is not finite (" << loss << ") from finite inputs; try --dtype fp32"
            << (o.out.empty() ? "" : "; nothing written to --out") << "\n";
    return kExitFailure;
  }
  if (want_grads) {
    result.loss.backward();
    net->fill_missing_grads();
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    tensors.emplace_back("loss", result.loss.detach().to(torch::kFloat32).reshape({}));
    tensors.emplace_back("velocity", result.velocity.detach().to(torch::kFloat32));
    for (const auto& item : net->named_parameters())
      tensors.emplace_back("grad." + item.key(), item.value().grad().detach());
    model::write_safetensors(o.out, tensors, {{"vlatune.config", o.config}, {"vlatune.dtype", o.dtype}});
  }
  ctx.out << std::setprecision(9) << "{\"loss\": " << loss << "}\n";
  return kExitOk;
}

void setup_forward(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<ForwardOptions>();
  auto* cmd = app.add_subcommand("forward",
                                 "One forward + flow-matching loss on a fixed batch; prints "
                                 "{\"loss\": ...}");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--config", opts->config, "Model size")->check(CLI::IsMember({"tiny", "full"}));
  cmd->add_option("--weights", opts->weights,
                  "Model weights (safetensors, openpi or LeRobot names) (default: random init from --seed)")
      ->check(regular_file());
  cmd->add_option("--seed", opts->seed, "Random init seed when --weights is omitted")->check(unsigned_integer());
  cmd->add_option("--batch", opts->batch, "Batch (safetensors; format in README)")->required()->check(regular_file());
  cmd->add_option("--dtype", opts->dtype, "Parameter and compute dtype")
      ->check(CLI::IsMember({"fp32", "bf16", "fp64"}));
  cmd->add_option("--device", opts->device, "auto: GPU when visible")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--no-prune", opts->no_prune, "Keep camera slots that are masked for the whole batch");
  cmd->add_flag("--no-trim", opts->no_trim, "Keep text padding");
  cmd->add_flag("--no-skip-dead", opts->no_skip_dead,
                "Run the dead prefix work (the last layer's, and the padded prefix rows')");
  cmd->add_option("--attention", opts->attention, "lean (SDPA) or materialized (reference)")
      ->check(CLI::IsMember({"lean", "materialized"}));
  cmd->add_option("--action-dim", opts->action_dim, "Loss over the first N action dims (LeRobot: real dims)")
      ->check(CLI::Range(1, 32));
  cmd->add_option("--out", opts->out,
                  "Write loss, velocity and grad.<fqn> for every parameter (safetensors) (default: none)");
  cmd->callback([&ctx, opts] { ctx.action = [&ctx, opts] { return run_forward(*opts, ctx); }; });
}

}  // namespace vlatune::cli
