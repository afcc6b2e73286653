#include "formats/recipe.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <tuple>

#include "formats/fqn_pattern.h"
#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"

namespace vlatune::formats {

namespace {

// Sizes are positive and bounded, so products such as micro_batch * grad_accum * world_size fit in 64 bits.
constexpr int64_t kMaxSize = int64_t{1} << 20;

int get_size(const JsonCursor& c) {
  return static_cast<int>(c.get_int(1, kMaxSize));
}

std::vector<std::string> parse_patterns(const JsonCursor& c) {
  const size_t n = c.expect_array();
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const JsonCursor e = c.element(i);
    if (!e.value().is_string()) e.fail("expected a module pattern (string), got " + describe_json(e.value()));
    out.push_back(e.get_string());
    validate_pattern(out.back(), c.file(), e.path());
  }
  return out;
}

void parse_batch(const JsonCursor& c, Recipe::Batch& b) {
  c.expect_object({"micro_batch", "grad_accum"});
  if (auto v = c.find("micro_batch")) b.micro_batch = get_size(*v);
  if (auto v = c.find("grad_accum")) b.grad_accum = get_size(*v);
}

void parse_data(const JsonCursor& c, Recipe::Data& d) {
  c.expect_object({"num_images", "trim_text", "trim_multiple"});
  if (auto v = c.find("num_images")) {
    const auto n = v->get_optional_int(1, kMaxSize);
    d.num_images = n ? std::optional<int>(static_cast<int>(*n)) : std::nullopt;
  }
  if (auto v = c.find("trim_text")) d.trim_text = v->get_bool();
  if (auto v = c.find("trim_multiple")) d.trim_multiple = get_size(*v);
}

void parse_model_options(const JsonCursor& c, Recipe::ModelOptions& m) {
  c.expect_object({"skip_dead", "attention", "attention_backend", "precision", "cuda_graph"});
  if (auto v = c.find("skip_dead")) m.skip_dead = v->get_bool();
  if (auto v = c.find("attention")) {
    m.attention = v->get_enum({"lean", "materialized"}) == "lean" ? Attention::kLean : Attention::kMaterialized;
  }
  if (auto v = c.find("attention_backend")) {
    const std::string b = v->get_enum({"auto", "cudnn", "flash", "sdpa"});
    m.attention_backend = b == "cudnn"   ? AttentionBackend::kCudnn
                          : b == "flash" ? AttentionBackend::kFlash
                          : b == "sdpa"  ? AttentionBackend::kSdpa
                                         : AttentionBackend::kAuto;
  }
  if (auto v = c.find("precision")) {
    m.precision = v->get_enum({"bf16", "fp32-master"}) == "bf16" ? Precision::kBf16 : Precision::kFp32Master;
  }
  if (auto v = c.find("cuda_graph")) m.cuda_graph_step = v->get_enum({"off", "step"}) == "step";
}

void parse_freeze(const JsonCursor& c, Recipe::Freeze& f) {
  c.expect_object({"presets", "modules"});
  if (auto v = c.find("presets")) {
    const size_t n = v->expect_array();
    for (size_t i = 0; i < n; ++i) {
      const JsonCursor e = v->element(i);
      const FreezePreset preset = e.get_enum({"freeze_vision_encoder", "train_expert_only"}) == "train_expert_only"
                                      ? FreezePreset::kTrainExpertOnly
                                      : FreezePreset::kFreezeVisionEncoder;
      if (std::find(f.presets.begin(), f.presets.end(), preset) != f.presets.end())
        e.fail(std::string("duplicate preset \"") + to_string(preset) + "\"");
      f.presets.push_back(preset);
    }
  }
  if (auto m = c.find("modules")) f.modules = parse_patterns(*m);
}

void parse_lora(const JsonCursor& c, Recipe::Lora& l) {
  c.expect_object({"preset", "targets"});
  if (auto v = c.find("preset"); v && !v->is_null()) {
    v->get_enum({"openpi"});
    l.preset = LoraPreset::kOpenpi;
  }
  if (auto v = c.find("targets")) {
    const size_t n = v->expect_array();
    for (size_t i = 0; i < n; ++i) {
      const JsonCursor t = v->element(i);
      t.expect_object({"modules", "rank", "alpha"});
      Recipe::LoraTarget target;
      const JsonCursor modules = t.at("modules");
      target.modules = parse_patterns(modules);
      if (target.modules.empty()) modules.fail("a LoRA target needs at least one module pattern");
      if (auto r = t.find("rank")) target.rank = get_size(*r);
      target.alpha = target.rank;
      if (auto a = t.find("alpha")) {
        target.alpha = a->get_number(0.0);
        if (!(target.alpha > 0)) a->fail("expected a finite number > 0, got " + describe_json(a->value()));
      }
      l.targets.push_back(std::move(target));
    }
  }
}

void parse_groups(const JsonCursor& c, std::vector<Recipe::Group>& groups) {
  const size_t n = c.expect_array();
  std::map<std::string, std::string> seen;  // name -> path of its first definition
  for (size_t i = 0; i < n; ++i) {
    const JsonCursor g = c.element(i);
    g.expect_object({"name", "modules", "cuda_graph"});
    Recipe::Group group;
    const JsonCursor name = g.at("name");
    group.name = name.get_nonempty_string();
    const auto [it, fresh] = seen.emplace(group.name, name.path());
    if (!fresh) name.fail("duplicate group name '" + group.name + "' (first defined at " + it->second + ")");
    const JsonCursor modules = g.at("modules");
    group.modules = parse_patterns(modules);
    if (group.modules.empty()) modules.fail("a group needs at least one module pattern");
    if (auto v = g.find("cuda_graph")) group.cuda_graph = v->get_bool();
    groups.push_back(std::move(group));
  }
}

void parse_rationale(const JsonCursor& c, std::vector<Rationale>& rationale) {
  const size_t n = c.expect_array();
  for (size_t i = 0; i < n; ++i) {
    const JsonCursor r = c.element(i);
    r.expect_object({"decision", "reason", "numbers"});
    Rationale item;
    item.decision = r.at("decision").get_nonempty_string();
    item.reason = r.at("reason").get_nonempty_string();
    if (auto numbers = r.find("numbers")) {
      if (!numbers->value().is_object())
        numbers->fail("expected an object of numbers, got " + describe_json(numbers->value()));
      for (const auto& kv : numbers->value().items()) {
        item.numbers[kv.key()] = JsonCursor(kv.value(), c.file(), numbers->path() + "." + kv.key()).get_number();
      }
    }
    rationale.push_back(std::move(item));
  }
}

nlohmann::json optional_to_json(const std::optional<std::string>& v) {
  return v ? nlohmann::json(*v) : nullptr;
}
nlohmann::json optional_to_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nullptr;
}

