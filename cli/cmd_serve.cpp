// `vlatune serve`: a trained policy behind openpi's websocket policy protocol (serve/server.h, serve/policy.h), so
// openpi's clients (openpi-client's WebsocketClientPolicy, the LIBERO example) talk to it unchanged. Prints
// "vlatune serve: listening on ws://HOST:PORT" on stdout once it accepts connections; SIGINT/SIGTERM stop it
// (exit 0).
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"
#include "cli/policy_options.h"
#include "cli/torch_options.h"
#include "cli/validators.h"
#include "trainer/tokenizer.h"

#ifdef VLATUNE_HAVE_SERVE
#include "serve/policy.h"
#include "serve/server.h"
#endif

namespace vlatune::cli {

struct ServeCliOptions {
  std::string config;  // empty: policy_config_name()
  std::string weights;
  uint64_t seed = 0;
  std::string norm_stats;
  std::string tokenizer;
  std::string host = "127.0.0.1";
  int port = 8000;
  int64_t steps = 10;
  int64_t horizon = 10;
  int64_t text_len = 200;
  std::string dtype = "fp32";
  std::string device = "auto";
  bool cuda_graph = false;
  std::vector<std::string> camera_keys = {"observation/image", "observation/wrist_image"};
  std::string state_key = "observation/state";
  std::string prompt_key = "prompt";
  std::string noise_key = "noise";
  bool discrete_state = false;
  double max_message_mb = 64;
  uint64_t noise_seed = 0;
};

static int run_serve(const ServeCliOptions& o, Context& ctx) {
#ifndef VLATUNE_HAVE_SERVE
  (void)o;
  (void)ctx;
  throw Unavailable(
      "vlatune serve is not built into this binary: the websocketpp, Asio and msgpack-cxx headers were not found "
      "when it was configured (apt-get install libwebsocketpp-dev libasio-dev libmsgpack-cxx-dev, as "
      "scripts/setup.sh does, then rebuild)");
#else
  if (!trainer::PromptTokenizer::available())
    throw Unavailable(
        "vlatune serve tokenizes prompts with SentencePiece, which this build lacks "
        "(apt-get install libsentencepiece-dev, then rebuild)");
  const auto device = parse_device("--device", o.device);
  const std::string config = policy_config_name(o.config, device);
  const auto cfg = model::Pi05Config::named(config);
  const auto dtype = parse_dtype("--dtype", o.dtype);
  const std::string norm_path = o.norm_stats.empty() ? default_norm_stats(o.weights) : o.norm_stats;
  if (norm_path.empty())
    throw BadInput(
        "--norm-stats: required (norm_stats.json, openpi's layout) unless --weights is a run's final/ "
        "directory holding one");
  trainer::NormStats norm = read_norm_stats_flag("--norm-stats", norm_path);
  std::shared_ptr<const trainer::PromptTokenizer> tokenizer;
  try {
    tokenizer = std::make_shared<const trainer::PromptTokenizer>(o.tokenizer, o.text_len);
  } catch (const std::exception& e) {
    throw BadInput(std::string("--tokenizer: ") + e.what());
  }
  if (o.weights.empty()) ctx.err << "vlatune serve: no --weights: serving random weights (seed " << o.seed << ")\n";
  model::Pi05 net = load_policy_model(cfg, o.weights, o.seed, device, dtype);

  model::SampleOptions so;
  so.num_steps = o.steps;
  so.cuda_graph = o.cuda_graph;
  serve::PolicyConfig pc;
  pc.camera_keys = o.camera_keys;
  pc.state_key = o.state_key;
  pc.prompt_key = o.prompt_key;
  pc.noise_key = o.noise_key;
  pc.text_len = o.text_len;
  pc.horizon = o.horizon;
  pc.discrete_state = o.discrete_state;
  pc.seed = o.noise_seed;
  std::unique_ptr<serve::Policy> policy;
  try {
    policy = std::make_unique<serve::Policy>(*net, so, std::move(norm), tokenizer, pc);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  nlohmann::json metadata = policy->metadata();
  metadata["config"] = config;
  metadata["device"] = device.str();
  metadata["dtype"] = o.dtype;

  serve::ServerOptions server;
  server.host = o.host;
  server.port = o.port;
  server.max_message_bytes = static_cast<int64_t>(o.max_message_mb * 1024 * 1024);
  const std::string metadata_message = serve::encode_message(metadata);
  try {
    serve::run_server(
        server, metadata_message,
        [&policy](const std::string& payload, double prev_total_ms) { return policy->handle(payload, prev_total_ms); },
        [&](int port) {
          ctx.out << "vlatune serve: listening on ws://" << o.host << ":" << port << " (" << config << " Pi0.5, "
                  << device.str() << ", " << o.dtype << ", " << o.steps << " steps, horizon " << o.horizon << ")"
                  << std::endl;
        },
        ctx.err);
  } catch (const std::runtime_error& e) {
    throw BadInput(e.what());
  }
  return kExitOk;
#endif
}

void setup_serve(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<ServeCliOptions>();
  auto* cmd = app.add_subcommand("serve",
                                 "Serve a policy over openpi's websocket protocol (openpi-client, the LIBERO "
                                 "example): observations in, action chunks out");
  cmd->add_option("--config", opts->config, "Model size (default: full on a GPU, tiny on the CPU)")
      ->check(CLI::IsMember({"tiny", "full"}));
  cmd->add_option("--weights", opts->weights,
                  "Weights: a safetensors file or a run's final/ directory (omitted: random weights from --seed)")
      ->check(file_or_directory());
  cmd->add_option("--seed", opts->seed, "Random weights seed when --weights is omitted")->check(unsigned_integer());
  cmd->add_option("--norm-stats", opts->norm_stats,
                  "norm_stats.json (openpi layout): state normalization, action un-normalization and the real "
                  "action dims (default: WEIGHTS/norm_stats.json)")
      ->check(regular_file());
  cmd->add_option("--tokenizer", opts->tokenizer, "SentencePiece model of the prompts (PaliGemma's tokenizer.model)")
      ->required()
      ->check(regular_file());
  cmd->add_option("--host", opts->host, "Address to listen on (0.0.0.0: every interface)");
  cmd->add_option("--port", opts->port, "Port (openpi: 8000; 0: any free port, printed)")->check(CLI::Range(0, 65535));
  cmd->add_option("--steps", opts->steps, "Euler steps per chunk (openpi: 10)")->check(CLI::Range(1, 1000));
  cmd->add_option("--horizon", opts->horizon, "Action chunk length (pi05_libero: 10)")->check(CLI::Range(1, 4096));
  cmd->add_option("--text-len", opts->text_len, "Prompt tokens (openpi pi05: 200)")->check(CLI::Range(1, 4096));
  cmd->add_option("--dtype", opts->dtype, "Parameter and compute dtype")
      ->check(CLI::IsMember({"fp32", "bf16", "fp64"}));
  cmd->add_option("--device", opts->device, "auto: GPU when visible")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--cuda-graph", opts->cuda_graph, "Capture the denoising loop as one CUDA graph (CUDA only)");
  cmd->add_option("--camera-key", opts->camera_keys,
                  "Observation key of each camera, in slot order (base, left wrist, right wrist); default: "
                  "observation/image observation/wrist_image (openpi's LIBERO client)")
      ->expected(1, 3);
  cmd->add_option("--state-key", opts->state_key, "Observation key of the robot state");
  cmd->add_option("--prompt-key", opts->prompt_key, "Observation key of the task instruction");
  cmd->add_option("--noise-key", opts->noise_key, "Observation key of the optional initial noise [H, 32]");
  cmd->add_flag("--discrete-state", opts->discrete_state,
                "Put the normalized state into the prompt (pi05 with discrete_state_input; pi05_libero: off)");
  cmd->add_option("--max-message-mb", opts->max_message_mb,
                  "Largest observation message (MiB); larger ones get an error reply")
      ->check(finite_range(0.001, 4096));
  cmd->add_option("--noise-seed", opts->noise_seed, "Seed of the noise drawn for observations without one")
      ->check(unsigned_integer());
  cmd->callback([&ctx, opts] { ctx.action = [&ctx, opts] { return run_serve(*opts, ctx); }; });
}

}  // namespace vlatune::cli
