// Freezing and LoRA adapters on Pi0.5 (recipe keys `freeze` and `lora`; trainer/recipe_apply.h resolves their
// patterns and presets to the exact FQNs these functions take).
//
// A frozen parameter has requires_grad false: autograd computes no gradient for it (the kernels' nodes skip a
// frozen weight's GEMM), the trainer gives it no optimizer state and leaves it out of the gradient buckets.
//
// A LoRA adapter on a Linear (LinearImpl::add_lora) adds (alpha / rank) (x A^T) B^T to its output, A [rank, in],
// B [out, rank], in the compute dtype, and freezes the Linear's weight and bias. Init: A ~ N(0, 0.01^2), openpi's
// LoRA init_fn; B = 0, as Hu et al. and PEFT (openpi draws B from the same normal), so a fresh adapter leaves the
// model's output exactly the base's. One adapter per Linear, also for the members of a merged GEMM (q/k/v,
// gate/up: each member's own A and B, its columns of the merged output); openpi's JAX einsums give q/k/v one pair
// per head and o_proj a B summed over heads, which has no nn.Linear form: vlatune's adapters are PEFT's.
// The adapters are parameters of their Linear, `<linear>.lora_A` and `<linear>.lora_B`: optimizer, EMA, gradient
// buckets and checkpoints (model.safetensors holds them beside the base weights) see them like any other.
//
// Exports: save_merged_state_dict writes the openpi layout with W + (alpha / rank) B A in place of W and no adapter
// tensors (loadable by load_state_dict as any Pi0.5 weights); save_lora_adapters writes the adapters alone, with
// their modules, ranks and alphas in the safetensors metadata (kLoraMetadataKey), which load_lora_adapters reads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace vlatune::model {

class Pi05Impl;

// Freezes every parameter of the modules named (exact FQNs, e.g. the vision tower). std::invalid_argument naming
// an FQN that is not a module of the model.
void freeze_modules(Pi05Impl& model, const std::vector<std::string>& fqns);

struct LoraSpec {
  std::string module;  // Linear FQN
  int64_t rank = 0;
  double alpha = 0;
};

// Adds an adapter to each Linear named, A drawn in `specs` order from a generator seeded with `seed` on the
// parameters' device. std::invalid_argument naming the module: not a Linear, an FP8 Linear (Pi05Impl::set_fp8),
// already adapted, or a rank outside 1..min(in, out), alpha not finite and > 0.
void add_lora(Pi05Impl& model, const std::vector<LoraSpec>& specs, uint64_t seed);

// The model's adapters, in module order.
std::vector<LoraSpec> lora_adapters(const torch::nn::Module& model);

// The state dict (parameters, then buffers) with every adapter merged into its Linear's weight, W + (alpha / rank)
// B A computed in fp32 and rounded to W's dtype, and no adapter tensors: the openpi layout.
std::vector<std::pair<std::string, torch::Tensor>> merged_state_tensors(const torch::nn::Module& model);
void save_merged_state_dict(const Pi05Impl& model, const std::string& path,
                            const std::map<std::string, std::string>& metadata = {});

// The safetensors metadata key of an adapters file: JSON {"schema": kLoraSchema, "adapters": [{"module": FQN,
// "rank": r, "alpha": a}, ...]}; the tensors are `<module>.lora_A` [r, in] and `<module>.lora_B` [out, r].
inline constexpr const char* kLoraMetadataKey = "vlatune.lora";
inline constexpr const char* kLoraSchema = "vlatune.lora/1";

// Writes the model's adapters alone (the model config in the metadata, as save_state_dict). std::invalid_argument
// when the model has none.
void save_lora_adapters(const Pi05Impl& model, const std::string& path);

// Reads an adapters file into `model`: adds each adapter the metadata lists (a Linear that already has one must
// have the same rank and alpha), then copies A and B in. Validates everything before changing the model:
// formats::FormatError naming the file's metadata entry and the JSON path for a malformed adapter list;
// SafetensorsError naming the file for a missing metadata entry, another config's file, an unknown module, a rank
// above the Linear's smaller dimension, an adapter of another rank or alpha than the model's, a missing,
// unexpected or misshapen tensor.
std::vector<LoraSpec> load_lora_adapters(Pi05Impl& model, const std::string& path);

}  // namespace vlatune::model
