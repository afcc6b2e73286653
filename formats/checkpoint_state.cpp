#include "formats/checkpoint_state.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"

namespace vlatune::formats {

namespace {

bool is_hex(const std::string& s, size_t digits) {
  if (s.size() != digits) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool is_checksum(const std::string& s) {
  return s.rfind("xxh64:", 0) == 0 && is_hex(s.substr(6), 16);
}

}  // namespace

bool operator==(const CheckpointState& a, const CheckpointState& b) {
  auto key = [](const CheckpointState& s) {
    return std::tie(s.run_id, s.next_step, s.optimizer_precision, s.optimizer_scalars, s.ema, s.skipped_steps,
                    s.data_fingerprint, s.seed, s.lr_next, s.files);
  };
  return key(a) == key(b);
}

std::vector<std::string> checkpoint_tensor_files(bool ema) {
  std::vector<std::string> names = {"model.safetensors", "optimizer.safetensors"};
  if (ema) names.emplace_back("ema.safetensors");
  return names;
}

CheckpointState parse_checkpoint_state(const nlohmann::json& j, const std::string& file) {
  const JsonCursor root(j, file);
  root.expect_object({"schema", "run_id", "next_step", "optimizer", "ema", "trainer", "files"});
  const JsonCursor schema = root.at("schema");
  if (schema.get_string() != kCheckpointSchema)
    schema.fail(std::string("expected \"") + kCheckpointSchema + "\", got " + describe_json(schema.value()));
  CheckpointState s;
  const JsonCursor run_id = root.at("run_id");
  s.run_id = run_id.get_string();
  if (!is_hex(s.run_id, 16)) run_id.fail("expected 16 lowercase hex digits, got " + describe_json(run_id.value()));
  s.next_step = root.at("next_step").get_int(0, int64_t{1} << 40);

  const JsonCursor optimizer = root.at("optimizer");
  optimizer.expect_object({"precision", "scalars"});
  s.optimizer_precision = optimizer.at("precision").get_enum({"bf16", "fp32-master"});
  const JsonCursor scalars = optimizer.at("scalars");
  if (!scalars.value().is_object())
    scalars.fail("expected an object of numbers, got " + describe_json(scalars.value()));
  for (const auto& item : scalars.value().items())
    s.optimizer_scalars[item.key()] = JsonCursor(item.value(), file, scalars.path() + "." + item.key()).get_number();
  for (const char* counter : {"step", "skipped_steps"}) {
    const auto v = scalars.find(counter);
    if (!v) scalars.fail(std::string("missing the optimizer's '") + counter + "'");
    const double x = s.optimizer_scalars.at(counter);
    if (x < 0 || x > static_cast<double>(s.next_step) || x != static_cast<double>(static_cast<int64_t>(x)))
      v->fail("expected a whole number in 0..next_step (" + std::to_string(s.next_step) + "), got " +
              describe_json(v->value()));
  }

  s.ema = root.at("ema").get_bool();
  const JsonCursor trainer = root.at("trainer");
  trainer.expect_object({"skipped_steps", "data_fingerprint", "seed", "lr_next"});
  s.skipped_steps = trainer.at("skipped_steps").get_int(0, s.next_step);
  s.data_fingerprint = trainer.at("data_fingerprint").get_nonempty_string();
  const JsonCursor seed = trainer.at("seed");
  if (!seed.value().is_number_unsigned() && !(seed.value().is_number_integer() && seed.value().get<int64_t>() >= 0))
    seed.fail("expected an integer >= 0, got " + describe_json(seed.value()));
  s.seed = seed.value().get<uint64_t>();
  s.lr_next = trainer.at("lr_next").get_number(0.0);

  const JsonCursor files = root.at("files");
  const std::vector<std::string> expected = checkpoint_tensor_files(s.ema);
  if (!files.value().is_object()) files.fail("expected an object, got " + describe_json(files.value()));
  for (const auto& item : files.value().items()) {
    const JsonCursor checksum(item.value(), file, files.path() + "." + item.key());
    if (std::find(expected.begin(), expected.end(), item.key()) == expected.end())
      checksum.fail("not a file of this checkpoint (expected " +
                    std::string(s.ema ? "model, optimizer and ema" : "model and optimizer") + ".safetensors)");
    const std::string text = checksum.get_string();
    if (!is_checksum(text))
      checksum.fail("expected \"xxh64:\" and 16 lowercase hex digits, got " + describe_json(item.value()));
    s.files[item.key()] = text;
  }
  for (const std::string& name : expected)
    if (!s.files.count(name)) files.fail("missing the checksum of " + name);
  return s;
}

CheckpointState read_checkpoint_state(const std::string& path) {
  return parse_checkpoint_state(read_json_file(path), path);
}

nlohmann::json checkpoint_state_to_json(const CheckpointState& s) {
  nlohmann::json scalars = nlohmann::json::object();
  for (const auto& [name, value] : s.optimizer_scalars) scalars[name] = value;
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, checksum] : s.files) files[name] = checksum;
  return {{"schema", kCheckpointSchema},
          {"run_id", s.run_id},
          {"next_step", s.next_step},
          {"optimizer", {{"precision", s.optimizer_precision}, {"scalars", scalars}}},
          {"ema", s.ema},
          {"trainer",
           {{"skipped_steps", s.skipped_steps},
            {"data_fingerprint", s.data_fingerprint},
            {"seed", s.seed},
            {"lr_next", s.lr_next}}},
          {"files", files}};
}

void check_checkpoint_state(const CheckpointState& s, const std::string& file, const CheckpointExpectations& e) {
  if (s.run_id != e.run_id)
    throw FormatError(file, "$.run_id",
                      "written by run " + s.run_id + ", not by this run (" + e.run_id + "): not this run's checkpoint");
  if (s.next_step > e.max_next_step)
    throw FormatError(file, "$.next_step",
                      std::to_string(s.next_step) + " is past the run's " + std::to_string(e.max_next_step) + " steps");
  if (s.seed != e.seed)
    throw FormatError(file, "$.trainer.seed", std::to_string(s.seed) + ", the run's seed is " + std::to_string(e.seed));
  if (s.optimizer_precision != e.optimizer_precision)
    throw FormatError(file, "$.optimizer.precision",
                      "\"" + s.optimizer_precision + "\", the run's precision is \"" + e.optimizer_precision + "\"");
  if (s.ema != e.ema)
    throw FormatError(file, "$.ema",
                      std::string(s.ema ? "true" : "false") + ", but the run has EMA " + (e.ema ? "on" : "off"));
}

}  // namespace vlatune::formats
