// `vlatune`: the entry point only registers the verbs (cli.cpp) and returns their exit code.
#include <iostream>

#include "cli/cli.h"

int main(int argc, char** argv) {
  return vlatune::cli::run(argc, argv, std::cout, std::cerr);
}
