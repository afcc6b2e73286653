// `vlatune serve` driven by openpi's real client (openpi-client 0.1.2's WebsocketClientPolicy, in the venv
// scripts/setup.sh makes): metadata on connect, action chunks equal to `vlatune sample` on the same input and
// noise, bad observations answered with an error that names them while the connection keeps serving, two clients
// at once, and a clean stop on SIGTERM and on SIGINT. The verb's own refusals (no server in the build) are covered too.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "data_test_util.h"
#include "model/batch_io.h"
#include "model/pi05.h"
#include "model/safetensors_io.h"
#include "model/sample.h"
#include "model/state_dict.h"
#include "trainer/image_preprocess.h"
#include "trainer/image_resize.h"
#include "trainer/norm_stats.h"
#include "trainer/tokenizer.h"

using vlatune::test::run_cli;
using vlatune::test::TempTree;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <typename T>
void write_raw(const std::string& path, const T* data, size_t count) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count * sizeof(T)));
  REQUIRE(out.good());
}

// The interpreter of the openpi-client venv scripts/setup.sh records; the case fails (it does not pass quietly)
// when setup has not made it.
std::string openpi_client_python() {
  const std::string record = std::string(VLATUNE_SOURCE_DIR) + "/.vlatune/openpi-client-python";
  std::string python = slurp(record);
  while (!python.empty() && (python.back() == '\n' || python.back() == ' ')) python.pop_back();
  INFO("the openpi-client venv recorded in " << record << " (made by scripts/setup.sh)");
  REQUIRE(!python.empty());
  REQUIRE(::access(python.c_str(), X_OK) == 0);
  return python;
}

}  // namespace

#if defined(VLATUNE_HAVE_SERVE) && defined(VLATUNE_HAVE_SENTENCEPIECE)

