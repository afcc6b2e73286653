#include "trainer/libero_import.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "trainer/file_util.h"
#include "trainer/tokenizer.h"

#if defined(VLATUNE_HAVE_HDF5)
#include <hdf5.h>
#endif

namespace vlatune::trainer {

void chunk_actions(const float* actions, int64_t steps, int64_t dims, int64_t t, int64_t horizon, float* out) {
  for (int64_t k = 0; k < horizon; ++k) {
    const int64_t src = std::min(t + k, steps - 1);
    std::copy(actions + src * dims, actions + (src + 1) * dims, out + k * dims);
  }
}

void rotate_image_180(const uint8_t* in, int64_t height, int64_t width, uint8_t* out) {
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) {
      const uint8_t* src = in + ((height - 1 - y) * width + (width - 1 - x)) * 3;
      uint8_t* dst = out + (y * width + x) * 3;
      dst[0] = src[0], dst[1] = src[1], dst[2] = src[2];
    }
}

void quat_to_axis_angle(const double q[4], double out[3]) {
  const double w = std::clamp(q[3], -1.0, 1.0);
  const double den = std::sqrt(1.0 - w * w);
  if (std::abs(den) < 1e-8) {  // robosuite: math.isclose(den, 0.0) -> no rotation
    out[0] = out[1] = out[2] = 0.0;
    return;
  }
  const double angle = 2.0 * std::acos(w);
  for (int i = 0; i < 3; ++i) out[i] = q[i] * angle / den;
}

std::string libero_import_missing() {
  std::string missing;
#if !defined(VLATUNE_HAVE_HDF5)
  missing += "HDF5 (libhdf5-dev)";
#endif
  if (!PromptTokenizer::available())
    missing += std::string(missing.empty() ? "" : " and ") + "SentencePiece (libsentencepiece-dev)";
  return missing;
}

bool libero_import_available() {
  return libero_import_missing().empty();
}

#if !defined(VLATUNE_HAVE_HDF5)

LiberoImportReport import_libero(const LiberoImportOptions&) {
  throw std::runtime_error("LIBERO import is unavailable in this build: vlatune was built without " +
                           libero_import_missing() + "; install it and reconfigure");
}

#else

namespace {

// Owns one HDF5 id; the close function depends on the id's kind.
class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its error stack to stderr by default; the import reports errors itself, with the file and the
// dataset path, so the stack is silenced for the duration and restored afterwards.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(file + ": " + what);
}

// H5Lexists on a nested path needs every parent to exist: walk it one component at a time.
bool exists(hid_t loc, const std::string& path) {
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t slash = path.find('/', pos);
    const std::string prefix = path.substr(0, slash);
    if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
  return true;
}

// Reads a whole dataset converted to `mem_type`; `dims` receives its shape.
template <typename T>
std::vector<T> read_dataset(hid_t file, const std::string& file_name, const std::string& path, hid_t mem_type,
                            std::vector<hsize_t>& dims) {
  if (!exists(file, path)) fail(file_name, "missing dataset " + path);
  H5Id ds(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) fail(file_name, "cannot open dataset " + path);
  H5Id space(H5Dget_space(ds.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 1) fail(file_name, path + ": not a simple array");
  dims.assign(static_cast<size_t>(rank), 0);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  hsize_t count = 1;
  for (hsize_t d : dims) count *= d;
  std::vector<T> values(count);
  if (count > 0 && H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
    fail(file_name, path + ": cannot read (or convert) the values");
  return values;
}

// A [T, cols] array of floats; checks the shape.
std::vector<float> read_matrix(hid_t file, const std::string& file_name, const std::string& path, int64_t steps,
                               int64_t cols) {
  std::vector<hsize_t> dims;
  auto v = read_dataset<float>(file, file_name, path, H5T_NATIVE_FLOAT, dims);
  if (dims.size() != 2 || static_cast<int64_t>(dims[1]) != cols ||
      (steps >= 0 && static_cast<int64_t>(dims[0]) != steps))
    fail(file_name, path + ": expected [" + (steps >= 0 ? std::to_string(steps) : std::string("T")) + ", " +
                        std::to_string(cols) + "], got rank " + std::to_string(dims.size()) + " [" +
                        std::to_string(dims[0]) + (dims.size() > 1 ? ", " + std::to_string(dims[1]) : "") + "]");
  return v;
}

std::string read_string_attribute(hid_t obj, const char* name, const std::string& file_name) {
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) fail(file_name, std::string("cannot open attribute ") + name);
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) fail(file_name, std::string("attribute ") + name + " is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {  // h5py's str attributes
    H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* text = nullptr;
    if (H5Aread(attr.get(), mem.get(), &text) < 0) fail(file_name, std::string("cannot read attribute ") + name);
    std::string out = text != nullptr ? text : "";
    H5free_memory(text);
    return out;
  }
  const size_t size = H5Tget_size(type.get());  // numpy bytes: fixed length, maybe NUL-padded
  std::string out(size, '\0');
  if (H5Aread(attr.get(), type.get(), out.data()) < 0) fail(file_name, std::string("cannot read attribute ") + name);
  return out.substr(0, out.find('\0'));
}