nlohmann::json freeze_json(const Recipe::Freeze& f) {
  nlohmann::json presets = nlohmann::json::array();
  for (FreezePreset p : f.presets) presets.push_back(to_string(p));
  return {{"presets", presets}, {"modules", f.modules}};
}

nlohmann::json lora_json(const Recipe::Lora& l) {
  nlohmann::json targets = nlohmann::json::array();
  for (const auto& t : l.targets) targets.push_back({{"modules", t.modules}, {"rank", t.rank}, {"alpha", t.alpha}});
  return {{"preset", l.preset ? nlohmann::json(to_string(*l.preset)) : nlohmann::json(nullptr)}, {"targets", targets}};
}

std::vector<std::string> sorted_unique(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

bool is_default(const Recipe::Freeze& f) {
  return f.presets.empty() && f.modules.empty();
}
bool is_default(const Recipe::Lora& l) {
  return !l.preset && l.targets.empty();
}

const char* to_string(Attention v) {
  return v == Attention::kLean ? "lean" : "materialized";
}
const char* to_string(AttentionBackend v) {
  switch (v) {
    case AttentionBackend::kCudnn:
      return "cudnn";
    case AttentionBackend::kFlash:
      return "flash";
    case AttentionBackend::kSdpa:
      return "sdpa";
    case AttentionBackend::kAuto:
      break;
  }
  return "auto";
}
const char* to_string(Precision v) {
  return v == Precision::kBf16 ? "bf16" : "fp32-master";
}
const char* to_string(Fp8Scaling v) {
  return v == Fp8Scaling::kTensorwise ? "tensorwise" : "delayed";
}
const char* to_string(SavedGegluInputs v) {
  return v == SavedGegluInputs::kBf16 ? "bf16" : "e4m3-blocks";
}
const char* to_string(Fp8GemmAlgorithm v) {
  return v == Fp8GemmAlgorithm::kHeuristic ? "heuristic" : "timed";
}
const char* to_string(ReduceDtype v) {
  return v == ReduceDtype::kBf16 ? "bf16" : "fp32";
}
const char* to_string(StateDtype v) {
  return v == StateDtype::kAuto ? "auto" : "int8-blockwise";
}
const char* to_string(FreezePreset v) {
  return v == FreezePreset::kFreezeVisionEncoder ? "freeze_vision_encoder" : "train_expert_only";
}
const char* to_string(LoraPreset) {
  return "openpi";
}

bool operator==(const Rationale& a, const Rationale& b) {
  return std::tie(a.decision, a.reason, a.numbers) == std::tie(b.decision, b.reason, b.numbers);
}

bool operator==(const Recipe& a, const Recipe& b) {
  auto key = [](const Recipe& r) {
    return std::tie(r.schema, r.model, r.batch.micro_batch, r.batch.grad_accum, r.data.num_images, r.data.trim_text,
                    r.data.trim_multiple, r.model_options.skip_dead, r.model_options.attention,
                    r.model_options.attention_backend, r.model_options.precision, r.model_options.cuda_graph_step,
                    r.recompute.modules, r.fp8.scaling, r.fp8.modules, r.fp8.saved_geglu_inputs, r.fp8.gemm_algorithm,
                    r.freeze.presets, r.freeze.modules, r.lora.preset, r.optimizer.state_dtype,
                    r.distributed.world_size, r.distributed.reduce_dtype, r.distributed.shard_optimizer_state,
                    r.tuned_on.gpu, r.tuned_on.torch, r.tuned_on.profile, r.predicted.step_ms, r.predicted.peak_gib,
                    r.predicted.samples_per_s, r.rationale);
  };
  if (key(a) != key(b) || a.groups.size() != b.groups.size() || a.lora.targets.size() != b.lora.targets.size())
    return false;
  for (size_t i = 0; i < a.lora.targets.size(); ++i) {
    const auto& x = a.lora.targets[i];
    const auto& y = b.lora.targets[i];
    if (std::tie(x.modules, x.rank, x.alpha) != std::tie(y.modules, y.rank, y.alpha)) return false;
  }
  for (size_t i = 0; i < a.groups.size(); ++i) {
    const auto& x = a.groups[i];
    const auto& y = b.groups[i];
    if (std::tie(x.name, x.modules, x.cuda_graph) != std::tie(y.name, y.modules, y.cuda_graph)) return false;
  }
  return true;
}

Recipe parse_recipe(const nlohmann::json& j, const std::string& file) {
  Recipe r;
  const JsonCursor root(j, file);
  root.expect_object({"schema", "model", "batch", "data", "model_options", "recompute", "fp8", "freeze", "lora",
                      "groups", "optimizer", "distributed", "tuned_on", "predicted", "rationale"});
  if (auto v = root.find("schema")) {
    r.schema = v->get_string();
    if (r.schema != kRecipeSchema) {
      v->fail(std::string("expected \"") + kRecipeSchema + "\", got " + describe_json(v->value()) +
              " (a recipe for another schema version)");
    }
  }
  if (auto v = root.find("model")) r.model = v->get_enum({"pi05"});
  if (auto v = root.find("batch")) parse_batch(*v, r.batch);
  if (auto v = root.find("data")) parse_data(*v, r.data);
  if (auto v = root.find("model_options")) parse_model_options(*v, r.model_options);
  if (auto v = root.find("recompute")) {
    v->expect_object({"modules"});
    if (auto m = v->find("modules")) r.recompute.modules = parse_patterns(*m);
  }
  if (auto v = root.find("fp8")) {
    v->expect_object({"scaling", "modules", "saved_geglu_inputs", "gemm_algorithm"});
    if (auto s = v->find("scaling"))
      r.fp8.scaling =
          s->get_enum({"tensorwise", "delayed"}) == "delayed" ? Fp8Scaling::kDelayed : Fp8Scaling::kTensorwise;
    if (auto m = v->find("modules")) r.fp8.modules = parse_patterns(*m);
    if (auto g = v->find("saved_geglu_inputs"))
      r.fp8.saved_geglu_inputs = g->get_enum({"bf16", "e4m3-blocks"}) == "e4m3-blocks" ? SavedGegluInputs::kE4m3Blocks
                                                                                       : SavedGegluInputs::kBf16;
    if (auto g = v->find("gemm_algorithm"))
      r.fp8.gemm_algorithm =
          g->get_enum({"heuristic", "timed"}) == "timed" ? Fp8GemmAlgorithm::kTimed : Fp8GemmAlgorithm::kHeuristic;
  }
  if (auto v = root.find("freeze")) parse_freeze(*v, r.freeze);
  if (auto v = root.find("lora")) parse_lora(*v, r.lora);
  if (auto v = root.find("groups")) parse_groups(*v, r.groups);
  if (auto v = root.find("optimizer")) {
    v->expect_object({"state_dtype"});
    if (auto d = v->find("state_dtype")) {
      r.optimizer.state_dtype =
          d->get_enum({"auto", "int8-blockwise"}) == "auto" ? StateDtype::kAuto : StateDtype::kInt8Blockwise;
    }
  }
  if (auto v = root.find("distributed")) {
    v->expect_object({"world_size", "reduce_dtype", "shard_optimizer_state"});
    if (auto w = v->find("world_size")) r.distributed.world_size = get_size(*w);
    if (auto d = v->find("reduce_dtype")) {
      r.distributed.reduce_dtype = d->get_enum({"bf16", "fp32"}) == "bf16" ? ReduceDtype::kBf16 : ReduceDtype::kFp32;
    }
    if (auto b = v->find("shard_optimizer_state")) r.distributed.shard_optimizer_state = b->get_bool();
  }
  if (auto v = root.find("tuned_on")) {
    v->expect_object({"gpu", "torch", "profile"});
    if (auto s = v->find("gpu")) r.tuned_on.gpu = s->get_optional_string();
    if (auto s = v->find("torch")) r.tuned_on.torch = s->get_optional_string();
    if (auto s = v->find("profile")) r.tuned_on.profile = s->get_optional_string();
  }
  if (auto v = root.find("predicted")) {
    v->expect_object({"step_ms", "peak_gib", "samples_per_s"});
    if (auto x = v->find("step_ms")) r.predicted.step_ms = x->get_optional_number(0.0);
    if (auto x = v->find("peak_gib")) r.predicted.peak_gib = x->get_optional_number(0.0);
    if (auto x = v->find("samples_per_s")) r.predicted.samples_per_s = x->get_optional_number(0.0);
  }
  if (auto v = root.find("rationale")) parse_rationale(*v, r.rationale);
  return r;
}

Recipe read_recipe(const std::string& path) {
  return parse_recipe(read_json_file(path), path);
}

nlohmann::json recipe_to_json(const Recipe& r) {
  using nlohmann::json;
  json groups = json::array();
  for (const auto& g : r.groups)
    groups.push_back({{"name", g.name}, {"modules", g.modules}, {"cuda_graph", g.cuda_graph}});
  json rationale = json::array();
  for (const auto& item : r.rationale) {
    json numbers = json::object();
    for (const auto& [name, value] : item.numbers) numbers[name] = value;
    rationale.push_back({{"decision", item.decision}, {"reason", item.reason}, {"numbers", numbers}});
  }
  json out = {
      {"schema", r.schema},
      {"model", r.model},
      {"batch", {{"micro_batch", r.batch.micro_batch}, {"grad_accum", r.batch.grad_accum}}},
      {"data",
       {{"num_images", r.data.num_images ? json(*r.data.num_images) : json(nullptr)},
        {"trim_text", r.data.trim_text},
        {"trim_multiple", r.data.trim_multiple}}},
      {"model_options",
       {{"skip_dead", r.model_options.skip_dead},
        {"attention", to_string(r.model_options.attention)},
        {"precision", to_string(r.model_options.precision)}}},
      {"recompute", {{"modules", r.recompute.modules}}},
      {"fp8", {{"scaling", to_string(r.fp8.scaling)}, {"modules", r.fp8.modules}}},
      {"groups", groups},
      {"distributed",
       {{"world_size", r.distributed.world_size}, {"reduce_dtype", to_string(r.distributed.reduce_dtype)}}},
      {"tuned_on",
       {{"gpu", optional_to_json(r.tuned_on.gpu)},
        {"torch", optional_to_json(r.tuned_on.torch)},
        {"profile", optional_to_json(r.tuned_on.profile)}}},
      {"predicted",
       {{"step_ms", optional_to_json(r.predicted.step_ms)},
        {"peak_gib", optional_to_json(r.predicted.peak_gib)},
        {"samples_per_s", optional_to_json(r.predicted.samples_per_s)}}},
      {"rationale", rationale},
  };
  // Written only when not the default: the default recipe stays DESIGN.md's block, and its hash stays what runs
  // stored.
  if (r.model_options.cuda_graph_step) out["model_options"]["cuda_graph"] = "step";
  if (r.model_options.attention_backend != AttentionBackend::kAuto)
    out["model_options"]["attention_backend"] = to_string(r.model_options.attention_backend);
  if (r.optimizer.state_dtype != StateDtype::kAuto)
    out["optimizer"] = {{"state_dtype", to_string(r.optimizer.state_dtype)}};
  if (r.distributed.shard_optimizer_state) out["distributed"]["shard_optimizer_state"] = true;
  if (r.fp8.saved_geglu_inputs != SavedGegluInputs::kBf16)
    out["fp8"]["saved_geglu_inputs"] = to_string(r.fp8.saved_geglu_inputs);
  if (r.fp8.gemm_algorithm != Fp8GemmAlgorithm::kHeuristic)
    out["fp8"]["gemm_algorithm"] = to_string(r.fp8.gemm_algorithm);
  if (!is_default(r.freeze)) out["freeze"] = freeze_json(r.freeze);
  if (!is_default(r.lora)) out["lora"] = lora_json(r.lora);
  return out;
}

void write_recipe(const Recipe& recipe, const std::string& path) {
  const nlohmann::json j = recipe_to_json(recipe);
  parse_recipe(j, path);  // refuse to write what could not be read back
  write_file_atomic(path, dump_json_file(j));
}

namespace {

// The part of the canonical JSON that recipe_hash covers: pattern lists sorted and deduplicated, provenance and
// prediction left out.
Recipe canonical_selection(const Recipe& recipe) {
  Recipe canonical = recipe;
  canonical.recompute.modules = sorted_unique(canonical.recompute.modules);
  canonical.fp8.modules = sorted_unique(canonical.fp8.modules);
  canonical.freeze.modules = sorted_unique(canonical.freeze.modules);
  std::sort(canonical.freeze.presets.begin(), canonical.freeze.presets.end());
  canonical.freeze.presets.erase(std::unique(canonical.freeze.presets.begin(), canonical.freeze.presets.end()),
                                 canonical.freeze.presets.end());
  for (auto& t : canonical.lora.targets) t.modules = sorted_unique(t.modules);
  for (auto& g : canonical.groups) g.modules = sorted_unique(g.modules);
  return canonical;
}

nlohmann::json hashed_json(const Recipe& recipe) {
  nlohmann::json j = recipe_to_json(canonical_selection(recipe));
  j.erase("tuned_on");
  j.erase("predicted");
  j.erase("rationale");
  return j;
}

std::string short_json(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

void json_differences(const nlohmann::json& a, const nlohmann::json& b, const std::string& path,
                      std::vector<std::string>& out) {
  auto member = [&path](const std::string& key) { return path.empty() ? key : path + "." + key; };
  if (a.is_object() && b.is_object()) {
    std::vector<std::string> keys;
    for (const auto& item : a.items()) keys.push_back(item.key());
    for (const auto& item : b.items())
      if (!a.contains(item.key())) keys.push_back(item.key());
    std::sort(keys.begin(), keys.end());
    for (const std::string& key : keys) {
      if (!a.contains(key)) {
        out.push_back(member(key) + ": absent vs " + short_json(b.at(key)));
      } else if (!b.contains(key)) {
        out.push_back(member(key) + ": " + short_json(a.at(key)) + " vs absent");
      } else {
        json_differences(a.at(key), b.at(key), member(key), out);
      }
    }
    return;
  }
  auto all_strings = [](const nlohmann::json& v) {
    return std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) { return e.is_string(); });
  };
  if (a.is_array() && b.is_array() && all_strings(a) && all_strings(b)) {
    // Pattern lists: the selection is the set (recipe_hash sorts them).
    std::string change;
    for (const auto& e : b)
      if (std::find(a.begin(), a.end(), e) == a.end()) change += (change.empty() ? "added " : ", ") + e.dump();
    std::string removed;
    for (const auto& e : a)
      if (std::find(b.begin(), b.end(), e) == b.end()) removed += (removed.empty() ? "removed " : ", ") + e.dump();
    if (!removed.empty()) change += (change.empty() ? "" : "; ") + removed;
    if (!change.empty()) out.push_back(path + ": " + change);
    return;
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size())
      out.push_back(path + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " entries");
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      json_differences(a[i], b[i], path + "[" + std::to_string(i) + "]", out);
    return;
  }
  if (a != b) out.push_back(path + ": " + short_json(a) + " vs " + short_json(b));
}

}  // namespace