// `vlatune serve ...` as a child process (stdout and stderr to files); stopped with SIGKILL if the case ends early.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  std::string out_log, err_log;

  ServerProcess(const std::vector<std::string>& args, const std::string& dir)
      : out_log(dir + "/serve.out"), err_log(dir + "/serve.err") {
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::freopen(out_log.c_str(), "w", stdout);
      std::freopen(err_log.c_str(), "w", stderr);
      std::vector<char*> argv{const_cast<char*>(VLATUNE_BINARY), const_cast<char*>("serve")};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(VLATUNE_BINARY, argv.data());
      ::_exit(127);
    }
    // A guard against a hang (not a timing check): the listening line within a minute.
    const std::regex listening("listening on ws://127\\.0\\.0\\.1:([0-9]+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    std::smatch m;
    for (;;) {
      const std::string out = slurp(out_log);
      if (std::regex_search(out, m, listening)) {
        port = std::stoi(m[1]);
        return;
      }
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        FAIL("vlatune serve exited before listening:\n" << out << slurp(err_log));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);  // the destructor does not run for an object whose constructor throws
        ::waitpid(pid, nullptr, 0);
        pid = -1;
        FAIL("vlatune serve did not listen within a minute");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // `sig`, then its exit code (999 when it does not stop within 30 s).
  int stop(int sig = SIGTERM) {
    ::kill(pid, sig);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) != pid) {
      if (std::chrono::steady_clock::now() > deadline) return 999;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  ~ServerProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

TEST_CASE(
    "openpi's WebsocketClientPolicy gets vlatune sample's actions from vlatune serve, errors for bad "
    "observations, and the connection keeps serving",
    "[serve][cli]") {
  const std::string python = openpi_client_python();
  TempTree tmp;
  const std::string tokenizer = vlatune::test::train_tiny_tokenizer(tmp);
  const auto cfg = vlatune::model::Pi05Config::tiny();
  {
    vlatune::model::Pi05 net(cfg, torch::kCPU, torch::kFloat32);
    vlatune::model::init_weights(*net, 21);
    vlatune::model::save_state_dict(*net, tmp / "weights.safetensors");
  }
  vlatune::trainer::NormStats norm;
  for (int i = 0; i < 7; ++i) {
    norm.actions.q01.push_back(-0.5f - 0.1f * static_cast<float>(i));
    norm.actions.q99.push_back(0.5f + 0.2f * static_cast<float>(i));
  }
  for (int i = 0; i < 8; ++i) {
    norm.state.q01.push_back(-1.0f);
    norm.state.q99.push_back(2.0f);
  }
  vlatune::test::write_file_bytes(tmp / "norm_stats.json", vlatune::trainer::norm_stats_file_json(norm).dump());

  // The observation: a 30 x 40 base image (resized with padding to 28) and a 28 x 28 wrist image.
  torch::Generator gen = at::detail::createCPUGenerator(5);
  const torch::Tensor image0 = torch::randint(0, 256, {30, 40, 3}, gen, torch::kByte);
  const torch::Tensor image1 = torch::randint(0, 256, {28, 28, 3}, gen, torch::kByte);
  const torch::Tensor state = torch::rand({8}, gen, torch::kFloat64);
  const torch::Tensor noise = vlatune::model::sample_noise(1, 10, 32, 9);
  const std::string prompt = "put the bowl on the plate";
  const std::string obs_dir = tmp / "obs";
  REQUIRE(::mkdir(obs_dir.c_str(), 0755) == 0);
  write_raw(obs_dir + "/image0.u8", image0.data_ptr<uint8_t>(), 30 * 40 * 3);
  write_raw(obs_dir + "/image1.u8", image1.data_ptr<uint8_t>(), 28 * 28 * 3);
  write_raw(obs_dir + "/state.f64", state.data_ptr<double>(), 8);
  write_raw(obs_dir + "/noise.f32", noise.data_ptr<float>(), 10 * 32);
  vlatune::test::write_file_bytes(
      obs_dir + "/obs.json",
      nlohmann::json{
          {"image0", {30, 40, 3}}, {"image1", {28, 28, 3}}, {"state", {8}}, {"noise", {10, 32}}, {"prompt", prompt}}
          .dump());

  // What `vlatune sample` computes for the same observation, transformed as openpi's pi05_libero policy does.
  {
    std::vector<uint8_t> pixels(2 * 28 * 28 * 3);
    vlatune::trainer::resize_with_pad(image0.data_ptr<uint8_t>(), 30, 40, 28, pixels.data());
    std::memcpy(pixels.data() + 28 * 28 * 3, image1.data_ptr<uint8_t>(), 28 * 28 * 3);
    vlatune::model::Pi05Batch b;
    b.images = vlatune::trainer::preprocess_images(
        torch::from_blob(pixels.data(), {1, 2, 28, 28, 3}, torch::kByte).clone(), 28, 3, nullptr);
    b.image_masks = torch::tensor({true, true, false}).view({1, 3});
    const auto tokens = vlatune::trainer::PromptTokenizer(tokenizer, 200).tokenize(prompt);
    b.tokens = torch::tensor(std::vector<int64_t>(tokens.ids.begin(), tokens.ids.end())).view({1, 200});
    b.token_masks = (torch::arange(200) < tokens.length).view({1, 200});
    b.actions = torch::zeros({1, 10, 32});
    b.noise = noise;
    b.time = torch::ones({1});
    vlatune::model::write_batch(tmp / "batch.safetensors", b);
  }
  const auto sampled = run_cli({"sample", "--config", "tiny", "--device", "cpu", "--weights",
                                tmp / "weights.safetensors", "--batch", tmp / "batch.safetensors", "--norm-stats",
                                tmp / "norm_stats.json", "--out", tmp / "sampled.safetensors"});
  INFO(sampled.err);
  REQUIRE(sampled.code == 0);
  const torch::Tensor expected =
      vlatune::model::SafetensorsFile::open(tmp / "sampled.safetensors").tensor("actions_real").view({10, 7});

  ServerProcess server({"--config", "tiny", "--device", "cpu", "--weights", tmp / "weights.safetensors", "--norm-stats",
                        tmp / "norm_stats.json", "--tokenizer", tokenizer, "--port", "0", "--max-message-mb", "0.05"},
                       tmp.path);
  const std::string script = std::string(VLATUNE_SOURCE_DIR) + "/tests/torch/openpi_client_check.py";
  const std::string command = "timeout 120 " + python + " " + script + " " + std::to_string(server.port) + " " +
                              obs_dir + " > " + (tmp / "client.json") + " 2> " + (tmp / "client.err");
  const int client_rc = std::system(command.c_str());
  INFO("client stderr:\n" << slurp(tmp / "client.err") << "\nserver stderr:\n" << slurp(server.err_log));
  REQUIRE(client_rc == 0);
  const nlohmann::json out = nlohmann::json::parse(slurp(tmp / "client.json"));

  const nlohmann::json& meta = out.at("metadata");
  CHECK(meta.at("action_horizon") == 10);
  CHECK(meta.at("action_dim") == 7);
  CHECK(meta.at("camera_keys") == nlohmann::json({"observation/image", "observation/wrist_image"}));
  CHECK(out.at("metadata_second") == meta);

  auto actions_of = [](const nlohmann::json& reply) {
    std::vector<float> v;
    for (const auto& row : reply.at("actions"))
      for (const auto& x : row) v.push_back(x.get<float>());
    return torch::tensor(v).view({10, 7});
  };
  const nlohmann::json& good = out.at("good");
  CHECK(good.at("shape") == nlohmann::json({10, 7}));
  CHECK(good.at("dtype") == "float32");
  CHECK(good.at("policy_timing") == nlohmann::json({"infer_ms"}));
  CHECK(good.at("server_timing") == nlohmann::json({"infer_ms"}));
  const torch::Tensor got = actions_of(good);
  INFO("served:\n" << got << "\nsampled:\n" << expected);
  // Two processes on the same input: equal up to the summation order of their thread counts.
  CHECK((got - expected).abs().max().item<double>() <= 1e-5 * std::max(1.0, expected.abs().max().item<double>()));
  CHECK(torch::equal(actions_of(out.at("good_again")), got));
  CHECK(torch::equal(actions_of(out.at("good_second")), got));
  CHECK(out.at("good_again").at("server_timing") == nlohmann::json({"infer_ms", "prev_total_ms"}));

  const nlohmann::json& errors = out.at("errors");
  auto error_of = [&](const char* name) {
    INFO(name);
    REQUIRE(errors.at(name).is_string());
    return errors.at(name).get<std::string>();
  };
  CHECK_THAT(error_of("missing_wrist"), Catch::Contains("'observation/wrist_image': missing"));
  CHECK_THAT(error_of("int64_image"),
             Catch::Contains("'observation/image': expected an image") && Catch::Contains("int64 [30, 40, 3]"));
  CHECK_THAT(error_of("state_shape"), Catch::Contains("'observation/state': expected a numeric array [8]"));
  CHECK_THAT(error_of("prompt_type"), Catch::Contains("'prompt': expected a string, got a number"));
  CHECK_THAT(error_of("oversize"), Catch::Contains("above the server's limit of 52428 bytes"));

  CHECK(server.stop() == 0);
  CHECK_THAT(slurp(server.err_log), Catch::Contains("stopped by SIGTERM after 3 observations served, 5 refused"));
}

TEST_CASE("vlatune serve refuses a setup it cannot serve with exit 4, naming the problem", "[serve][cli]") {
  TempTree tmp;
  const std::string tokenizer = vlatune::test::train_tiny_tokenizer(tmp);
  {
    vlatune::model::Pi05 net(vlatune::model::Pi05Config::tiny(), torch::kCPU, torch::kFloat32);
    vlatune::model::save_state_dict(*net, tmp / "weights.safetensors");
  }
  const auto no_stats = run_cli(
      {"serve", "--device", "cpu", "--weights", tmp / "weights.safetensors", "--tokenizer", tokenizer, "--port", "0"});
  CHECK(no_stats.code == 4);
  CHECK_THAT(no_stats.err, Catch::Contains("--norm-stats: required"));
  vlatune::test::write_file_bytes(tmp / "bad_stats.json", R"({"norm_stats": {"actions": {"q01": [0], "q99": []}}})");
  const auto bad_stats = run_cli(
      {"serve", "--device", "cpu", "--tokenizer", tokenizer, "--norm-stats", tmp / "bad_stats.json", "--port", "0"});
  CHECK(bad_stats.code == 4);
  CHECK_THAT(bad_stats.err, Catch::Contains("bad_stats.json: $.norm_stats.actions.q99: expected 1 values"));
  vlatune::trainer::NormStats norm;
  norm.actions = {{0.f}, {1.f}, {}, {}};
  norm.state = {{0.f}, {1.f}, {}, {}};
  vlatune::test::write_file_bytes(tmp / "stats.json", vlatune::trainer::norm_stats_file_json(norm).dump());
  const auto bad_host = run_cli({"serve", "--device", "cpu", "--tokenizer", tokenizer, "--norm-stats",
                                 tmp / "stats.json", "--host", "nowhere", "--port", "0"});
  CHECK(bad_host.code == 4);
  CHECK_THAT(bad_host.err, Catch::Contains("--host nowhere: not an IP address"));
  const auto too_many =
      run_cli({"serve", "--device", "cpu", "--tokenizer", tokenizer, "--norm-stats", tmp / "stats.json", "--camera-key",
               "a", "--camera-key", "b", "--camera-key", "c", "--camera-key", "d"});
  CHECK(too_many.code == 4);

  // A setup it can serve, stopped by SIGINT (Ctrl-C): exit 0, saying so.
  ServerProcess server({"--config", "tiny", "--device", "cpu", "--tokenizer", tokenizer, "--norm-stats",
                        tmp / "stats.json", "--port", "0"},
                       tmp.path);
  CHECK(server.stop(SIGINT) == 0);
  CHECK_THAT(slurp(server.err_log), Catch::Contains("stopped by SIGINT after 0 observations served, 0 refused"));
}

#else

TEST_CASE("vlatune serve exits 69 when the build has no policy server", "[serve][cli]") {
  const auto r = run_cli({"serve", "--tokenizer", VLATUNE_SOURCE_DIR "/README.md"});
  CHECK(r.code == 69);
  CHECK_THAT(r.err, Catch::Contains("not built into this binary"));
  // The openpi client test needs the server: this build cannot run it, which must not pass as if it had.
  FAIL(
      "vlatune serve is not built (websocketpp, Asio, msgpack-cxx or SentencePiece missing): scripts/setup.sh "
      "installs them");
}

#endif
