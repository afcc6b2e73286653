// Shared JSON plumbing: file errors, syntax positions, duplicate keys, strict typed access, atomic writes.
#include <catch2/catch.hpp>

#include "temp_dir.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"

using namespace vlatune::formats;
using nlohmann::json;

using vlatune::test::TempDir;

namespace {

std::string json_path_of(const std::string& text) {
  try {
    parse_json_text(text, "x.json");
  } catch (const FormatError& e) {
    return e.json_path();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("Reading a missing file names the file", "[formats][json_io]") {
  CHECK_THROWS_WITH(read_json_file("/nonexistent/dir/recipe.json"),
                    Catch::StartsWith("/nonexistent/dir/recipe.json: cannot read: "));
}

TEST_CASE("A JSON syntax error names the file and the byte offset", "[formats][json_io]") {
  CHECK_THROWS_WITH(parse_json_text("{\"a\": 1,\n \"b\": }", "recipe.json"),
                    Catch::StartsWith("recipe.json: not valid JSON: at byte 16: ") && Catch::Contains("line 2"));
  CHECK_THROWS_WITH(parse_json_text("", "empty.json"), Catch::StartsWith("empty.json: not valid JSON: at byte"));
}

TEST_CASE("A repeated key is rejected at its JSON path", "[formats][json_io]") {
  CHECK(json_path_of(R"({"a": 1, "a": 2})") == "$.a");
  CHECK(json_path_of(R"({"batch": {"micro_batch": 1, "micro_batch": 2}})") == "$.batch.micro_batch");
  CHECK(json_path_of(R"({"g": [{"n": 1}, {"x": [1, {"k": 0}], "n": 2, "n": 3}]})") == "$.g[1].n");
  CHECK(json_path_of(R"({"g": [[1, 2], [{"k": 0, "k": 1}]]})") == "$.g[1][0].k");
  CHECK_NOTHROW(parse_json_text(R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]})", "x.json"));
  CHECK_THROWS_WITH(parse_json_text(R"({"a": 1, "a": 2})", "x.json"), Catch::Contains("duplicate key 'a'"));
}

TEST_CASE("Typed access is strict about JSON types and says what it expected", "[formats][json_io]") {
  const std::string file = "f.json";
  const json j = json::parse(R"({"s": "32", "i": 32, "f": 32.5, "neg": -1, "b": true, "n": null, "arr": [1]})");
  const JsonCursor c(j, file);
  CHECK(c.at("i").get_int(1) == 32);
  CHECK_THROWS_WITH(c.at("s").get_int(1), "f.json: $.s: expected an integer >= 1, got string \"32\"");
  CHECK_THROWS_WITH(c.at("f").get_int(), "f.json: $.f: expected an integer, got 32.5");
  CHECK_THROWS_WITH(c.at("neg").get_int(1, 10), "f.json: $.neg: expected an integer in 1..10, got -1");
  CHECK_THROWS_WITH(c.at("i").get_bool(), "f.json: $.i: expected true or false, got 32");
  CHECK_THROWS_WITH(c.at("b").get_string(), "f.json: $.b: expected a string, got true");
  CHECK_THROWS_WITH(c.at("neg").get_number(0.0), "f.json: $.neg: expected a finite number >= 0, got -1");
  CHECK_THROWS_WITH(c.at("arr").get_optional_number(), "f.json: $.arr: expected a finite number or null, got an array");
  CHECK_FALSE(c.at("n").get_optional_int().has_value());
  CHECK_THROWS_WITH(c.at("missing"), "f.json: $.missing: missing required key");
  CHECK_THROWS_WITH(c.at("s").get_enum({"lean", "materialized"}),
                    "f.json: $.s: expected one of \"lean\", \"materialized\", got string \"32\"");
}

TEST_CASE("Unknown keys are rejected with the allowed keys and a spelling hint", "[formats][json_io]") {
  const std::string file = "recipe.json";
  const json j = json::parse(R"({"batch": {"micro_bach": 3}})");
  const JsonCursor batch = JsonCursor(j, file).at("batch");
  CHECK_THROWS_WITH(batch.expect_object({"micro_batch", "grad_accum"}),
                    "recipe.json: $.batch.micro_bach: unknown key (expected one of: micro_batch, grad_accum; "
                    "did you mean 'micro_batch'?)");
  const json k = json::parse(R"({"zzz": 1})");
  CHECK_THROWS_WITH(JsonCursor(k, file).expect_object({"micro_batch"}), !Catch::Contains("did you mean"));
}

TEST_CASE("An atomic write replaces the file and leaves no temporary behind", "[formats][json_io]") {
  TempDir dir("json_io");
  const std::string path = dir.file("out.json");
  write_file_atomic(path, "first\n");
  write_file_atomic(path, "second\n");
  CHECK(read_text_file(path) == "second\n");
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 1);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
}

TEST_CASE("An atomic write into a missing directory names the file", "[formats][json_io]") {
  CHECK_THROWS_WITH(write_file_atomic("/nonexistent/dir/out.json", "x"),
                    Catch::StartsWith("/nonexistent/dir/out.json: cannot create a temporary file"));
}
