// Freezing, LoRA adapters and their exports. Contract: model/lora.h.
#include "model/lora.h"

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "model/pi05.h"
#include "model/safetensors_io.h"
#include "model/state_dict.h"

namespace vlatune::model {

namespace {

std::map<std::string, LinearImpl*> linears_by_fqn(const torch::nn::Module& model) {
  std::map<std::string, LinearImpl*> out;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    if (auto* l = dynamic_cast<LinearImpl*>(item.value().get())) out.emplace(item.key(), l);
  return out;
}

std::string tensor_name(const std::string& module, const char* leaf) {
  return module + "." + leaf;
}

std::string shape_str(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

at::Generator seeded_generator(const Pi05Impl& model, uint64_t seed) {
  const auto device = model.action_in_proj->weight.device();
  at::Generator gen =
      at::globalContext().defaultGenerator(device.is_meta() ? torch::Device(torch::kCPU) : device).clone();
  gen.set_current_seed(seed);
  return gen;
}

// The adapters an adapters file lists, validated against the file's own tensors (not yet against a model).
std::vector<LoraSpec> read_adapter_list(const SafetensorsFile& file, const std::string& path) {
  const auto meta = file.metadata().find(kLoraMetadataKey);
  if (meta == file.metadata().end())
    throw SafetensorsError(path, std::string("no '") + kLoraMetadataKey +
                                     "' metadata entry: not a LoRA adapters file (vlatune train writes one as "
                                     "final/adapters.safetensors)");
  const std::string label = path + " metadata '" + kLoraMetadataKey + "'";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(meta->second);
  } catch (const nlohmann::json::parse_error& e) {
    throw SafetensorsError(path, std::string("metadata '") + kLoraMetadataKey + "' is not JSON: " + e.what());
  }
  std::vector<LoraSpec> specs;
  {
    const formats::JsonCursor root(j, label);
    root.expect_object({"schema", "adapters"});
    const formats::JsonCursor schema = root.at("schema");
    if (schema.get_string() != kLoraSchema)
      schema.fail(std::string("expected \"") + kLoraSchema + "\", got " + formats::describe_json(schema.value()));
    const formats::JsonCursor list = root.at("adapters");
    const size_t n = list.expect_array();
    std::set<std::string> seen;
    for (size_t i = 0; i < n; ++i) {
      const formats::JsonCursor e = list.element(i);
      e.expect_object({"module", "rank", "alpha"});
      LoraSpec spec;
      const formats::JsonCursor module = e.at("module");
      spec.module = module.get_nonempty_string();
      if (!seen.insert(spec.module).second) module.fail("adapter '" + spec.module + "' listed twice");
      spec.rank = e.at("rank").get_int(1, int64_t{1} << 20);
      const formats::JsonCursor alpha = e.at("alpha");
      spec.alpha = alpha.get_number(0.0);
      if (!(spec.alpha > 0)) alpha.fail("expected a finite number > 0, got " + formats::describe_json(alpha.value()));
      specs.push_back(std::move(spec));
    }
  }
  std::set<std::string> expected;
  for (const LoraSpec& s : specs) {
    expected.insert(tensor_name(s.module, "lora_A"));
    expected.insert(tensor_name(s.module, "lora_B"));
  }
  for (const auto& entry : file.entries())
    if (!expected.count(entry.name))
      throw SafetensorsError(path, "unexpected tensor '" + entry.name + "' (the metadata lists no adapter for it)");
  return specs;
}

}  // namespace

void freeze_modules(Pi05Impl& model, const std::vector<std::string>& fqns) {
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    modules.emplace(item.key(), item.value());
  for (const std::string& fqn : fqns) {
    auto it = modules.find(fqn);
    if (it == modules.end()) throw std::invalid_argument("freeze: '" + fqn + "' is not a module of the model");
    for (torch::Tensor& p : it->second->parameters()) p.requires_grad_(false);
  }
}

void add_lora(Pi05Impl& model, const std::vector<LoraSpec>& specs, uint64_t seed) {
  const auto linears = linears_by_fqn(model);
  for (const LoraSpec& spec : specs) {
    auto it = linears.find(spec.module);
    if (it == linears.end())
      throw std::invalid_argument("lora: '" + spec.module +
                                  "' is not a Linear module of the model (LoRA adapts Linears)");
    if (it->second->fp8)
      throw std::invalid_argument("lora: '" + spec.module +
                                  "' runs in FP8: LoRA adapters on FP8 Linears are not supported (keep it bf16)");
  }
  at::Generator gen = seeded_generator(model, seed);
  for (const LoraSpec& spec : specs) linears.at(spec.module)->add_lora(spec.rank, spec.alpha, gen);
}

std::vector<LoraSpec> lora_adapters(const torch::nn::Module& model) {
  std::vector<LoraSpec> out;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    if (const auto* l = dynamic_cast<const LinearImpl*>(item.value().get()); l && l->has_lora())
      out.push_back({item.key(), l->lora_rank, l->lora_alpha});
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> merged_state_tensors(const torch::nn::Module& model) {
  std::map<std::string, const LinearImpl*> adapted;  // weight name -> its Linear
  std::set<std::string> adapter_names;
  for (const auto& [fqn, l] : linears_by_fqn(model)) {
    if (!l->has_lora()) continue;
    adapted.emplace(tensor_name(fqn, "weight"), l);
    adapter_names.insert(tensor_name(fqn, "lora_A"));
    adapter_names.insert(tensor_name(fqn, "lora_B"));
  }
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!item.value().defined() || adapter_names.count(item.key())) continue;
    auto it = adapted.find(item.key());
    if (it == adapted.end()) {
      out.emplace_back(item.key(), item.value());
      continue;
    }
    const LinearImpl& l = *it->second;
    const torch::Tensor delta = at::mm(l.lora_B.to(torch::kFloat32), l.lora_A.to(torch::kFloat32)) * l.lora_scale();
    out.emplace_back(item.key(), (l.weight.to(torch::kFloat32) + delta).to(l.weight.scalar_type()));
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true))
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  return out;
}

