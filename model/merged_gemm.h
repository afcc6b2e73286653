// One GEMM over Linears that read the same input (merged QKV, gate+up), with each member's FP8 choice and LoRA
// adapters: what the training forward and the sampler both run (defined in gemma.cpp).
#pragma once

#include <initializer_list>

#include <torch/torch.h>

#include "kernels/fused_ops.h"
#include "model/layers.h"

namespace vlatune::model {

// FP8 when any member is FP8 (the choice covers the merged GEMM), else kernels::merged_linear; the members' biases
// (all or none) are added, and their LoRA adapters add their part (merged_lora_delta). `rebuild` (optional, no
// biases): filled with how to run the same GEMM again in backward, adapters included.
torch::Tensor merged_gemm(const torch::Tensor& x, std::initializer_list<const LinearImpl*> members,
                          kernels::MergedRebuild* rebuild = nullptr);

}  // namespace vlatune::model
