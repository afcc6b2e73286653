#include "formats/run_record.h"

#include <cmath>
#include <limits>
#include <tuple>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"

namespace vlatune::formats {

namespace {

bool same_number(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

bool same_series(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!same_number(a[i], b[i])) return false;
  }
  return true;
}

bool is_hex_hash(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// nullable: JSON null -> NaN (a skipped step's loss); otherwise a finite number >= min.
std::vector<double> parse_series(const JsonCursor& c, double min, bool nullable) {
  const size_t n = c.expect_array();
  std::vector<double> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const JsonCursor e = c.element(i);
    if (nullable) {
      out.push_back(e.get_optional_number(min).value_or(std::numeric_limits<double>::quiet_NaN()));
    } else {
      out.push_back(e.get_number(min));
    }
  }
  return out;
}

nlohmann::json series_to_json(const std::vector<double>& v) {
  nlohmann::json out = nlohmann::json::array();
  for (double x : v) out.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr));
  return out;
}

template <class T>
nlohmann::json optional_to_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

Environment parse_environment(const JsonCursor& c) {
  c.expect_object({"gpu", "driver", "cuda", "torch", "vlatune_commit", "config", "recipe_hash", "world_size"});
  Environment e;
  e.gpu = c.at("gpu").get_optional_string();
  e.driver = c.at("driver").get_optional_string();
  e.cuda = c.at("cuda").get_optional_string();
  e.torch = c.at("torch").get_nonempty_string();
  e.vlatune_commit = c.at("vlatune_commit").get_optional_string();
  e.config = c.at("config").get_nonempty_string();
  const JsonCursor hash = c.at("recipe_hash");
  e.recipe_hash = hash.get_string();
  if (!is_hex_hash(e.recipe_hash)) {
    hash.fail("expected 16 lowercase hex digits (recipe_hash()), got " + describe_json(hash.value()));
  }
  e.world_size = static_cast<int>(c.at("world_size").get_int(1, int64_t{1} << 20));
  return e;
}

nlohmann::json environment_to_json(const Environment& e) {
  return {{"gpu", optional_to_json(e.gpu)},
          {"driver", optional_to_json(e.driver)},
          {"cuda", optional_to_json(e.cuda)},
          {"torch", e.torch},
          {"vlatune_commit", optional_to_json(e.vlatune_commit)},
          {"config", e.config},
          {"recipe_hash", e.recipe_hash},
          {"world_size", e.world_size}};
}

bool operator==(const Environment& a, const Environment& b) {
  return environment_differences(a, b).empty();
}

std::vector<std::string> environment_differences(const Environment& a, const Environment& b) {
  std::vector<std::string> out;
  if (a.gpu != b.gpu) out.push_back("gpu");
  if (a.driver != b.driver) out.push_back("driver");
  if (a.cuda != b.cuda) out.push_back("cuda");
  if (a.torch != b.torch) out.push_back("torch");
  if (a.vlatune_commit != b.vlatune_commit) out.push_back("vlatune_commit");
  if (a.config != b.config) out.push_back("config");
  if (a.recipe_hash != b.recipe_hash) out.push_back("recipe_hash");
  if (a.world_size != b.world_size) out.push_back("world_size");
  return out;
}

bool operator==(const RunRecord& a, const RunRecord& b) {
  auto key = [](const RunRecord& r) {
    return std::tie(r.schema, r.steps, r.warmup_steps, r.skipped_steps, r.batch, r.seed, r.data, r.samples_per_s_median,
                    r.peak_gib, r.environment);
  };
  return key(a) == key(b) && same_series(a.step_ms, b.step_ms) && same_series(a.loss, b.loss) &&
         same_series(a.grad_norm, b.grad_norm);
}

