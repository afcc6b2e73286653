// File and text plumbing shared by every format reader/writer: reading a file, parsing JSON with positions and
// duplicate-key detection, and atomic writes. Every failure is a FormatError naming the file.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace vlatune::formats {

// The whole file as bytes. Missing or unreadable file -> FormatError(path, "", "cannot read: <strerror>").
std::string read_text_file(const std::string& path);

// Parses one JSON document. Errors name `file`:
//   - syntax: "not valid JSON: at byte 17 (line 2, column 5): syntax error while parsing object ..."
//   - a key repeated in one object (nlohmann would silently keep the last one, hiding a typo'd recipe edit):
//     FormatError(file, "$.batch.micro_batch", "duplicate key 'micro_batch'").
nlohmann::json parse_json_text(const std::string& text, const std::string& file);

// read_text_file + parse_json_text.
nlohmann::json read_json_file(const std::string& path);

// Writes `content` to `path` atomically: a temporary file in the same directory, fsync, rename over `path`, fsync
// of the directory. A reader never sees a half-written file, and a crash leaves the old file in place.
void write_file_atomic(const std::string& path, const std::string& content);

// Pretty JSON (2-space indent, keys sorted, trailing newline): the on-disk form of recipe.json and run.json.
std::string dump_json_file(const nlohmann::json& j);

}  // namespace vlatune::formats
