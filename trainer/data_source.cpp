#include "trainer/data_source.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <stdexcept>

#include "trainer/loader.h"
#include "trainer/synthetic.h"

namespace vlatune::trainer {

DataSource::~DataSource() = default;

torch::Device concrete_device(torch::Device device) {
  if (device.is_cpu() || device.has_index()) return device;
  c10::impl::VirtualGuardImpl guard(device.type());
  return guard.getDevice();
}

at::Generator make_data_generator(torch::Device device, uint64_t seed) {
  device = concrete_device(device);
  at::Generator gen =
      device.is_cpu() ? at::detail::createCPUGenerator(seed)
                      : at::globalContext().getAcceleratorHooksInterface(device.type()).getNewGenerator(device.index());
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);  // also resets the Philox offset on CUDA: the draws restart from the seed
  return gen;
}

void draw_noise_and_time(int64_t batch, int64_t horizon, int64_t action_dim, at::Generator& gen, torch::Device device,
                         model::Pi05Batch& out) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  out.noise = torch::randn({batch, horizon, action_dim}, gen, f32);
  // Beta(1.5, 1) has CDF t^1.5, so U^(1/1.5) samples it exactly (same as model::make_random_batch).
  out.time = torch::empty({batch}, f32).uniform_(0.0, 1.0, gen).pow_(1.0 / 1.5).mul_(0.999).add_(0.001);
}

std::unique_ptr<DataSource> open_data_source(const std::string& data, const model::Pi05Config& cfg, int64_t batch,
                                             uint64_t seed, torch::Device device, const LoaderOptions& options) {
  if (batch < 1) throw std::invalid_argument("data: batch must be >= 1, got " + std::to_string(batch));
  if (options.slots < 1) throw std::invalid_argument("data: slots must be >= 1");
  if (data == "synthetic") return std::make_unique<SyntheticSource>(cfg, batch, seed, device, options);
  return std::make_unique<DatasetLoader>(Dataset::open(data), cfg, batch, seed, device, options);
}

}  // namespace vlatune::trainer
