// Torch-side glue for cudnn_sdpa.h's raw-pointer calls (CUDA builds): a sub-problem's base pointer inside a tensor,
// and workspaces from the caching allocator. Shared by the joint attention (varlen_attention.cpp) and SigLIP's
// (qkv_attention.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <vector>

#include "kernels/cudnn_sdpa.h"

namespace vlatune::kernels {

// `elements` elements past t's data pointer (e.g. the k columns of a merged [.., q | k | v] tensor).
inline char* element_ptr(const at::Tensor& t, int64_t elements) {
  return static_cast<char*>(t.data_ptr()) + elements * static_cast<int64_t>(t.element_size());
}

// The workspaces of the cudnn_sdpa calls made while this object lives: each a byte tensor on `like`'s device, held
// until the calls are queued; the caching allocator then reuses it only in stream order.
class SdpaWorkspaces {
 public:
  explicit SdpaWorkspaces(const at::TensorOptions& like) : options_(like.dtype(at::kByte)) {}
  SdpaWorkspace allocator() {
    return [this](size_t bytes) {
      held_.push_back(at::empty({static_cast<int64_t>(bytes)}, options_));
      return held_.back().data_ptr();
    };
  }

 private:
  at::TensorOptions options_;
  std::vector<at::Tensor> held_;
};

}  // namespace vlatune::kernels
