// trainer/libero_import + trainer/tokenizer: the pure steps (prompt cleaning, state bins, padding, chunking,
// rotation, quaternions) always; the HDF5 + SentencePiece import only where this build has both. Every input
// is made here: tiny LIBERO-shaped HDF5 files written with the HDF5 C API and a tiny SentencePiece model
// trained on a generated text file. Nothing is downloaded.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "data_test_util.h"
#include "model/config.h"
#include "trainer/data_source.h"
#include "trainer/dataset.h"
#include "trainer/libero_import.h"
#include "trainer/tokenizer.h"

#if defined(VLATUNE_HAVE_HDF5)
#include <hdf5.h>
#endif
#if defined(VLATUNE_HAVE_SENTENCEPIECE)
#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

using Catch::Matchers::Contains;
using vlatune::test::TempTree;
using namespace vlatune::trainer;

TEST_CASE("prompts are cleaned, state bins follow np.digitize and tokens are padded as openpi does", "[data]") {
  CHECK(clean_task("  put_the bowl\non the plate \n") == "put the bowl on the plate");
  CHECK(clean_task("\t\n ") == "");

  const float state[] = {-1.0f, -0.99999f, 0.0f, 0.5f, 1.0f - 1.0f / 256.0f, 1.0f, 2.0f, -1.5f};
  CHECK(discretize_state(state, 8) == std::vector<int>{0, 0, 128, 192, 255, 255, 255, -1});
  CHECK(discrete_state_prompt("pick_up\n", {1, 2, 255}) == "Task: pick up, State: 1 2 255;\nAction: ");

  const auto short_prompt = pad_tokens({2, 7, 9}, 6);
  CHECK(short_prompt.ids == std::vector<int32_t>{2, 7, 9, 0, 0, 0});
  CHECK(short_prompt.length == 3);
  CHECK_FALSE(short_prompt.truncated);
  const auto long_prompt = pad_tokens({2, 7, 9, 4}, 3);
  CHECK(long_prompt.ids == std::vector<int32_t>{2, 7, 9});
  CHECK(long_prompt.length == 3);
  CHECK(long_prompt.truncated);
}

