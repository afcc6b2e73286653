// Catch2 main of the torch tier. LibTorch uses one CPU thread by default on this machine; the tests set two
// (the machine's core count) so CPU cases finish fast and deterministically.
#define CATCH_CONFIG_RUNNER
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "trainer/environment.h"

int main(int argc, char* argv[]) {
  torch::set_num_threads(2);
  vlatune::trainer::use_aten_cpu_kernels();  // as the vlatune binary does
  return Catch::Session().run(argc, argv);
}
