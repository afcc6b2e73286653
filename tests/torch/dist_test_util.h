// Helpers of the multi-process tests: files read back, a free loopback port, `vlatune` run as a child process
// (under a hang guard), and safetensors weights loaded by name.
#pragma once

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model/safetensors_io.h"

namespace vlatune::test {

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string self_exe() {
  std::vector<char> buf(PATH_MAX + 1, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), PATH_MAX);
  REQUIRE(n > 0);
  return std::string(buf.data(), static_cast<size_t>(n));
}

// A TCP port free right now on the loopback interface (the kernel picks it), so parallel runs do not collide.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A guard against a hang (not a timing check): coreutils' timeout signals the whole process group, so the ranks
// that `vlatune launch` started go too, instead of spinning on after the case failed.
inline int run_vlatune(const std::string& args, const std::string& log) {
  const std::string cmd = "timeout -k 10 300 " + std::string(VLATUNE_BINARY) + " " + args + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

inline std::map<std::string, torch::Tensor> load_weights(const std::string& path) {
  auto f = vlatune::model::SafetensorsFile::open(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : f.entries()) out[e.name] = f.tensor(e.name);
  return out;
}

}  // namespace vlatune::test