std::string recipe_hash(const Recipe& recipe) {
  // nlohmann::json objects are std::map-backed, so dump() emits sorted keys: the text is canonical.
  const std::string text = hashed_json(recipe).dump();
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;  // FNV-1a 64 prime
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::vector<std::string> recipe_differences(const Recipe& a, const Recipe& b) {
  nlohmann::json ja = hashed_json(a), jb = hashed_json(b);
  // recipe_to_json writes cuda_graph only when on; name it either way.
  ja["model_options"]["cuda_graph"] = a.model_options.cuda_graph_step ? "step" : "off";
  jb["model_options"]["cuda_graph"] = b.model_options.cuda_graph_step ? "step" : "off";
  ja["distributed"]["shard_optimizer_state"] = a.distributed.shard_optimizer_state;  // written only when true
  jb["distributed"]["shard_optimizer_state"] = b.distributed.shard_optimizer_state;
  ja["fp8"]["saved_geglu_inputs"] = to_string(a.fp8.saved_geglu_inputs);  // written only when not bf16
  jb["fp8"]["saved_geglu_inputs"] = to_string(b.fp8.saved_geglu_inputs);
  ja["fp8"]["gemm_algorithm"] = to_string(a.fp8.gemm_algorithm);  // written only when not heuristic
  jb["fp8"]["gemm_algorithm"] = to_string(b.fp8.gemm_algorithm);
  // freeze and lora are written only when set; compare their full forms when either side has one.
  const Recipe ca = canonical_selection(a), cb = canonical_selection(b);
  if (ja.contains("freeze") || jb.contains("freeze")) {
    ja["freeze"] = freeze_json(ca.freeze);
    jb["freeze"] = freeze_json(cb.freeze);
  }
  if (ja.contains("lora") || jb.contains("lora")) {
    ja["lora"] = lora_json(ca.lora);
    jb["lora"] = lora_json(cb.lora);
  }
  std::vector<std::string> out;
  json_differences(ja, jb, "", out);
  return out;
}

}  // namespace vlatune::formats
