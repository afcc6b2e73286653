#include "formats/train_config.h"

#include <cmath>
#include <limits>
#include <tuple>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"

namespace vlatune::formats {

namespace {

constexpr int64_t kMaxSteps = int64_t{1} << 40;  // the CLI's bound on --steps and the schedule's step counts

bool is_run_id(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// A finite number in [min, max) (`open_max`) or [min, max].
double number_in(const JsonCursor& c, double min, double max, bool open_max) {
  const double x = c.get_number();
  if (x < min || (open_max ? x >= max : x > max)) {
    c.fail("expected a number in [" + nlohmann::json(min).dump() + ", " + nlohmann::json(max).dump() +
           (open_max ? ")" : "]") + ", got " + describe_json(c.value()));
  }
  return x;
}

uint64_t get_seed(const JsonCursor& c) {
  if (c.value().is_number_unsigned()) return c.value().get<uint64_t>();
  if (c.value().is_number_integer() && c.value().get<int64_t>() >= 0) return c.value().get<uint64_t>();
  c.fail("expected an integer in 0.." + std::to_string(std::numeric_limits<uint64_t>::max()) + ", got " +
         describe_json(c.value()));
}

std::optional<std::string> optional_path(const JsonCursor& c) {
  if (c.is_null()) return std::nullopt;
  return c.get_nonempty_string();
}

nlohmann::json optional_to_json(const std::optional<std::string>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

bool operator==(const TrainConfig& a, const TrainConfig& b) {
  auto key = [](const TrainConfig& c) {
    return std::tie(c.run_id, c.config, c.data, c.recipe_source, c.init_weights, c.device, c.steps, c.lr,
                    c.warmup_steps, c.decay_steps, c.decay_lr, c.clip_norm, c.weight_decay, c.beta1, c.beta2, c.eps,
                    c.ema_decay, c.loss_action_dim, c.seed, c.timing_warmup, c.checkpoint_every, c.keep_last,
                    c.max_consecutive_nonfinite, c.workers, c.augment, c.save, c.world_size, c.dist_buckets);
  };
  return key(a) == key(b);
}

TrainConfig parse_train_config(const nlohmann::json& j, const std::string& file) {
  const JsonCursor root(j, file);
  root.expect_object({"schema",
                      "run_id",
                      "config",
                      "data",
                      "recipe_source",
                      "init_weights",
                      "device",
                      "steps",
                      "lr",
                      "warmup_steps",
                      "decay_steps",
                      "decay_lr",
                      "clip_norm",
                      "weight_decay",
                      "beta1",
                      "beta2",
                      "eps",
                      "ema_decay",
                      "loss_action_dim",
                      "seed",
                      "timing_warmup",
                      "checkpoint_every",
                      "keep_last",
                      "max_consecutive_nonfinite",
                      "workers",
                      "augment",
                      "save",
                      "world_size",
                      "dist_buckets"});
  const JsonCursor schema = root.at("schema");
  if (schema.get_string() != kTrainConfigSchema)
    schema.fail(std::string("expected \"") + kTrainConfigSchema + "\", got " + describe_json(schema.value()) +
                " (a run written by another vlatune version: continue it with that version)");
  TrainConfig c;
  const JsonCursor run_id = root.at("run_id");
  c.run_id = run_id.get_string();
  if (!is_run_id(c.run_id)) run_id.fail("expected 16 lowercase hex digits, got " + describe_json(run_id.value()));
  c.config = root.at("config").get_enum({"tiny", "full"});
  c.data = root.at("data").get_nonempty_string();
  c.recipe_source = optional_path(root.at("recipe_source"));
  c.init_weights = optional_path(root.at("init_weights"));
  c.device = root.at("device").get_enum({"auto", "cpu", "cuda"});
  c.steps = root.at("steps").get_int(1, kMaxSteps);
  c.lr = root.at("lr").get_number(0.0);
  c.warmup_steps = root.at("warmup_steps").get_int(0, kMaxSteps);
  c.decay_steps = root.at("decay_steps").get_int(1, kMaxSteps);
  c.decay_lr = root.at("decay_lr").get_number(0.0);
  c.clip_norm = root.at("clip_norm").get_number(0.0);
  c.weight_decay = root.at("weight_decay").get_number(0.0);
  c.beta1 = number_in(root.at("beta1"), 0.0, 1.0, /*open_max=*/true);
  c.beta2 = number_in(root.at("beta2"), 0.0, 1.0, /*open_max=*/true);
  const JsonCursor eps = root.at("eps");
  c.eps = eps.get_number(0.0);
  if (c.eps <= 0) eps.fail("expected a finite number > 0, got " + describe_json(eps.value()));
  c.ema_decay = number_in(root.at("ema_decay"), 0.0, 1.0, /*open_max=*/true);
  c.loss_action_dim = root.at("loss_action_dim").get_int(1, 32);
  c.seed = get_seed(root.at("seed"));
  c.timing_warmup = root.at("timing_warmup").get_int(0, kMaxSteps);
  c.checkpoint_every = root.at("checkpoint_every").get_int(0, kMaxSteps);
  c.keep_last = root.at("keep_last").get_int(1, 1000);
  c.max_consecutive_nonfinite = root.at("max_consecutive_nonfinite").get_int(1, kMaxSteps);
  c.workers = root.at("workers").get_int(1, 256);
  c.augment = root.at("augment").get_bool();
  c.save = root.at("save").get_bool();
  c.world_size = root.at("world_size").get_int(1, 1 << 20);
  c.dist_buckets = root.at("dist_buckets").get_enum({"groups", "one"});
  return c;
}

TrainConfig read_train_config(const std::string& path) {
  return parse_train_config(read_json_file(path), path);
}

nlohmann::json train_config_to_json(const TrainConfig& c) {
  return {{"schema", kTrainConfigSchema},
          {"run_id", c.run_id},
          {"config", c.config},
          {"data", c.data},
          {"recipe_source", optional_to_json(c.recipe_source)},
          {"init_weights", optional_to_json(c.init_weights)},
          {"device", c.device},
          {"steps", c.steps},
          {"lr", c.lr},
          {"warmup_steps", c.warmup_steps},
          {"decay_steps", c.decay_steps},
          {"decay_lr", c.decay_lr},
          {"clip_norm", c.clip_norm},
          {"weight_decay", c.weight_decay},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"eps", c.eps},
          {"ema_decay", c.ema_decay},
          {"loss_action_dim", c.loss_action_dim},
          {"seed", c.seed},
          {"timing_warmup", c.timing_warmup},
          {"checkpoint_every", c.checkpoint_every},
          {"keep_last", c.keep_last},
          {"max_consecutive_nonfinite", c.max_consecutive_nonfinite},
          {"workers", c.workers},
          {"augment", c.augment},
          {"save", c.save},
          {"world_size", c.world_size},
          {"dist_buckets", c.dist_buckets}};
}

void write_train_config(const TrainConfig& config, const std::string& path) {
  const nlohmann::json j = train_config_to_json(config);
  parse_train_config(j, path);
  write_file_atomic(path, dump_json_file(j));
}

std::string resolve_run_path(const std::string& run_dir, const std::string& path) {
  if (path.empty() || path.front() == '/' || run_dir.empty()) return path;
  return run_dir.back() == '/' ? run_dir + path : run_dir + "/" + path;
}

}  // namespace vlatune::formats
