// `vlatune`: the entry point only registers the verbs (cli.cpp) and returns their exit code.
#include <iostream>

#include "cli/cli.h"
#include "trainer/environment.h"

int main(int argc, char** argv) {
  vlatune::trainer::use_aten_cpu_kernels();
  return vlatune::cli::run(argc, argv, std::cout, std::cerr);
}