std::string read_instruction(hid_t file, const std::string& file_name) {
  for (const char* where : {"data", "/"}) {
    if (std::string(where) != "/" && !exists(file, where)) continue;
    if (H5Aexists_by_name(file, where, "problem_info", H5P_DEFAULT) <= 0) continue;
    H5Id obj(H5Oopen(file, where, H5P_DEFAULT), H5Oclose);
    const std::string text = read_string_attribute(obj.get(), "problem_info", file_name);
    nlohmann::json info;
    try {
      info = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail(file_name, "problem_info is not JSON: " + std::string(e.what()));
    }
    if (!info.is_object() || !info.contains("language_instruction") || !info["language_instruction"].is_string())
      fail(file_name, "problem_info has no string \"language_instruction\"");
    return info["language_instruction"].get<std::string>();
  }
  fail(file_name, "no problem_info attribute on /data or / (not a LIBERO demo file?)");
}

// demo_N names under /data, ordered by N (demo_10 after demo_9).
std::vector<std::string> list_demos(hid_t file, const std::string& file_name) {
  if (!exists(file, "data")) fail(file_name, "missing group /data (not a LIBERO demo file?)");
  H5Id group(H5Gopen2(file, "data", H5P_DEFAULT), H5Gclose);
  H5G_info_t info;
  if (!group.ok() || H5Gget_info(group.get(), &info) < 0) fail(file_name, "/data is not a group");
  std::vector<std::pair<long long, std::string> > demos;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n = H5Lget_name_by_idx(group.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::string name(static_cast<size_t>(std::max<ssize_t>(n, 0)) + 1, '\0');
    H5Lget_name_by_idx(group.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (name.rfind("demo_", 0) != 0) continue;
    const std::string number = name.substr(5);
    if (number.empty() || !std::all_of(number.begin(), number.end(), ::isdigit)) continue;
    demos.emplace_back(std::stoll(number), name);
  }
  std::sort(demos.begin(), demos.end());
  std::vector<std::string> names;
  for (auto& d : demos) names.push_back(d.second);
  if (names.empty()) fail(file_name, "no data/demo_N groups");
  return names;
}

constexpr int64_t kActionDim = 7, kStateDim = 8;

// The 8-d state of one demo (see the header for the two layouts).
std::vector<float> read_state(hid_t file, const std::string& file_name, const std::string& demo, int64_t steps) {
  const std::string obs = "data/" + demo + "/obs/";
  std::vector<float> state(static_cast<size_t>(steps * kStateDim));
  if (exists(file, obs + "ee_states") && exists(file, obs + "gripper_states")) {
    const auto ee = read_matrix(file, file_name, obs + "ee_states", steps, 6);
    const auto grip = read_matrix(file, file_name, obs + "gripper_states", steps, 2);
    for (int64_t t = 0; t < steps; ++t) {
      std::copy(&ee[t * 6], &ee[t * 6] + 6, &state[t * kStateDim]);
      std::copy(&grip[t * 2], &grip[t * 2] + 2, &state[t * kStateDim + 6]);
    }
    return state;
  }
  if (!exists(file, obs + "robot_states"))
    fail(file_name, "data/" + demo + ": no state: need obs/ee_states + obs/gripper_states, or obs/robot_states");
  const auto robot = read_matrix(file, file_name, obs + "robot_states", steps, 9);
  for (int64_t t = 0; t < steps; ++t) {
    const float* r = &robot[t * 9];  // gripper 2 | pos 3 | quat xyzw 4
    const double quat[4] = {r[5], r[6], r[7], r[8]};
    double axis_angle[3];
    quat_to_axis_angle(quat, axis_angle);
    float* s = &state[t * kStateDim];
    s[0] = r[2], s[1] = r[3], s[2] = r[4];
    for (int i = 0; i < 3; ++i) s[3 + i] = static_cast<float>(axis_angle[i]);
    s[6] = r[0], s[7] = r[1];
  }
  return state;
}

struct Episode {
  size_t file;  // index into the file list
  std::string demo;
  int64_t steps = 0;
  std::vector<float> actions;  // [T, 7], raw, then normalized in place
  std::vector<float> state;    // [T, 8], raw, then normalized in place
};

std::vector<std::string> find_files(const std::string& dir) {
  auto files = list_files_recursive(dir, {".hdf5", ".h5"});
  if (files.empty()) throw std::runtime_error(dir + ": no *.hdf5 or *.h5 files (LIBERO demo files)");
  return files;
}

}  // namespace