RunRecord parse_run_record(const nlohmann::json& j, const std::string& file) {
  const JsonCursor root(j, file);
  root.expect_object({"schema", "steps", "warmup_steps", "skipped_steps", "batch", "seed", "data",
                      "samples_per_s_median", "peak_gib", "per_step", "environment"});
  RunRecord r;
  const JsonCursor schema = root.at("schema");
  r.schema = schema.get_string();
  if (r.schema != kRunSchema) {
    schema.fail(std::string("expected \"") + kRunSchema + "\", got " + describe_json(schema.value()));
  }
  r.steps = root.at("steps").get_int(0);
  const JsonCursor warmup = root.at("warmup_steps");
  r.warmup_steps = warmup.get_int(0);
  if (r.warmup_steps > r.steps) {
    warmup.fail(std::to_string(r.warmup_steps) + " warm-up steps, but the run has only " + std::to_string(r.steps) +
                " steps");
  }
  const JsonCursor skipped = root.at("skipped_steps");
  r.skipped_steps = skipped.get_int(0);
  if (r.skipped_steps > r.steps) {
    skipped.fail(std::to_string(r.skipped_steps) + " skipped steps, but the run has only " + std::to_string(r.steps) +
                 " steps");
  }
  r.batch = root.at("batch").get_int(1);
  r.seed = root.at("seed").get_optional_int();
  r.data = root.at("data").get_optional_string();
  r.samples_per_s_median = root.at("samples_per_s_median").get_optional_number(0.0);
  r.peak_gib = root.at("peak_gib").get_optional_number(0.0);

  const JsonCursor per_step = root.at("per_step");
  per_step.expect_object({"step_ms", "loss", "grad_norm"});
  const JsonCursor step_ms = per_step.at("step_ms");
  r.step_ms = parse_series(step_ms, 0.0, false);
  for (size_t i = 0; i < r.step_ms.size(); ++i) {
    if (r.step_ms[i] <= 0) step_ms.element(i).fail("expected a step time > 0 ms, got 0");
  }
  const size_t max_len = static_cast<size_t>(r.steps - r.warmup_steps);
  if (r.step_ms.size() > max_len) {
    step_ms.fail(std::to_string(r.step_ms.size()) + " entries, but steps - warmup_steps = " + std::to_string(max_len));
  }
  const JsonCursor loss = per_step.at("loss");
  r.loss = parse_series(loss, -std::numeric_limits<double>::infinity(), true);
  const JsonCursor grad_norm = per_step.at("grad_norm");
  r.grad_norm = parse_series(grad_norm, 0.0, true);
  for (const auto& [series, cursor] : {std::make_pair(&r.loss, &loss), std::make_pair(&r.grad_norm, &grad_norm)}) {
    if (series->size() != r.step_ms.size()) {
      cursor->fail(std::to_string(series->size()) + " entries, but $.per_step.step_ms has " +
                   std::to_string(r.step_ms.size()) + " (the per-step arrays must have equal lengths)");
    }
  }
  r.environment = parse_environment(root.at("environment"));
  return r;
}

RunRecord read_run_record(const std::string& path) {
  return parse_run_record(read_json_file(path), path);
}

nlohmann::json run_record_to_json(const RunRecord& r) {
  return {
      {"schema", r.schema},
      {"steps", r.steps},
      {"warmup_steps", r.warmup_steps},
      {"skipped_steps", r.skipped_steps},
      {"batch", r.batch},
      {"seed", optional_to_json(r.seed)},
      {"data", optional_to_json(r.data)},
      {"samples_per_s_median", optional_to_json(r.samples_per_s_median)},
      {"peak_gib", optional_to_json(r.peak_gib)},
      {"per_step",
       {{"step_ms", series_to_json(r.step_ms)},
        {"loss", series_to_json(r.loss)},
        {"grad_norm", series_to_json(r.grad_norm)}}},
      {"environment", environment_to_json(r.environment)},
  };
}

void write_run_record(const RunRecord& run, const std::string& path) {
  const nlohmann::json j = run_record_to_json(run);
  // step_ms must stay finite: series_to_json writes a non-finite step time as null, which the reader rejects.
  parse_run_record(j, path);
  write_file_atomic(path, dump_json_file(j));
}

}  // namespace vlatune::formats
