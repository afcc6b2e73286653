// NCCL as linked (the wheel's copy, the one torch's c10d uses): its version for `vlatune --version` and
// run fingerprints. Multi-GPU training itself goes through c10d (the multi-GPU issue).
#pragma once

#include <string>

namespace vlatune::trainer {

// "NCCL 2.x.y" from ncclGetVersion, or "NCCL not built (configured without CUDA)".
std::string nccl_version_text();

}  // namespace vlatune::trainer
