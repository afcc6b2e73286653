#include "trainer/lerobot_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "trainer/file_util.h"
#include "trainer/parquet_table.h"

namespace vlatune::trainer {

namespace {

using ojson = nlohmann::ordered_json;

constexpr size_t kMaxMetaBytes = 256u << 20;  // a metadata file larger than this is not LeRobot's

std::string read_small_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw DataError(path + ": missing");
  if (!S_ISREG(st.st_mode)) throw DataError(path + ": not a regular file");
  if (static_cast<size_t>(st.st_size) > kMaxMetaBytes)
    throw DataError(path + ": " + std::to_string(st.st_size) + " bytes is too large for a metadata file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ojson parse_json(const std::string& text, const std::string& file, const std::string& where = "") {
  try {
    return ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(file + where + ": not valid JSON: " + e.what());
  }
}

// A JSON value with its file and path, for messages like "meta/info.json: $.features.state.shape: ...".
struct Json {
  const ojson& v;
  std::string file, path;

  [[noreturn]] void fail(const std::string& what) const { throw DataError(file + ": " + path + ": " + what); }
  bool has(const char* key) const { return v.is_object() && v.contains(key); }
  Json at(const char* key) const {
    if (!v.is_object()) fail("expected an object");
    if (!v.contains(key)) throw DataError(file + ": " + path + "." + key + ": missing");
    return {v.at(key), file, path + "." + key};
  }
  Json element(size_t i) const { return {v.at(i), file, path + "[" + std::to_string(i) + "]"}; }
  size_t array() const {
    if (!v.is_array()) fail("expected an array");
    return v.size();
  }
  int64_t integer(int64_t min = 0) const {
    if (!v.is_number_integer()) fail("expected an integer");
    const auto x = v.get<int64_t>();
    if (x < min) fail("expected an integer >= " + std::to_string(min) + ", got " + std::to_string(x));
    return x;
  }
  double number(double min) const {
    if (!v.is_number()) fail("expected a number");
    const auto x = v.get<double>();
    if (!std::isfinite(x) || x < min) fail("expected a finite number >= " + std::to_string(min));
    return x;
  }
  std::string string() const {
    if (!v.is_string()) fail("expected a string");
    return v.get<std::string>();
  }
};

// Calls row(json, where) for each non-blank line of a JSON-lines file; `where` names the file and line.
template <typename Row>
void for_each_jsonl_row(const std::string& file, Row row) {
  std::istringstream lines(read_small_file(file));
  std::string line;
  for (int64_t n = 1; std::getline(lines, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = ":" + std::to_string(n);
    const ojson j = parse_json(line, file, where);
    row(Json{j, file + where, "$"});
  }
}

LeRobotFeature read_feature(const std::string& key, const Json& j) {
  LeRobotFeature f;
  f.key = key;
  f.dtype = j.at("dtype").string();
  const Json shape = j.at("shape");
  const size_t n = shape.array();
  for (size_t i = 0; i < n; ++i) f.shape.push_back(shape.element(i).integer(0));
  if (f.is_camera()) {
    // [H, W, C] as LeRobot writes it; [C, H, W] where the names say channels come first.
    if (f.shape.size() != 3) shape.fail("an image feature needs 3 dims, got " + std::to_string(f.shape.size()));
    bool channels_first = false;
    if (j.has("names") && j.v.at("names").is_array() && !j.v.at("names").empty() && j.v.at("names")[0].is_string()) {
      const auto first = j.v.at("names")[0].get<std::string>();
      channels_first = first.rfind("channel", 0) == 0;
    }
    f.height = channels_first ? f.shape[1] : f.shape[0];
    f.width = channels_first ? f.shape[2] : f.shape[1];
    const int64_t c = channels_first ? f.shape[0] : f.shape[2];
    if (c != 3) shape.fail("expected 3 colour channels, got " + std::to_string(c));
    if (f.height < 1 || f.width < 1) shape.fail("expected a positive height and width");
    if (f.dtype == "video" && j.has("info") && j.v.at("info").is_object() && j.v.at("info").contains("video.fps"))
      f.video_fps = j.at("info").at("video.fps").number(0);
  }
  return f;
}

std::string data_file_v2(const LeRobotDataset& d, const std::string& pattern, int64_t chunks_size, int64_t episode) {
  return join_path(d.dir, format_lerobot_path(pattern,
                                              {{"episode_chunk", episode / chunks_size},
                                               {"episode_index", episode},
                                               {"chunk_index", episode / chunks_size}},
                                              {}, "meta/info.json: $.data_path"));
}

}  // namespace

int64_t LeRobotFeature::width_of_vector() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

const LeRobotFeature* LeRobotDataset::feature(const std::string& key) const {
  for (const auto& f : features)
    if (f.key == key) return &f;
  return nullptr;
}

std::string LeRobotDataset::feature_list() const {
  std::string s;
  for (const auto& f : features) s += (s.empty() ? "" : ", ") + f.key + " (" + f.dtype + ")";
  return s;
}

std::string format_lerobot_path(const std::string& pattern, const std::map<std::string, int64_t>& ints,
                                const std::map<std::string, std::string>& strings, const std::string& what) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '}') {
      if (i + 1 < pattern.size() && pattern[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw DataError(what + ": unmatched '}' in \"" + pattern + "\"");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = pattern.find('}', i);
    if (close == std::string::npos) throw DataError(what + ": unmatched '{' in \"" + pattern + "\"");
    const std::string field = pattern.substr(i + 1, close - i - 1);
    const size_t colon = field.find(':');
    const std::string name = field.substr(0, colon);
    const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    if (auto s = strings.find(name); s != strings.end()) {
      if (!spec.empty()) throw DataError(what + ": format spec on the string field {" + field + "}");
      out += s->second;
    } else if (auto n = ints.find(name); n != ints.end()) {
      size_t width = 0;
      if (!spec.empty()) {
        // Only {name:0Nd} / {name:Nd} / {name:d}: what LeRobot's templates use.
        if (spec.back() != 'd' || spec.find_first_not_of("0123456789d") != std::string::npos ||
            spec.find('d') != spec.size() - 1)
          throw DataError(what + ": unsupported format spec {" + field + "} in \"" + pattern + "\"");
        const std::string digits = spec.substr(0, spec.size() - 1);
        if (!digits.empty()) width = static_cast<size_t>(std::stoul(digits));
        if (width > 32) throw DataError(what + ": field width too large in {" + field + "}");
      }
      std::string v = std::to_string(n->second);
      if (v.size() < width) v.insert(0, width - v.size(), '0');
      out += v;
    } else {
      throw DataError(what + ": unknown field {" + name + "} in \"" + pattern + "\"");
    }
    i = close;
  }
  return out;
}

LeRobotDataset read_lerobot_dataset(const std::string& dir) {
  LeRobotDataset d;
  d.dir = dir;
  const std::string info_path = join_path(dir, "meta/info.json");
  if (!path_exists(info_path)) throw DataError(info_path + ": missing (not a LeRobot dataset?)");
  const ojson info_json = parse_json(read_small_file(info_path), info_path);
  const Json info{info_json, info_path, "$"};
  if (!info_json.is_object()) info.fail("expected an object");
  d.version = info.at("codebase_version").string();
  if (d.version != "v2.0" && d.version != "v2.1" && d.version != "v3.0")
    info.at("codebase_version")
        .fail("\"" + d.version + "\" is not a version vlatune reads (" + kLeRobotVersions +
              "; LeRobot converts older ones with its convert_dataset scripts)");
  const bool v3 = d.version == "v3.0";
  d.fps = info.at("fps").number(1e-9);
  const int64_t chunks_size = info.has("chunks_size") ? info.at("chunks_size").integer(1) : 1000;
  const std::string data_path = info.at("data_path").string();
  std::string video_path;
  if (info.has("video_path") && !info_json.at("video_path").is_null()) video_path = info.at("video_path").string();

  const Json features = info.at("features");
  if (!info_json.at("features").is_object()) features.fail("expected an object");
  for (auto it = info_json.at("features").begin(); it != info_json.at("features").end(); ++it) {
    const Json f{it.value(), info_path, "$.features." + it.key()};
    if (!it.value().is_object()) f.fail("expected an object");
    d.features.push_back(read_feature(it.key(), f));
  }
  bool any_video = false;
  for (auto& f : d.features) {
    if (f.dtype != "video") continue;
    any_video = true;
    if (f.video_fps > 0 && std::abs(f.video_fps - d.fps) > 1e-6)
      throw DataError(info_path + ": $.features." + f.key + ".info[\"video.fps\"] is " + std::to_string(f.video_fps) +
                      " but $.fps is " + std::to_string(d.fps) + " (fps that disagree)");
  }
  if (any_video && video_path.empty())
    throw DataError(info_path + ": $.video_path: missing, but the features include videos");

  // Tasks.
  if (v3) {
    const std::string tasks_file = join_path(dir, "meta/tasks.parquet");
    ParquetTable t(tasks_file);
    const std::string task_column = t.has_column("task") ? "task" : "__index_level_0__";
    const auto names = t.string_column(task_column);
    const auto idx = t.int_column("task_index");
    for (size_t i = 0; i < names.size(); ++i) {
      if (!d.tasks.emplace(idx[i], names[i]).second)
        throw DataError(tasks_file + ": task_index " + std::to_string(idx[i]) + " appears twice");
    }
  } else {
    const std::string tasks_file = join_path(dir, "meta/tasks.jsonl");
    for_each_jsonl_row(tasks_file, [&](const Json& row) {
      const int64_t index = row.at("task_index").integer(0);
      if (!d.tasks.emplace(index, row.at("task").string()).second)
        row.at("task_index").fail("task_index " + std::to_string(index) + " appears twice");
    });
  }

  // Episodes.
  if (v3) {
    const std::string episodes_dir = join_path(dir, "meta/episodes");
    if (!is_directory(episodes_dir)) throw DataError(episodes_dir + ": missing (a v3.0 dataset's episode table)");
    const auto files = list_files_recursive(episodes_dir, {".parquet"});
    if (files.empty()) throw DataError(episodes_dir + ": no parquet files");
    std::vector<std::string> video_keys;
    for (const auto& f : d.features)
      if (f.dtype == "video") video_keys.push_back(f.key);
    for (const auto& file : files) {
      ParquetTable t(file);
      const auto index = t.int_column("episode_index");
      const auto length = t.int_column("length");
      const auto tasks = t.string_list_column("tasks");
      const auto chunk = t.int_column("data/chunk_index");
      const auto file_index = t.int_column("data/file_index");
      const auto from = t.int_column("dataset_from_index");
      const auto to = t.int_column("dataset_to_index");
      std::map<std::string, std::vector<int64_t> > v_chunk, v_file;
      std::map<std::string, std::vector<double> > v_from, v_to;
      for (const auto& key : video_keys) {
        v_chunk[key] = t.int_column("videos/" + key + "/chunk_index");
        v_file[key] = t.int_column("videos/" + key + "/file_index");
        v_from[key] = t.float_column("videos/" + key + "/from_timestamp");
        v_to[key] = t.float_column("videos/" + key + "/to_timestamp");
      }
      for (size_t r = 0; r < index.size(); ++r) {
        LeRobotEpisode e;
        e.index = index[r];
        e.length = length[r];
        e.tasks = tasks[r];
        e.from_index = from[r];
        e.to_index = to[r];
        const std::string row = file + ": row " + std::to_string(r) + " (episode " + std::to_string(e.index) + ")";
        if (e.length < 1) throw DataError(row + ": length " + std::to_string(e.length));
        if (e.to_index - e.from_index != e.length)
          throw DataError(row + ": dataset_to_index - dataset_from_index = " +
                          std::to_string(e.to_index - e.from_index) + ", but length is " + std::to_string(e.length));
        e.data_file =
            join_path(dir, format_lerobot_path(data_path, {{"chunk_index", chunk[r]}, {"file_index", file_index[r]}},
                                               {}, info_path + ": $.data_path"));
        for (const auto& key : video_keys) {
          LeRobotVideoSpan span;
          span.file = join_path(
              dir, format_lerobot_path(video_path, {{"chunk_index", v_chunk[key][r]}, {"file_index", v_file[key][r]}},
                                       {{"video_key", key}}, info_path + ": $.video_path"));
          span.from_timestamp = v_from[key][r];
          span.to_timestamp = v_to[key][r];
          if (span.from_timestamp < 0 || span.to_timestamp < span.from_timestamp)
            throw DataError(row + ": videos/" + key + " from/to timestamps are out of order");
          e.videos[key] = span;
        }
        d.episodes.push_back(std::move(e));
      }
    }
  } else {
    const std::string episodes_file = join_path(dir, "meta/episodes.jsonl");
    for_each_jsonl_row(episodes_file, [&](const Json& row) {
      LeRobotEpisode e;
      e.index = row.at("episode_index").integer(0);
      e.length = row.at("length").integer(1);
      const Json tasks = row.at("tasks");
      for (size_t i = 0, n_tasks = tasks.array(); i < n_tasks; ++i) e.tasks.push_back(tasks.element(i).string());
      e.data_file = data_file_v2(d, data_path, chunks_size, e.index);
      for (const auto& f : d.features) {
        if (f.dtype != "video") continue;
        LeRobotVideoSpan span;
        span.file = join_path(dir, format_lerobot_path(video_path,
                                                       {{"episode_chunk", e.index / chunks_size},
                                                        {"chunk_index", e.index / chunks_size},
                                                        {"episode_index", e.index}},
                                                       {{"video_key", f.key}}, info_path + ": $.video_path"));
        e.videos[f.key] = span;
      }
      d.episodes.push_back(std::move(e));
    });
  }
  std::sort(d.episodes.begin(), d.episodes.end(),
            [](const LeRobotEpisode& a, const LeRobotEpisode& b) { return a.index < b.index; });
  for (size_t i = 1; i < d.episodes.size(); ++i)
    if (d.episodes[i].index == d.episodes[i - 1].index)
      throw DataError(dir + ": episode_index " + std::to_string(d.episodes[i].index) + " appears twice in meta/");
  if (d.episodes.empty()) throw DataError(dir + ": the dataset lists no episodes");
  if (info.has("total_episodes") && info.at("total_episodes").integer(0) != static_cast<int64_t>(d.episodes.size()))
    info.at("total_episodes")
        .fail("is " + std::to_string(info.at("total_episodes").integer(0)) + ", but meta/ lists " +
              std::to_string(d.episodes.size()) + " episodes");
  return d;
}

std::map<size_t, LeRobotFrames> read_lerobot_frames(const LeRobotDataset& d, const std::string& file,
                                                    const std::vector<size_t>& episodes, const std::string& state_key,
                                                    int64_t state_dim, const std::string& action_key,
                                                    int64_t action_dim, double tolerance_s) {
  ParquetTable t(file);
  const auto episode_index = t.int_column("episode_index");
  const auto frame_index = t.int_column("frame_index");
  const auto task_index = t.int_column("task_index");
  const auto timestamp = t.float_column("timestamp");
  const auto state = t.vector_column(state_key, state_dim);
  const auto actions = t.vector_column(action_key, action_dim);
  // Rows by episode: each episode's rows are contiguous in LeRobot's files.
  std::map<int64_t, std::pair<int64_t, int64_t> > ranges;  // episode -> [first, end)
  for (int64_t r = 0; r < static_cast<int64_t>(episode_index.size()); ++r) {
    auto [it, fresh] = ranges.emplace(episode_index[static_cast<size_t>(r)], std::make_pair(r, r + 1));
    if (!fresh) {
      if (it->second.second != r)
        throw DataError(file + ": row " + std::to_string(r) + ": episode " + std::to_string(it->first) +
                        "'s rows are not contiguous");
      it->second.second = r + 1;
    }
  }
  const auto global = t.has_column("index") ? t.int_column("index") : std::vector<int64_t>{};
  std::map<size_t, LeRobotFrames> out;
  for (size_t pos : episodes) {
    const LeRobotEpisode& e = d.episodes[pos];
    const std::string where = file + ": episode " + std::to_string(e.index);
    const auto range = ranges.find(e.index);
    if (range == ranges.end()) throw DataError(where + ": no rows (meta/ lists it in this file)");
    const auto [first, end] = range->second;
    if (end - first != e.length)
      throw DataError(where + ": " + std::to_string(end - first) + " rows, but meta/ gives length " +
                      std::to_string(e.length));
    LeRobotFrames f;
    f.first_row = first;
    for (int64_t r = first; r < end; ++r) {
      const auto i = static_cast<size_t>(r);
      const int64_t k = r - first;
      const std::string at = where + ", frame " + std::to_string(k) + " (row " + std::to_string(r) + ")";
      if (frame_index[i] != k) throw DataError(at + ": frame_index is " + std::to_string(frame_index[i]));
      if (d.tasks.find(task_index[i]) == d.tasks.end())
        throw DataError(at + ": task_index " + std::to_string(task_index[i]) + " is not in meta/tasks");
      f.timestamps.push_back(timestamp[i]);
      f.task_index.push_back(task_index[i]);
      if (k > 0) {
        const double step = timestamp[i] - timestamp[i - 1];
        if (std::abs(step - 1.0 / d.fps) > tolerance_s)
          throw DataError(at + ": timestamp " + std::to_string(timestamp[i]) + " s is " + std::to_string(step) +
                          " s after the previous frame; fps " + std::to_string(d.fps) + " says " +
                          std::to_string(1.0 / d.fps) + " (tolerance " + std::to_string(tolerance_s) + " s)");
      }
    }
    if (e.from_index >= 0) {
      // v3.0: the episode's global frame range must match (a row mix-up would pair wrong frames and videos).
      if (!global.empty() && global[static_cast<size_t>(first)] != e.from_index)
        throw DataError(where + ": the first row's index is " + std::to_string(global[static_cast<size_t>(first)]) +
                        ", but meta/episodes says dataset_from_index " + std::to_string(e.from_index));
    }
    f.state.assign(state.begin() + first * state_dim, state.begin() + end * state_dim);
    f.actions.assign(actions.begin() + first * action_dim, actions.begin() + end * action_dim);
    out.emplace(pos, std::move(f));
  }
  return out;
}

}  // namespace vlatune::trainer
