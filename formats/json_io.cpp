#include "formats/json_io.h"

#include <set>
#include <vector>

#include "formats/json_error.h"

namespace vlatune::formats {

namespace {

// Tracks the JSON path during parsing so that a repeated key, a number out of range or too deep a nesting can be
// reported where it occurs. nlohmann's parser callback sees keys and container boundaries in document order; each
// open container is one frame.
class PathTracker {
 public:
  explicit PathTracker(const std::string& file) : file_(file) {}

  bool on_event(nlohmann::json::parse_event_t event, const nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (frames_.size() >= static_cast<size_t>(kMaxJsonDepth))
          throw FormatError(file_, path(),
                            "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels (no vlatune file is)");
        frames_.push_back(Frame{event == E::array_start, 0, {}, {}});
        break;
      case E::key: {
        Frame& top = frames_.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second) {
          throw FormatError(file_, path(), "duplicate key '" + top.key + "' (each key may appear once per object)");
        }
        break;
      }
      case E::object_end:
      case E::array_end:
        frames_.pop_back();
        element_done();
        break;
      case E::value:
        element_done();
        break;
    }
    return true;
  }

  // The path of the value being parsed now (or of the container that holds it).
  std::string path() const {
    std::string p = "$";
    for (const Frame& f : frames_) p += f.is_array ? "[" + std::to_string(f.next_index) + "]" : "." + f.key;
    return p;
  }

 private:
  struct Frame {
    bool is_array;
    size_t next_index;
    std::string key;
    std::set<std::string> keys;
  };

  // A finished value advances the index of the array that holds it.
  void element_done() {
    if (!frames_.empty() && frames_.back().is_array) ++frames_.back().next_index;
  }

  const std::string& file_;
  std::vector<Frame> frames_;
};

// nlohmann's message without its "[json.exception.parse_error.101] " tag.
std::string plain_message(const nlohmann::json::exception& e) {
  std::string what = e.what();
  const auto bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& file) {
  PathTracker tracker(file);
  try {
    return nlohmann::json::parse(text, [&tracker](int /*depth*/, nlohmann::json::parse_event_t event,
                                                  nlohmann::json& parsed) { return tracker.on_event(event, parsed); });
  } catch (const nlohmann::json::parse_error& e) {
    // Keep the part a user can act on and add the byte offset (editors jump to it).
    throw FormatError(file, "", "not valid JSON: at byte " + std::to_string(e.byte) + ": " + plain_message(e));
  } catch (const nlohmann::json::exception& e) {
    // A number beyond the range of a double ("number overflow parsing '1e400'"), or any other refusal of the
    // parser: named at the value where it happened.
    throw FormatError(file, tracker.path(), plain_message(e));
  }
}

nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes) {
  return parse_json_text(read_text_file(path, max_bytes), path);
}

std::string dump_json_file(const nlohmann::json& j) {
  return j.dump(2) + "\n";
}

}  // namespace vlatune::formats
