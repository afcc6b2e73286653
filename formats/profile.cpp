#include "formats/profile.h"

#include <sys/stat.h>

#include <cmath>
#include <regex>
#include <set>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"

namespace vlatune::formats {

namespace {

const std::set<std::string>& kernel_categories() {
  static const std::set<std::string> categories = {"gemm",   "attention", "elementwise",   "reduction", "optimizer",
                                                   "memcpy", "memset",    "communication", "other"};
  return categories;
}

template <class T>
nlohmann::json optional_to_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::vector<std::string> parse_string_list(const JsonCursor& c, bool nonempty) {
  const size_t n = c.expect_array();
  if (nonempty && n == 0) c.fail("expected a non-empty array");
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(c.element(i).get_nonempty_string());
  return out;
}

// "major.minor", e.g. "8.9".
ComputeCapability parse_compute_capability(const JsonCursor& c) {
  const std::string text = c.get_string();
  static const std::regex form(R"(([1-9][0-9]?)\.([0-9]))");
  std::smatch m;
  if (!std::regex_match(text, m, form))
    c.fail("expected a compute capability \"major.minor\" such as \"8.9\", got \"" + text + "\"");
  return {std::stoi(m[1].str()), std::stoi(m[2].str())};
}

ProfileSettings parse_settings(const JsonCursor& c) {
  c.expect_object(
      {"device", "tracer", "data", "steps", "warmup", "gpu_memory_gib", "compute_capability", "workload", "degraded"});
  ProfileSettings s;
  s.device = c.at("device").get_enum({"cuda", "cpu"});
  if (const auto w = c.find("workload")) s.workload = w->get_enum({"train", "inference"});
  if (const auto cc = c.find("compute_capability"); cc && !cc->value().is_null())
    s.compute_capability = parse_compute_capability(*cc);
  s.tracer = c.at("tracer").get_enum({"cupti", "cpu", "none"});
  s.data = c.at("data").get_nonempty_string();
  s.steps = c.at("steps").get_int(0);
  s.warmup = c.at("warmup").get_int(0);
  s.gpu_memory_gib = c.at("gpu_memory_gib").get_optional_number(0.0);
  s.degraded = parse_string_list(c.at("degraded"), false);
  return s;
}

ModuleCost parse_module(const JsonCursor& c) {
  c.expect_object({"fqn", "kind", "forward_ms", "backward_ms", "recompute_ms", "self_ms", "kernels", "activation_bytes",
                   "output_bytes", "parameter_bytes", "recomputed"});
  ModuleCost m;
  m.fqn = c.at("fqn").get_nonempty_string();
  m.kind = c.at("kind").get_nonempty_string();
  m.forward_ms = c.at("forward_ms").get_number(0.0);
  m.backward_ms = c.at("backward_ms").get_number(0.0);
  m.recompute_ms = c.at("recompute_ms").get_number(0.0);
  m.self_ms = c.at("self_ms").get_number(0.0);
  m.kernels = c.at("kernels").get_int(0);
  m.activation_bytes = c.at("activation_bytes").get_int(0);
  m.output_bytes = c.at("output_bytes").get_int(0);
  m.parameter_bytes = c.at("parameter_bytes").get_int(0);
  m.recomputed = c.at("recomputed").get_bool();
  return m;
}

KernelSite parse_kernel_site(const JsonCursor& c) {
  c.expect_object({"module", "phase", "calls", "ms"});
  KernelSite s;
  s.module = c.at("module").get_nonempty_string();
  const JsonCursor phase = c.at("phase");
  s.phase = phase.get_string();
  static const std::set<std::string> phases = {"forward", "backward", "recompute", "optimizer", "other"};
  if (phases.count(s.phase) == 0)
    phase.fail("expected one of: forward, backward, recompute, optimizer, other; got " + describe_json(phase.value()));
  s.calls = c.at("calls").get_number(0.0);
  s.ms = c.at("ms").get_number(0.0);
  return s;
}

KernelStat parse_kernel(const JsonCursor& c) {
  c.expect_object({"name", "category", "calls", "ms", "sites"});
  KernelStat k;
  k.name = c.at("name").get_nonempty_string();
  const JsonCursor category = c.at("category");
  k.category = category.get_string();
  if (kernel_categories().count(k.category) == 0) {
    std::string list;
    for (const auto& name : kernel_categories()) list += (list.empty() ? "" : ", ") + name;
    category.fail("expected one of: " + list + "; got " + describe_json(category.value()));
  }
  k.calls = c.at("calls").get_number(0.0);
  k.ms = c.at("ms").get_number(0.0);
  if (const auto sites = c.find("sites")) {
    const size_t n = sites->expect_array();
    if (n > kMaxKernelSites)
      sites->fail("expected at most " + std::to_string(kMaxKernelSites) + " sites, got " + std::to_string(n));
    for (size_t i = 0; i < n; ++i) k.sites.push_back(parse_kernel_site(sites->element(i)));
  }
  return k;
}

std::vector<KernelStat> parse_kernels(const JsonCursor& c) {
  std::vector<KernelStat> out;
  const size_t n = c.expect_array();
  for (size_t i = 0; i < n; ++i) out.push_back(parse_kernel(c.element(i)));
  return out;
}

Attribution parse_attribution(const JsonCursor& c) {
  c.expect_object({"gpu_ms", "attributed_fraction", "dropped_records", "unattributed"});
  Attribution a;
  a.gpu_ms = c.at("gpu_ms").get_number(0.0);
  const JsonCursor fraction = c.at("attributed_fraction");
  a.attributed_fraction = fraction.get_number(0.0);
  if (a.attributed_fraction > 1.0 + 1e-9)
    fraction.fail("expected a fraction in 0..1, got " + describe_json(fraction.value()));
  a.dropped_records = c.at("dropped_records").get_int(0);
  a.unattributed = parse_kernels(c.at("unattributed"));
  return a;
}

MemoryStats parse_memory(const JsonCursor& c) {
  c.expect_object({"parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "peak_gib_by_phase"});
  MemoryStats m;
  m.parameter_bytes = c.at("parameter_bytes").get_optional_int(0);
  m.gradient_bytes = c.at("gradient_bytes").get_optional_int(0);
  m.optimizer_bytes = c.at("optimizer_bytes").get_optional_int(0);
  m.activation_bytes = c.at("activation_bytes").get_optional_int(0);
  const JsonCursor peaks = c.at("peak_gib_by_phase");
  peaks.expect_object({"forward", "backward", "optimizer"});
  for (const char* phase : {"forward", "backward", "optimizer"}) {
    if (auto v = peaks.find(phase)) m.peak_gib_by_phase[phase] = v->get_number(0.0);
  }
  return m;
}

RecomputeCandidate parse_candidate(const JsonCursor& c) {
  c.expect_object({"name", "patterns", "added", "step_ms_delta", "peak_gib_delta", "ms_per_gib_saved"});
  RecomputeCandidate r;
  r.name = c.at("name").get_nonempty_string();
  r.patterns = parse_string_list(c.at("patterns"), true);
  r.added = c.at("added").get_bool();
  r.step_ms_delta = c.at("step_ms_delta").get_number();
  r.peak_gib_delta = c.at("peak_gib_delta").get_number();
  r.ms_per_gib_saved = c.at("ms_per_gib_saved").get_optional_number();
  return r;
}

std::vector<double> parse_samples(const JsonCursor& c) {
  std::vector<double> out;
  const size_t n = c.expect_array();
  for (size_t i = 0; i < n; ++i) out.push_back(c.element(i).get_number(0.0));
  return out;
}

// Optional (profiles before it lack it: unknown, not 0); when present, both keys, one sample per timed step.
void parse_data_wait(const JsonCursor& c, BatchProfile& b) {
  if (!c.find("data_wait_ms") && !c.find("data_wait_ms_samples")) return;
  b.data_wait_ms = c.at("data_wait_ms").get_number(0.0);
  const JsonCursor samples = c.at("data_wait_ms_samples");
  b.data_wait_ms_samples = parse_samples(samples);
  if (b.data_wait_ms_samples.size() != b.step_ms_samples.size()) {
    samples.fail("expected " + std::to_string(b.step_ms_samples.size()) +
                 " entries (one per step_ms_samples entry, the same timed steps), got " +
                 std::to_string(b.data_wait_ms_samples.size()));
  }
}

BatchProfile parse_batch(const JsonCursor& c) {
  c.expect_object({"batch", "step_ms", "step_ms_samples", "data_wait_ms", "data_wait_ms_samples", "peak_gib", "memory",
                   "modules", "kernels", "attribution", "recompute"});
  BatchProfile b;
  b.batch = c.at("batch").get_int(1, int64_t{1} << 20);
  const JsonCursor step_ms = c.at("step_ms");
  b.step_ms = step_ms.get_number(0.0);
  if (b.step_ms <= 0) step_ms.fail("expected a step time > 0 ms, got 0");
  const JsonCursor samples = c.at("step_ms_samples");
  b.step_ms_samples = parse_samples(samples);
  if (b.step_ms_samples.empty()) samples.fail("expected at least one timed step");
  parse_data_wait(c, b);
  b.peak_gib = c.at("peak_gib").get_optional_number(0.0);
  b.memory = parse_memory(c.at("memory"));

  const JsonCursor modules = c.at("modules");
  std::set<std::string> seen;
  const size_t nm = modules.expect_array();
  for (size_t i = 0; i < nm; ++i) {
    const JsonCursor e = modules.element(i);
    ModuleCost m = parse_module(e);
    if (!seen.insert(m.fqn).second) e.at("fqn").fail("module '" + m.fqn + "' listed twice");
    b.modules.push_back(std::move(m));
  }
  b.kernels = parse_kernels(c.at("kernels"));
  b.attribution = parse_attribution(c.at("attribution"));
  const JsonCursor recompute = c.at("recompute");
  const size_t nr = recompute.expect_array();
  for (size_t i = 0; i < nr; ++i) b.recompute.push_back(parse_candidate(recompute.element(i)));
  return b;
}

GemmTimes parse_gemm_times(const JsonCursor& c) {
  c.expect_object({"forward_ms", "grad_input_ms", "grad_weight_ms"});
  GemmTimes t;
  t.forward_ms = c.at("forward_ms").get_number(0.0);
  t.grad_input_ms = c.at("grad_input_ms").get_number(0.0);
  t.grad_weight_ms = c.at("grad_weight_ms").get_number(0.0);
  return t;
}

GemmEntry parse_gemm(const JsonCursor& c) {
  c.expect_object({"name", "members", "m", "k", "n", "bf16", "fp8", "quant_ms", "recomputed"});
  GemmEntry g;
  g.name = c.at("name").get_nonempty_string();
  g.members = parse_string_list(c.at("members"), true);
  g.m = c.at("m").get_int(1);
  g.k = c.at("k").get_int(1);
  g.n = c.at("n").get_int(1);
  g.bf16 = parse_gemm_times(c.at("bf16"));
  const JsonCursor fp8 = c.at("fp8");
  if (!fp8.is_null()) g.fp8 = parse_gemm_times(fp8);
  g.quant_ms = c.at("quant_ms").get_optional_number(0.0);
  g.recomputed = c.at("recomputed").get_bool();
  return g;
}

Communication parse_communication(const JsonCursor& c) {
  c.expect_object({"world_size", "allreduce_gbps", "exposed_ms", "groups"});
  Communication m;
  m.world_size = static_cast<int>(c.at("world_size").get_int(2, int64_t{1} << 20));
  m.allreduce_gbps = c.at("allreduce_gbps").get_number(0.0);
  m.exposed_ms = c.at("exposed_ms").get_number(0.0);
  const JsonCursor groups = c.at("groups");
  const size_t n = groups.expect_array();
  for (size_t i = 0; i < n; ++i) {
    const JsonCursor e = groups.element(i);
    e.expect_object({"name", "bytes", "allreduce_ms"});
    m.groups.push_back(
        {e.at("name").get_nonempty_string(), e.at("bytes").get_int(0), e.at("allreduce_ms").get_number(0.0)});
  }
  return m;
}

nlohmann::json kernels_to_json(const std::vector<KernelStat>& kernels) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& k : kernels) {
    nlohmann::json j = {{"name", k.name}, {"category", k.category}, {"calls", k.calls}, {"ms", k.ms}};
    if (!k.sites.empty()) {
      j["sites"] = nlohmann::json::array();
      for (const auto& s : k.sites)
        j["sites"].push_back({{"module", s.module}, {"phase", s.phase}, {"calls", s.calls}, {"ms", s.ms}});
    }
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json gemm_times_to_json(const GemmTimes& t) {
  return {{"forward_ms", t.forward_ms}, {"grad_input_ms", t.grad_input_ms}, {"grad_weight_ms", t.grad_weight_ms}};
}

nlohmann::json batch_to_json(const BatchProfile& b) {
  nlohmann::json modules = nlohmann::json::array();
  for (const auto& m : b.modules) {
    modules.push_back({{"fqn", m.fqn},
                       {"kind", m.kind},
                       {"forward_ms", m.forward_ms},
                       {"backward_ms", m.backward_ms},
                       {"recompute_ms", m.recompute_ms},
                       {"self_ms", m.self_ms},
                       {"kernels", m.kernels},
                       {"activation_bytes", m.activation_bytes},
                       {"output_bytes", m.output_bytes},
                       {"parameter_bytes", m.parameter_bytes},
                       {"recomputed", m.recomputed}});
  }
  nlohmann::json recompute = nlohmann::json::array();
  for (const auto& r : b.recompute) {
    recompute.push_back({{"name", r.name},
                         {"patterns", r.patterns},
                         {"added", r.added},
                         {"step_ms_delta", r.step_ms_delta},
                         {"peak_gib_delta", r.peak_gib_delta},
                         {"ms_per_gib_saved", optional_to_json(r.ms_per_gib_saved)}});
  }
  nlohmann::json peaks = nlohmann::json::object();
  for (const auto& [phase, gib] : b.memory.peak_gib_by_phase) peaks[phase] = gib;
  return {{"batch", b.batch},
          {"step_ms", b.step_ms},
          {"step_ms_samples", b.step_ms_samples},
          {"peak_gib", optional_to_json(b.peak_gib)},
          {"memory",
           {{"parameter_bytes", optional_to_json(b.memory.parameter_bytes)},
            {"gradient_bytes", optional_to_json(b.memory.gradient_bytes)},
            {"optimizer_bytes", optional_to_json(b.memory.optimizer_bytes)},
            {"activation_bytes", optional_to_json(b.memory.activation_bytes)},
            {"peak_gib_by_phase", peaks}}},
          {"modules", modules},
          {"kernels", kernels_to_json(b.kernels)},
          {"attribution",
           {{"gpu_ms", b.attribution.gpu_ms},
            {"attributed_fraction", b.attribution.attributed_fraction},
            {"dropped_records", b.attribution.dropped_records},
            {"unattributed", kernels_to_json(b.attribution.unattributed)}}},
          {"recompute", recompute}};
}

// Absent, not null, when not measured: what profiles written before data_wait_ms hold.
nlohmann::json with_data_wait(nlohmann::json batch, const BatchProfile& b) {
  if (b.data_wait_ms) {
    batch["data_wait_ms"] = *b.data_wait_ms;
    batch["data_wait_ms_samples"] = b.data_wait_ms_samples;
  }
  return batch;
}

}  // namespace

Profile parse_profile(const nlohmann::json& j, const std::string& file) {
  const JsonCursor root(j, file);
  root.expect_object(
      {"schema", "environment", "settings", "recipe", "recomputable", "batches", "gemms", "overhead", "communication"});
  Profile p;
  const JsonCursor schema = root.at("schema");
  p.schema = schema.get_string();
  if (p.schema != kProfileSchema) {
    schema.fail(std::string("expected \"") + kProfileSchema + "\", got " + describe_json(schema.value()));
  }
  p.environment = parse_environment(root.at("environment"));
  p.settings = parse_settings(root.at("settings"));
  // The embedded recipe goes through the recipe reader; re-root its errors at $.recipe.
  try {
    p.recipe = parse_recipe(root.at("recipe").value(), file);
  } catch (const FormatError& e) {
    const std::string inner = e.json_path().empty() ? "" : e.json_path().substr(1);
    throw FormatError(file, "$.recipe" + inner, e.reason());
  }

  p.recomputable = parse_string_list(root.at("recomputable"), false);
  const JsonCursor batches = root.at("batches");
  const size_t nb = batches.expect_array();
  if (nb == 0) batches.fail("expected at least one profiled batch size");
  std::set<int64_t> sizes;
  for (size_t i = 0; i < nb; ++i) {
    const JsonCursor e = batches.element(i);
    BatchProfile b = parse_batch(e);
    if (!sizes.insert(b.batch).second) e.at("batch").fail("batch " + std::to_string(b.batch) + " profiled twice");
    if (i > 0 && b.batch > p.batches[0].batch) {
      e.at("batch").fail("batch " + std::to_string(b.batch) + " is larger than batches[0] (" +
                         std::to_string(p.batches[0].batch) + "): the requested batch comes first");
    }
    p.batches.push_back(std::move(b));
  }
  const JsonCursor gemms = root.at("gemms");
  const size_t ng = gemms.expect_array();
  std::set<std::string> names;
  for (size_t i = 0; i < ng; ++i) {
    const JsonCursor e = gemms.element(i);
    GemmEntry g = parse_gemm(e);
    if (!names.insert(g.name).second) e.at("name").fail("GEMM '" + g.name + "' listed twice");
    p.gemms.push_back(std::move(g));
  }
  const JsonCursor overhead = root.at("overhead");
  if (!overhead.is_null()) {
    overhead.expect_object({"untraced_step_ms", "traced_step_ms", "fraction"});
    Overhead o;
    o.untraced_step_ms = overhead.at("untraced_step_ms").get_number(0.0);
    o.traced_step_ms = overhead.at("traced_step_ms").get_number(0.0);
    overhead.at("fraction").get_number();  // derived; checked for type only
    p.overhead = o;
  }
  const JsonCursor communication = root.at("communication");
  if (!communication.is_null()) p.communication = parse_communication(communication);
  return p;
}

Profile read_profile(const std::string& path) {
  return parse_profile(read_json_file(path), path);
}

std::string profile_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return path;
  return path + (!path.empty() && path.back() == '/' ? "" : "/") + "profile.json";
}

nlohmann::json profile_to_json(const Profile& p) {
  nlohmann::json batches = nlohmann::json::array();
  for (const auto& b : p.batches) batches.push_back(with_data_wait(batch_to_json(b), b));
  nlohmann::json gemms = nlohmann::json::array();
  for (const auto& g : p.gemms) {
    gemms.push_back({{"name", g.name},
                     {"members", g.members},
                     {"m", g.m},
                     {"k", g.k},
                     {"n", g.n},
                     {"bf16", gemm_times_to_json(g.bf16)},
                     {"fp8", g.fp8 ? gemm_times_to_json(*g.fp8) : nlohmann::json(nullptr)},
                     {"quant_ms", optional_to_json(g.quant_ms)},
                     {"recomputed", g.recomputed}});
  }
  nlohmann::json overhead = nullptr;
  if (p.overhead) {
    overhead = {{"untraced_step_ms", p.overhead->untraced_step_ms},
                {"traced_step_ms", p.overhead->traced_step_ms},
                {"fraction", p.overhead->fraction()}};
  }
  nlohmann::json communication = nullptr;
  if (p.communication) {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : p.communication->groups) {
      groups.push_back({{"name", g.name}, {"bytes", g.bytes}, {"allreduce_ms", g.allreduce_ms}});
    }
    communication = {{"world_size", p.communication->world_size},
                     {"allreduce_gbps", p.communication->allreduce_gbps},
                     {"exposed_ms", p.communication->exposed_ms},
                     {"groups", groups}};
  }
  const ProfileSettings& s = p.settings;
  return {{"schema", p.schema},
          {"environment", environment_to_json(p.environment)},
          {"settings",
           {{"device", s.device},
            {"tracer", s.tracer},
            {"data", s.data},
            {"steps", s.steps},
            {"warmup", s.warmup},
            {"gpu_memory_gib", optional_to_json(s.gpu_memory_gib)},
            {"compute_capability",
             s.compute_capability ? nlohmann::json(s.compute_capability->to_string()) : nlohmann::json(nullptr)},
            {"workload", s.workload},
            {"degraded", s.degraded}}},
          {"recipe", recipe_to_json(p.recipe)},
          {"recomputable", p.recomputable},
          {"batches", batches},
          {"gemms", gemms},
          {"overhead", overhead},
          {"communication", communication}};
}

void write_profile(const Profile& profile, const std::string& path) {
  const nlohmann::json j = profile_to_json(profile);
  parse_profile(j, path);
  write_file_atomic(path, dump_json_file(j));
}

}  // namespace vlatune::formats