void save_merged_state_dict(const Pi05Impl& model, const std::string& path,
                            const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> meta = metadata;
  const std::string config = weights_config_name(model);
  if (!config.empty()) meta.emplace(kConfigMetadataKey, config);
  write_safetensors(path, merged_state_tensors(model), meta);
}

void save_lora_adapters(const Pi05Impl& model, const std::string& path) {
  const std::vector<LoraSpec> specs = lora_adapters(model);
  if (specs.empty()) throw std::invalid_argument("save_lora_adapters: the model has no LoRA adapters");
  const auto linears = linears_by_fqn(model);
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const LoraSpec& s : specs) {
    list.push_back({{"module", s.module}, {"rank", s.rank}, {"alpha", s.alpha}});
    const LinearImpl& l = *linears.at(s.module);
    tensors.emplace_back(tensor_name(s.module, "lora_A"), l.lora_A.detach());
    tensors.emplace_back(tensor_name(s.module, "lora_B"), l.lora_B.detach());
  }
  std::map<std::string, std::string> meta = {
      {"format", "pt"}, {kLoraMetadataKey, nlohmann::json{{"schema", kLoraSchema}, {"adapters", list}}.dump()}};
  const std::string config = weights_config_name(model);
  if (!config.empty()) meta.emplace(kConfigMetadataKey, config);
  write_safetensors(path, tensors, meta);
}

std::vector<LoraSpec> load_lora_adapters(Pi05Impl& model, const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const std::string expected_config = weights_config_name(model);
  const auto config = file.metadata().find(kConfigMetadataKey);
  if (!expected_config.empty() && config != file.metadata().end() && config->second != expected_config)
    throw SafetensorsError(
        path, "adapters of the '" + config->second + "' config, but the model is the '" + expected_config + "' config");
  const std::vector<LoraSpec> specs = read_adapter_list(file, path);
  std::map<std::string, const SafetensorsEntry*> entries;
  for (const auto& e : file.entries()) entries.emplace(e.name, &e);
  const auto linears = linears_by_fqn(model);
  std::vector<LoraSpec> to_add;
  for (const LoraSpec& s : specs) {
    auto it = linears.find(s.module);
    if (it == linears.end())
      throw SafetensorsError(path, "adapter for '" + s.module + "', which is not a Linear module of the model");
    const LinearImpl& l = *it->second;
    const int64_t out = l.weight.size(0), in = l.weight.size(1);
    if (s.rank > std::min(in, out))
      throw SafetensorsError(path, "adapter for '" + s.module + "': rank " + std::to_string(s.rank) +
                                       " exceeds the Linear's smaller dimension " + std::to_string(std::min(in, out)));
    if (l.has_lora() && (l.lora_rank != s.rank || l.lora_alpha != s.alpha))
      throw SafetensorsError(path, "adapter for '" + s.module + "' has rank " + std::to_string(s.rank) + ", alpha " +
                                       std::to_string(s.alpha) + "; the model's has rank " +
                                       std::to_string(l.lora_rank) + ", alpha " + std::to_string(l.lora_alpha));
    const std::vector<std::pair<const char*, std::vector<int64_t>>> shapes = {{"lora_A", {s.rank, in}},
                                                                              {"lora_B", {out, s.rank}}};
    for (const auto& [leaf, shape] : shapes) {
      auto e = entries.find(tensor_name(s.module, leaf));
      if (e == entries.end()) throw SafetensorsError(path, "missing tensor '" + tensor_name(s.module, leaf) + "'");
      if (e->second->shape != shape)
        throw SafetensorsError(
            path, "tensor '" + e->first + "' is " + shape_str(e->second->shape) + ", expected " + shape_str(shape));
    }
    if (!l.has_lora()) to_add.push_back(s);
  }
  add_lora(model, to_add, /*seed=*/0);  // A is overwritten below
  torch::NoGradGuard no_grad;
  for (const LoraSpec& s : specs) {
    LinearImpl& l = *linears.at(s.module);
    l.lora_A.copy_(file.tensor(tensor_name(s.module, "lora_A")));
    l.lora_B.copy_(file.tensor(tensor_name(s.module, "lora_B")));
  }
  return specs;
}

}  // namespace vlatune::model
