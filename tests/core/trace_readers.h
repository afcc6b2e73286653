// The venv of the readers our trace and event files are checked against (Holistic Trace Analysis, TensorBoard),
// made by scripts/setup.sh and recorded in .vlatune/trace-readers-python. run_reader() runs one of the scripts
// beside this file with it and returns what the script printed and its exit status.
#pragma once

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace vlatune::test {

// The interpreter, or "" where setup.sh has not made the venv (the GPU machine, which builds without running it).
inline std::string trace_readers_python() {
  std::ifstream in(std::string(VLATUNE_SOURCE_DIR) + "/.vlatune/trace-readers-python");
  std::string python;
  std::getline(in, python);
  while (!python.empty() && (python.back() == ' ' || python.back() == '\r')) python.pop_back();
  return !python.empty() && ::access(python.c_str(), X_OK) == 0 ? python : "";
}

struct ReaderRun {
  int status = -1;     // the script's exit status (-1: did not run)
  std::string output;  // stdout and stderr together
};

inline ReaderRun run_reader(const std::string& python, const std::string& script, const std::string& args) {
  const std::string command =
      "timeout 300 " + python + " " + std::string(VLATUNE_SOURCE_DIR) + "/tests/core/" + script + " " + args + " 2>&1";
  ReaderRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) run.output.append(buffer, n);
  const int raw = ::pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return run;
}

}  // namespace vlatune::test
