// Which kernels run the lean attention on CUDA (the recipe's model_options.attention_backend). Torch-free.
#pragma once

namespace vlatune::kernels {

// kAuto: cuDNN's padding-mask SDPA for the joint attention where it builds, else FlashAttention-2 varlen, else SDPA
// with the mask tensor; SigLIP's self-attention on cuDNN where it builds. kCudnn: as kAuto, but the joint attention
// on cuDNN or an error. kFlash: the joint attention on FlashAttention-2 varlen, SigLIP's on SDPA. kSdpa: the joint
// attention on SDPA with the mask tensor (SigLIP's as kAuto).
enum class AttentionBackend { kAuto, kCudnn, kFlash, kSdpa };

}  // namespace vlatune::kernels
