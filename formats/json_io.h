// JSON plumbing shared by every format reader/writer: parsing with positions, duplicate-key detection and bounds,
// and the on-disk form. Every failure is a FormatError naming the file. Files themselves (regular files only, size
// bounds, atomic writes) are formats/file_io.h.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "formats/file_io.h"

namespace vlatune::formats {

// Containers nested deeper than this are refused: no vlatune format nests beyond a handful of levels, and a
// document of a million '[' would otherwise make every recursive walk over it (dump, comparison) overflow the stack.
inline constexpr int kMaxJsonDepth = 64;

// Parses one JSON document. Errors name `file`:
//   - syntax: "not valid JSON: at byte 17 (line 2, column 5): syntax error while parsing object ..."
//   - a number out of the range of a double (1e400): FormatError(file, "$.predicted.step_ms", "number overflow ...")
//   - a key repeated in one object (nlohmann would silently keep the last one, hiding a typo'd recipe edit):
//     FormatError(file, "$.batch.micro_batch", "duplicate key 'micro_batch'").
//   - nesting deeper than kMaxJsonDepth.
nlohmann::json parse_json_text(const std::string& text, const std::string& file);

// read_text_file (regular files of at most `max_bytes`) + parse_json_text.
nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes = kMaxJsonFileBytes);

// Pretty JSON (2-space indent, keys sorted, trailing newline): the on-disk form of recipe.json and run.json.
std::string dump_json_file(const nlohmann::json& j);

}  // namespace vlatune::formats