LiberoImportReport import_libero(const LiberoImportOptions& o) {
  if (!libero_import_available())
    throw std::runtime_error("LIBERO import is unavailable in this build: vlatune was built without " +
                             libero_import_missing() + "; install it and reconfigure");
  if (o.horizon < 1) throw std::invalid_argument("import: horizon must be >= 1, got " + std::to_string(o.horizon));
  const QuietHdf5 quiet;
  const PromptTokenizer tokenizer(o.tokenizer_model, o.text_len);
  const auto files = find_files(o.libero_dir);
  auto log = [&](const std::string& line) {
    if (o.log != nullptr) *o.log << line << "\n";
  };

  // Pass 1: actions, states and instructions of every episode (small), for the statistics and the count.
  std::vector<Episode> episodes;
  std::vector<std::string> instructions;
  int64_t total = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string& name = files[f];
    H5Id file(H5Fopen(name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) fail(name, "cannot open as HDF5");
    instructions.push_back(read_instruction(file.get(), name));
    for (const auto& demo : list_demos(file.get(), name)) {
      Episode e;
      e.file = f;
      e.demo = demo;
      e.actions = read_matrix(file.get(), name, "data/" + demo + "/actions", -1, kActionDim);
      e.steps = static_cast<int64_t>(e.actions.size()) / kActionDim;
      if (e.steps == 0) fail(name, "data/" + demo + "/actions is empty");
      e.state = read_state(file.get(), name, demo, e.steps);
      total += e.steps;
      episodes.push_back(std::move(e));
    }
    log("read " + name + ": \"" + instructions.back() + "\"");
  }
  std::vector<float> all_actions, all_states;
  for (const auto& e : episodes) {
    all_actions.insert(all_actions.end(), e.actions.begin(), e.actions.end());
    all_states.insert(all_states.end(), e.state.begin(), e.state.end());
  }
  NormStats norm{compute_quantiles(all_actions, kActionDim), compute_quantiles(all_states, kStateDim)};
  all_actions.clear(), all_states.clear();
  for (auto& e : episodes) {
    normalize_quantile(e.actions.data(), e.steps, kActionDim, norm.actions);
    normalize_quantile(e.state.data(), e.steps, kStateDim, norm.state);
  }

  // Pass 2: images, prompts, records. The image side comes from the first episode; all must agree.
  std::unique_ptr<DatasetWriter> writer;
  DatasetManifest manifest;
  LiberoImportReport report;
  report.files = static_cast<int64_t>(files.size());
  report.episodes = static_cast<int64_t>(episodes.size());
  std::vector<float> chunk(static_cast<size_t>(o.horizon * kActionDim));
  for (const auto& e : episodes) {
    const std::string& name = files[e.file];
    H5Id file(H5Fopen(name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) fail(name, "cannot open as HDF5");
    std::vector<std::vector<uint8_t> > cams;
    int64_t side = 0;
    for (const char* cam : {"agentview_rgb", "eye_in_hand_rgb"}) {
      const std::string path = "data/" + e.demo + "/obs/" + cam;
      std::vector<hsize_t> dims;
      cams.push_back(read_dataset<uint8_t>(file.get(), name, path, H5T_NATIVE_UINT8, dims));
      if (dims.size() != 4 || static_cast<int64_t>(dims[0]) != e.steps || dims[1] != dims[2] || dims[3] != 3)
        fail(name,
             path + ": expected uint8 [" + std::to_string(e.steps) + ", s, s, 3] (square frames, one per action)");
      if (side != 0 && static_cast<int64_t>(dims[1]) != side)
        fail(name, path + ": " + std::to_string(dims[1]) + " px, the other camera has " + std::to_string(side));
      side = static_cast<int64_t>(dims[1]);
    }
    if (!writer) {
      manifest.layout = RecordLayout{2, side, o.text_len, o.horizon, kActionDim, kStateDim};
      manifest.cameras = {"base_0_rgb", "left_wrist_0_rgb"};
      manifest.tokenizer = {"sentencepiece", o.tokenizer_model, tokenizer.vocab_size(), tokenizer.bos_id(),
                            o.discrete_state};
      manifest.norm = norm;
      nlohmann::json names = nlohmann::json::array();
      for (const auto& f : files) names.push_back(f.substr(join_path(o.libero_dir, "").size()));
      manifest.source = {{"kind", "libero"},
                         {"dir", o.libero_dir},
                         {"files", names},
                         {"episodes", report.episodes},
                         {"cameras", {{"base_0_rgb", "agentview_rgb"}, {"left_wrist_0_rgb", "eye_in_hand_rgb"}}},
                         {"state", "ee_states[0:6] ++ gripper_states[0:2] (or robot_states converted)"},
                         {"images", "rotated 180 degrees (LIBERO renders upside down; as openpi)"},
                         {"chunk_padding", "last action repeated past the episode end"}};
      writer = std::make_unique<DatasetWriter>(o.out, manifest, total, o.shard_bytes);
    } else if (side != manifest.layout.image_side) {
      fail(name, "data/" + e.demo + ": " + std::to_string(side) + " px frames, earlier files have " +
                     std::to_string(manifest.layout.image_side) + " (one dataset stores one size)");
    }

    TokenizedPrompt prompt;
    if (!o.discrete_state) prompt = tokenizer.tokenize(instructions[e.file]);  // the same for every timestep
    const int64_t frame = side * side * 3;
    std::vector<std::vector<uint8_t> > upright(2, std::vector<uint8_t>(static_cast<size_t>(frame)));
    SampleView view;
    view.images = {upright[0].data(), upright[1].data()};
    view.actions = chunk.data();
    for (int64_t t = 0; t < e.steps; ++t) {
      if (o.discrete_state) prompt = tokenizer.tokenize(instructions[e.file], &e.state[t * kStateDim], kStateDim);
      if (prompt.truncated && (o.discrete_state || t == 0)) {
        ++report.truncated_prompts;
        if (report.truncated_prompts == 1)
          log("warning: " + name + ": prompt longer than " + std::to_string(o.text_len) + " tokens, truncated");
      }
      for (int c = 0; c < 2; ++c) rotate_image_180(&cams[c][t * frame], side, side, upright[c].data());
      chunk_actions(e.actions.data(), e.steps, kActionDim, t, o.horizon, chunk.data());
      view.tokens = prompt.ids.data();
      view.token_len = prompt.length;
      view.state = &e.state[t * kStateDim];
      writer->append(view);
    }
  }
  report.manifest = writer->finish();
  if (report.truncated_prompts > 0)
    log("warning: " + std::to_string(report.truncated_prompts) + " prompt(s) truncated to " +
        std::to_string(o.text_len) + " tokens (spec §4.6)");
  log("wrote " + o.out + ": " + std::to_string(total) + " samples from " + std::to_string(report.episodes) +
      " episodes in " + std::to_string(report.files) + " files");
  return report;
}

#endif  // VLATUNE_HAVE_HDF5

}  // namespace vlatune::trainer