TEST_CASE("action chunks repeat the last action past the episode end; frames rotate 180 degrees", "[data]") {
  const float actions[] = {0, 1, 10, 11, 20, 21};  // T = 3, 2 dims
  float chunk[8];
  chunk_actions(actions, 3, 2, 1, 4, chunk);
  CHECK(std::vector<float>(chunk, chunk + 8) == std::vector<float>{10, 11, 20, 21, 20, 21, 20, 21});

  const uint8_t img[2 * 2 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // rows: (p00 p01) (p10 p11)
  uint8_t out[12];
  rotate_image_180(img, 2, 2, out);
  CHECK(std::vector<uint8_t>(out, out + 12) == std::vector<uint8_t>{10, 11, 12, 7, 8, 9, 4, 5, 6, 1, 2, 3});

  const double half = std::sqrt(0.5);
  const double quarter_turn_z[4] = {0, 0, half, half};
  double aa[3];
  quat_to_axis_angle(quarter_turn_z, aa);
  CHECK(aa[0] == Approx(0.0).margin(1e-12));
  CHECK(aa[2] == Approx(M_PI / 2));
  const double identity[4] = {0, 0, 0, 1};
  quat_to_axis_angle(identity, aa);
  CHECK(aa[2] == 0.0);
}

#if !defined(VLATUNE_HAVE_HDF5) || !defined(VLATUNE_HAVE_SENTENCEPIECE)
TEST_CASE("LIBERO import says it is unavailable in a build without HDF5 or SentencePiece", "[data]") {
  CHECK_FALSE(libero_import_available());
  LiberoImportOptions o;
  CHECK_THROWS_WITH(import_libero(o), Contains("unavailable in this build"));
}
#endif

#if defined(VLATUNE_HAVE_SENTENCEPIECE)
using vlatune::test::train_tiny_tokenizer;

TEST_CASE("the prompt tokenizer builds BOS + cleaned task + the newline piece, right-padded with 0", "[data]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  sentencepiece::SentencePieceProcessor sp;
  REQUIRE(sp.Load(model).ok());
  const PromptTokenizer tok(model, 40);
  CHECK(tok.bos_id() == 2);
  const auto p = tok.tokenize(" put_the bowl\non the plate ");
  REQUIRE(p.length >= 3);
  CHECK(p.ids.size() == 40);
  CHECK(p.ids[0] == 2);
  CHECK(p.ids[p.length - 1] == sp.PieceToId("\n"));
  CHECK(sp.PieceToId("\n") != sp.unk_id());
  CHECK(sp.DecodeIds(std::vector<int>(p.ids.begin() + 1, p.ids.begin() + p.length - 1)) == "put the bowl on the plate");
  for (size_t i = p.length; i < p.ids.size(); ++i) CHECK(p.ids[i] == 0);
  CHECK(tok.tokenize(std::string(200, 'a')).truncated);
  CHECK_THROWS_WITH(PromptTokenizer(tmp / "missing.model"), Contains("missing.model"));
}
#endif

#if defined(VLATUNE_HAVE_HDF5) && defined(VLATUNE_HAVE_SENTENCEPIECE)
namespace {

// Writes LIBERO-shaped demo files with the HDF5 C API (intermediate groups created on the way).
class H5Writer {
 public:
  explicit H5Writer(const std::string& path) {
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(file_ >= 0);
    lcpl_ = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl_, 1);
  }
  ~H5Writer() {
    H5Pclose(lcpl_);
    H5Fclose(file_);
  }
  void dataset(const std::string& path, hid_t file_type, hid_t mem_type, const std::vector<hsize_t>& dims,
               const void* data) {
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t ds = H5Dcreate2(file_, path.c_str(), file_type, space, lcpl_, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(ds >= 0);
    REQUIRE(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(ds);
    H5Sclose(space);
  }
  // h5py writes str attributes as variable-length UTF-8; numpy bytes as fixed length: both are read.
  void string_attribute(const std::string& object, const char* name, const std::string& value, bool variable) {
    const hid_t obj = H5Oopen(file_, object.c_str(), H5P_DEFAULT);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, variable ? H5T_VARIABLE : value.size());
    H5Tset_cset(type, H5T_CSET_UTF8);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    const char* text = value.c_str();
    REQUIRE(H5Awrite(attr, type, variable ? static_cast<const void*>(&text) : text) >= 0);
    H5Aclose(attr), H5Sclose(space), H5Tclose(type), H5Oclose(obj);
  }

 private:
  hid_t file_, lcpl_;
};

constexpr int kSide = 6;

uint8_t pixel(int ep, int cam, int t, int y, int x, int c) {
  return static_cast<uint8_t>((ep * 31 + cam * 17 + t * 7 + y * 3 + x * 5 + c) % 256);
}
double raw_action(int ep, int t, int d) {
  return ep * 10 + t + 0.1 * d;
}
double raw_state(int ep, int t, int d) {
  return ep + 0.01 * t - 0.05 * d;
}

struct Demo {
  int ep;  // a global id used by the value formulas
  std::string name;
  int steps;
};

// `robot_states`: write the 9-d robot_states instead of ee_states + gripper_states.
void write_demo(H5Writer& w, const Demo& d, bool robot_states) {
  const std::string g = "data/" + d.name;
  const hsize_t T = d.steps;
  for (int cam = 0; cam < 2; ++cam) {
    std::vector<uint8_t> frames;
    for (int t = 0; t < d.steps; ++t)
      for (int y = 0; y < kSide; ++y)
        for (int x = 0; x < kSide; ++x)
          for (int c = 0; c < 3; ++c) frames.push_back(pixel(d.ep, cam, t, y, x, c));
    w.dataset(g + (cam == 0 ? "/obs/agentview_rgb" : "/obs/eye_in_hand_rgb"), H5T_STD_U8LE, H5T_NATIVE_UINT8,
              {T, kSide, kSide, 3}, frames.data());
  }
  std::vector<double> actions, ee, grip, robot;
  for (int t = 0; t < d.steps; ++t) {
    for (int k = 0; k < 7; ++k) actions.push_back(raw_action(d.ep, t, k));
    for (int k = 0; k < 6; ++k) ee.push_back(raw_state(d.ep, t, k));
    for (int k = 6; k < 8; ++k) grip.push_back(raw_state(d.ep, t, k));
    // gripper 2 | pos 3 | quat (quarter turn about z)
    const double half = std::sqrt(0.5);
    for (double v : {raw_state(d.ep, t, 6), raw_state(d.ep, t, 7), raw_state(d.ep, t, 0), raw_state(d.ep, t, 1),
                     raw_state(d.ep, t, 2), 0.0, 0.0, half, half})
      robot.push_back(v);
  }
  w.dataset(g + "/actions", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {T, 7}, actions.data());
  if (robot_states) {
    w.dataset(g + "/obs/robot_states", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {T, 9}, robot.data());
  } else {
    w.dataset(g + "/obs/ee_states", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {T, 6}, ee.data());
    w.dataset(g + "/obs/gripper_states", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {T, 2}, grip.data());
  }
}

// The raw 8-d state the import must produce for (demo, t).
std::vector<float> expected_state(const Demo& d, int t, bool robot_states) {
  std::vector<float> s;
  for (int k = 0; k < 8; ++k) s.push_back(static_cast<float>(raw_state(d.ep, t, k)));
  if (robot_states) s[3] = 0.0f, s[4] = 0.0f, s[5] = static_cast<float>(M_PI / 2);
  return s;
}

// a.hdf5: three demos (numeric order 0, 2, 10), instruction on /data (variable-length string);
// sub/b.hdf5: one demo with robot_states, instruction on the root (fixed-length string).
const std::vector<Demo> kDemosA = {{0, "demo_0", 3}, {1, "demo_2", 5}, {2, "demo_10", 2}};
const Demo kDemoB = {3, "demo_1", 4};

std::string write_libero_tree(const TempTree& tmp) {
  const std::string dir = tmp / "libero";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  REQUIRE(::mkdir((dir + "/sub").c_str(), 0755) == 0);
  {
    H5Writer a(dir + "/a.hdf5");
    for (const auto& d : {kDemosA[2], kDemosA[0], kDemosA[1]}) write_demo(a, d, false);  // written out of order
    a.string_attribute("data", "problem_info",
                       R"({"problem_name": "x", "language_instruction": "  put_the bowl\non the plate "})", true);
  }
  {
    H5Writer b(dir + "/sub/b.hdf5");
    write_demo(b, kDemoB, true);
    b.string_attribute("/", "problem_info", R"({"language_instruction": "open the drawer"})", false);
  }
  return dir;
}

}  // namespace

TEST_CASE("a LIBERO import gives the spec's tokens, chunks, rotated frames and quantile-normalized values", "[data]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  const auto libero = write_libero_tree(tmp);
  LiberoImportOptions o;
  o.libero_dir = libero;
  o.tokenizer_model = model;
  o.out = tmp / "ds";
  o.horizon = 4;
  std::ostringstream log;
  o.log = &log;
  const auto report = import_libero(o);
  CHECK(report.files == 2);
  CHECK(report.episodes == 4);
  CHECK(report.truncated_prompts == 0);
  const auto ds = Dataset::open(o.out);
  REQUIRE(ds->size() == 3 + 5 + 2 + 4);
  const auto& m = ds->manifest();
  CHECK(m.cameras == std::vector<std::string>{"base_0_rgb", "left_wrist_0_rgb"});
  CHECK(m.layout.image_side == kSide);
  CHECK(m.tokenizer.kind == "sentencepiece");
  CHECK(m.tokenizer.bos_id == 2);
  CHECK(m.source["files"] == nlohmann::json({"a.hdf5", "sub/b.hdf5"}));

  // Statistics over every timestep, in the expected episode order.
  std::vector<std::pair<Demo, bool>> order;  // demo, robot_states
  for (const auto& d : kDemosA) order.emplace_back(d, false);
  order.emplace_back(kDemoB, true);
  std::vector<float> all_actions, all_states;
  for (const auto& [d, robot] : order)
    for (int t = 0; t < d.steps; ++t) {
      for (int k = 0; k < 7; ++k) all_actions.push_back(static_cast<float>(raw_action(d.ep, t, k)));
      const auto s = expected_state(d, t, robot);
      all_states.insert(all_states.end(), s.begin(), s.end());
    }
  const auto qa = compute_quantiles(all_actions, 7), qs = compute_quantiles(all_states, 8);
  CHECK(m.norm.actions.q01 == qa.q01);
  CHECK(m.norm.actions.q99 == qa.q99);
  // The state's axis-angle is computed from float quaternions: equal to a few ulp, not bit for bit.
  for (int j = 0; j < 8; ++j) {
    CHECK(m.norm.state.q01[j] == Approx(qs.q01[j]).margin(1e-6));
    CHECK(m.norm.state.q99[j] == Approx(qs.q99[j]).margin(1e-6));
  }
  auto norm = [](double x, float lo, float hi) {
    return static_cast<float>(
        (static_cast<float>(x) - static_cast<double>(lo)) / (hi - static_cast<double>(lo) + 1e-6) * 2.0 - 1.0);
  };

  sentencepiece::SentencePieceProcessor sp;
  REQUIRE(sp.Load(model).ok());
  int64_t idx = 0;
  for (const auto& [d, robot] : order) {
    const std::string task = d.ep == kDemoB.ep ? "open the drawer" : "put the bowl on the plate";
    for (int t = 0; t < d.steps; ++t, ++idx) {
      INFO("sample " << idx << " = " << d.name << " t " << t);
      // Tokens: BOS, the cleaned task, the "\n" piece, then 0 padding.
      const int32_t len = ds->token_len(idx);
      const int32_t* tok = ds->tokens(idx);
      CHECK(tok[0] == 2);
      CHECK(tok[len - 1] == sp.PieceToId("\n"));
      CHECK(sp.DecodeIds(std::vector<int>(tok + 1, tok + len - 1)) == task);
      for (int i = len; i < 200; ++i) REQUIRE(tok[i] == 0);
      // Chunk: actions[t + k], the last one repeated past the end, normalized with the stored statistics.
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 7; ++j)
          CHECK(ds->actions(idx)[k * 7 + j] ==
                norm(raw_action(d.ep, std::min(t + k, d.steps - 1), j), qa.q01[j], qa.q99[j]));
      const auto s = expected_state(d, t, robot);
      for (int j = 0; j < 8; ++j) CHECK(ds->state(idx)[j] == Approx(norm(s[j], qs.q01[j], qs.q99[j])).margin(1e-5));
      // Frames rotated 180 degrees.
      for (int cam = 0; cam < 2; ++cam) {
        const uint8_t* img = ds->image(idx, cam);
        bool rotated = true;
        for (int y = 0; y < kSide; ++y)
          for (int x = 0; x < kSide; ++x)
            for (int c = 0; c < 3; ++c)
              rotated = rotated && img[(y * kSide + x) * 3 + c] == pixel(d.ep, cam, t, kSide - 1 - y, kSide - 1 - x, c);
        CHECK(rotated);
      }
    }
  }

  // The loader turns it into model batches: 6 px frames resized to 28, padding masked.
  auto src = open_data_source(o.out, vlatune::model::Pi05Config::tiny(), 3, 0, torch::kCPU, LoaderOptions{});
  const auto b = src->next(0, nullptr);
  CHECK(b.images.sizes() == torch::IntArrayRef{3, 3, 3, 28, 28});
  CHECK(b.tokens.select(1, 0).eq(2).all().item<bool>());
  CHECK(torch::equal(b.tokens.gt(0), b.token_masks));
  CHECK(b.actions.sizes() == torch::IntArrayRef{3, 4, 32});
}

