#include "trainer/memory_cap.h"

#include <ATen/Context.h>

#include <cmath>
#include <iomanip>
#include <sstream>

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "trainer/train_loop.h"

namespace vlatune::trainer {

namespace {

constexpr double kGiB = 1073741824.0;

std::string gib_text(double gib) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(gib < 1 ? 3 : 1) << gib << " GiB";
  return os.str();
}

}  // namespace

void apply_memory_cap(const torch::Device& device, std::optional<double> gib, std::ostream& log) {
  if (!gib) return;
  if (!std::isfinite(*gib) || !(*gib > 0)) {
    std::ostringstream os;
    os << "--max-memory: expected a finite number of GiB > 0, got " << *gib;
    throw TrainInputError(os.str());
  }
  if (!device.is_cuda()) {
    log << "--max-memory " << gib_text(*gib) << ": no effect on the CPU (it caps the CUDA caching allocator)\n";
    return;
  }
#ifdef VLATUNE_HAVE_CUDA
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  const double total = static_cast<double>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
  if (*gib * kGiB > total)
    throw TrainInputError("--max-memory: " + gib_text(*gib) + " is more than the GPU's " + gib_text(total / kGiB));
  // The caching allocator is set up with CUDA's lazy initialization; the cap comes before the first allocation.
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  // The fraction is checked only when the allocator asks CUDA for more; blocks it already caches (a process that
  // ran on the device before, as a test binary does) would be reused past the cap, so they go back first.
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::setMemoryFraction(*gib * kGiB / total, index);
  log << "memory cap: " << gib_text(*gib) << " of the GPU's " << gib_text(total / kGiB)
      << " (--max-memory; the caching allocator refuses beyond it)\n";
#else
  throw TrainInputError("--max-memory: this build has no CUDA");
#endif
}

std::string out_of_memory_message(const std::string& where, int64_t micro_batch, int64_t grad_accum,
                                  std::optional<double> cap_gib, const formats::Recipe& recipe,
                                  const std::string& recipe_label, const std::string& allocator_error) {
  std::ostringstream os;
  os << "out of GPU memory " << where << " at micro-batch " << micro_batch << " x grad_accum " << grad_accum;
  if (cap_gib) os << " under --max-memory " << gib_text(*cap_gib);
  os << ": ";
  if (recipe.predicted.peak_gib) {
    os << recipe_label << " predicted a peak of " << gib_text(*recipe.predicted.peak_gib);
    for (const formats::Rationale& why : recipe.rationale) {
      auto it = why.numbers.find("budget_gib");
      if (why.decision.rfind("memory budget", 0) == 0 && it != why.numbers.end()) {
        os << " within a budget of " << gib_text(it->second);
        break;
      }
    }
    if (recipe.tuned_on.gpu) os << " (planned on " << *recipe.tuned_on.gpu << ")";
    os << "; ";
  } else {
    os << recipe_label << " has no predicted peak (not written by `vlatune plan`); ";
  }
  os << "run `vlatune profile` and `vlatune plan --memory-budget "
     << (cap_gib ? gib_text(*cap_gib).substr(0, gib_text(*cap_gib).size() - 4) : std::string("GiB"))
     << "` to choose what to recompute and which micro-batch fits";
  const std::string first_line = allocator_error.substr(0, allocator_error.find('\n'));
  if (!first_line.empty()) os << " (allocator: " << first_line << ")";
  return os.str();
}

}  // namespace vlatune::trainer
