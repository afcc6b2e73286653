// A kernels::MergedRebuild carried by an autograd node (GeGLU+down in bf16, kernels/geglu_autograd.cpp, and in FP8,
// model/float8_linear.cpp): the forward keeps the rebuild's tensors instead of `merged` and its function in the
// node's saved_data; the backward reads `merged` back, kept or rebuilt.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kernels/fused_ops.h"

namespace vlatune::kernels {

// The rebuild function in a capsule (saved_data holds IValues only).
struct RebuildHolder : torch::CustomClassHolder {
  std::function<at::Tensor(const std::vector<at::Tensor>&)> fn;
};

// The holder of `rebuild`'s function; null without a rebuild. std::invalid_argument naming `op` when the rebuild
// has no function.
c10::intrusive_ptr<RebuildHolder> rebuild_holder(const MergedRebuild* rebuild, const std::string& op);

// Forward: remembers `holder` (when not null) in the node.
void remember_rebuild(torch::autograd::AutogradContext* ctx, const c10::intrusive_ptr<RebuildHolder>& holder);

// Backward: saved[0] (the kept merged output), or, for a node that remembered a rebuild, the merged output rebuilt
// from saved[rebuild_first..] (the same GEMM on the same inputs: bit-identical).
at::Tensor kept_or_rebuilt(torch::autograd::AutogradContext* ctx, const std::vector<at::Tensor>& saved,
                           size_t rebuild_first);

}  // namespace vlatune::kernels
