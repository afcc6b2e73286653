// `vlatune launch --nproc N -- train ...`: one process per GPU on this host, torchrun-style environment
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT). SIGINT/SIGTERM are forwarded
// to every rank; when one rank fails, the others are stopped (SIGTERM, then SIGKILL after a grace period) and
// launch exits non-zero naming the rank that failed first.
#include <CLI/CLI.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli.h"
#include "cli/validators.h"

namespace vlatune::cli {

namespace {

struct LaunchOptions {
  int nproc = 1;
  int master_port = 0;  // 0: a free port
  double grace_s = 10;
  std::vector<std::string> command;
};

std::atomic<int> g_forward_signal{0};
extern "C" void on_launch_signal(int sig) {
  g_forward_signal.store(sig);
}

// A TCP port free right now on the loopback interface (the kernel picks it).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("launch: socket(): ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error(std::string("launch: no free port: ") + std::strerror(errno));
  return ntohs(addr.sin_port);
}

std::string self_exe() {
  std::vector<char> buf(PATH_MAX + 1, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), PATH_MAX);
  if (n <= 0) throw std::runtime_error("launch: cannot find this program (/proc/self/exe)");
  return std::string(buf.data(), static_cast<size_t>(n));
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended (status " + std::to_string(status) + ")";
}

int run_launch(const LaunchOptions& o, Context& ctx) {
  if (o.command.empty()) throw BadInput("launch: give the verb to run after --, e.g. launch --nproc 2 -- train ...");
  if (o.command.front() == "launch") throw BadInput("launch: the command cannot be launch itself");
  const std::string exe = self_exe();
  const int port = o.master_port > 0 ? o.master_port : free_port();

  struct sigaction sa {};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  g_forward_signal.store(0);

  std::vector<pid_t> pids(static_cast<size_t>(o.nproc), -1);
  std::vector<bool> alive(pids.size(), false);
  ctx.err << "launch: " << o.nproc << " process(es) of `" << o.command.front() << "` on 127.0.0.1:" << port << "\n"
          << std::flush;
  ctx.out << std::flush;
  for (int rank = 0; rank < o.nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (size_t r = 0; r < pids.size(); ++r)
        if (alive[r]) ::kill(pids[r], SIGKILL);
      throw std::runtime_error(std::string("launch: fork(): ") + std::strerror(errno));
    }
    if (pid == 0) {
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("GROUP_RANK", "0", 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<std::string> args{exe};
      args.insert(args.end(), o.command.begin(), o.command.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      std::fprintf(stderr, "launch: rank %d: exec %s: %s\n", rank, exe.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    pids[static_cast<size_t>(rank)] = pid;
    alive[static_cast<size_t>(rank)] = true;
  }

  // Wait for the ranks. The first failure stops the rest; a signal to launch goes to every rank.
  int remaining = o.nproc, failed_rank = -1, failed_status = 0, forwarded = 0;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  bool killed = false;
  while (remaining > 0) {
    const int sig = g_forward_signal.exchange(0);
    if (sig != 0) {
      forwarded = sig;
      for (size_t r = 0; r < pids.size(); ++r)
        if (alive[r]) ::kill(pids[r], sig);
    }
    if (stopping && !killed && std::chrono::steady_clock::now() >= stop_deadline) {
      for (size_t r = 0; r < pids.size(); ++r)
        if (alive[r]) ::kill(pids[r], SIGKILL);
      killed = true;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // ECHILD: nothing left
    }
    if (pid == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    int rank = -1;
    for (size_t r = 0; r < pids.size(); ++r)
      if (pids[r] == pid) rank = static_cast<int>(r);
    if (rank < 0) continue;
    alive[static_cast<size_t>(rank)] = false;
    --remaining;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failed_rank < 0 && !stopping && forwarded == 0) {
      failed_rank = rank;
      failed_status = status;
      if (remaining > 0) {
        ctx.err << "launch: rank " << rank << " (pid " << pid << ") " << describe_status(status) << "; stopping the "
                << remaining << " other rank(s)\n"
                << std::flush;
        stopping = true;
        stop_deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000.0));
        for (size_t r = 0; r < pids.size(); ++r)
          if (alive[r]) ::kill(pids[r], SIGTERM);
      }
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);

  if (failed_rank >= 0) {
    ctx.err << "launch: failed: rank " << failed_rank << " " << describe_status(failed_status)
            << " (its log above says why)\n";
    if (WIFEXITED(failed_status)) return WEXITSTATUS(failed_status);
    return 128 + WTERMSIG(failed_status);
  }
  if (forwarded != 0) return 128 + forwarded;  // interrupted (the ranks checkpointed and stopped together)
  return kExitOk;
}

}  // namespace

void setup_launch(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand("launch",
                                 "Run a vlatune verb on N local GPUs (sets RANK, LOCAL_RANK, "
                                 "WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--nproc", opts->nproc, "Processes (GPUs) on this host")->check(CLI::Range(1, 1024));
  cmd->add_option("--master-port", opts->master_port, "Rendezvous port on 127.0.0.1 (default: a free port)")
      ->default_str("")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--grace", opts->grace_s, "Seconds the other ranks get to exit after one fails, before SIGKILL")
      ->check(finite_range(0.0, 3600.0));
  cmd->add_option("command", opts->command, "The verb and its arguments, after --")->default_str("")->required();
  cmd->callback([&ctx, opts] { ctx.action = [&ctx, opts] { return run_launch(*opts, ctx); }; });
}

}  // namespace vlatune::cli
