#include "trainer/nccl_info.h"

#ifdef VLATUNE_HAVE_NCCL
#include <nccl.h>
#endif

namespace vlatune::trainer {

std::string nccl_version_text() {
#ifdef VLATUNE_HAVE_NCCL
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "NCCL unavailable (ncclGetVersion failed)";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return "NCCL " + std::to_string(version / 10000) + "." + std::to_string((version % 10000) / 100) + "." +
         std::to_string(version % 100);
#else
  return "NCCL not built (configured without CUDA)";
#endif
}

}  // namespace vlatune::trainer