TEST_CASE("a discrete-state import prompts with the binned normalized state", "[data]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  LiberoImportOptions o;
  o.libero_dir = write_libero_tree(tmp);
  o.tokenizer_model = model;
  o.out = tmp / "ds";
  o.horizon = 2;
  o.discrete_state = true;
  import_libero(o);
  const auto ds = Dataset::open(o.out);
  CHECK(ds->manifest().tokenizer.discrete_state);
  const PromptTokenizer tok(model);
  for (int64_t idx : {0, 4, 13}) {
    const std::string task = idx == 13 ? "open the drawer" : "put the bowl on the plate";
    const auto prompt = discrete_state_prompt(task, discretize_state(ds->state(idx), 8));
    CHECK_THAT(prompt, Contains(", State: ") && Contains(";\nAction: "));
    std::vector<int32_t> expected{2};
    const auto body = tok.encode(prompt);
    expected.insert(expected.end(), body.begin(), body.end());
    CHECK(std::vector<int32_t>(ds->tokens(idx), ds->tokens(idx) + ds->token_len(idx)) == expected);
  }
}

TEST_CASE("a LIBERO file without an instruction or an array is refused naming the file and the path", "[data]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  const std::string dir = tmp / "libero";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  LiberoImportOptions o;
  o.libero_dir = dir;
  o.tokenizer_model = model;
  o.out = tmp / "ds";
  CHECK_THROWS_WITH(import_libero(o), Contains("no *.hdf5"));
  {
    H5Writer w(dir + "/bad.hdf5");
    write_demo(w, kDemoB, false);
  }
  CHECK_THROWS_WITH(import_libero(o), Contains(dir + "/bad.hdf5") && Contains("problem_info"));
  {
    H5Writer w(dir + "/bad.hdf5");
    const uint8_t frames[kSide * kSide * 3] = {};
    w.dataset("data/demo_0/obs/agentview_rgb", H5T_STD_U8LE, H5T_NATIVE_UINT8, {1, kSide, kSide, 3}, frames);
    w.string_attribute("data", "problem_info", R"({"language_instruction": "x"})", true);
  }
  CHECK_THROWS_WITH(import_libero(o), Contains(dir + "/bad.hdf5") && Contains("data/demo_0/actions"));
}

TEST_CASE("vlatune data import writes a dataset from LIBERO files", "[data]") {
  TempTree tmp;
  const auto model = train_tiny_tokenizer(tmp);
  const auto libero = write_libero_tree(tmp);
  const std::string out = tmp / "ds";
  std::vector<const char*> argv{
      "vlatune", "data",      "import",    "--libero", libero.c_str(), "--tokenizer", model.c_str(),
      "--out",   out.c_str(), "--horizon", "3"};
  std::ostringstream so, se;
  REQUIRE(vlatune::cli::run(static_cast<int>(argv.size()), argv.data(), so, se) == vlatune::cli::kExitOk);
  CHECK_THAT(so.str(), Contains("14 samples"));
  CHECK(Dataset::open(out)->layout().horizon == 3);
}
#endif
