// Shared JSON and file plumbing: file errors, syntax positions, numbers out of range, nesting, duplicate keys,
// strict typed access; regular files only and size bounds on input; atomic writes, long names and failed writes.
#include <catch2/catch.hpp>

#include "file_size_limit.h"
#include "temp_dir.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"
#include "formats/metrics_jsonl.h"
#include "formats/profile.h"
#include "formats/recipe.h"
#include "formats/run_record.h"

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
  CHECK_THROWS_AS(write_file_atomic("/nonexistent/dir/out.json", "x"), WriteError);
}

TEST_CASE("A number beyond a double is refused at its JSON path, not thrown past the readers", "[formats][json_io]") {
  CHECK(json_path_of(R"({"predicted": {"step_ms": 1e400}})") == "$.predicted.step_ms");
  CHECK(json_path_of(R"({"a": [1, 2, -1e400]})") == "$.a[2]");
  CHECK_THROWS_WITH(parse_json_text("[1e400]", "x.json"),
                    Catch::StartsWith("x.json: $[0]: ") && Catch::Contains("1e400"));
  // Every reader: a FormatError (exit 4), never another exception (exit 1).
  CHECK_THROWS_AS(parse_recipe(parse_json_text(R"({"predicted": {"step_ms": 1e400}})", "r.json"), "r.json"),
                  FormatError);
  CHECK_THROWS_AS(parse_metrics("{\"schema\":\"vlatune.metrics/1\"}\n{\"step\": 1e999}\n", "m.jsonl"), FormatError);
  // Tiny numbers underflow to 0 and huge integers become doubles: valid JSON, judged by the readers' ranges.
  CHECK(parse_json_text("[1e-400]", "x.json")[0].get<double>() == 0.0);
  CHECK(parse_json_text("[18446744073709551616]", "x.json")[0].is_number_float());
}

TEST_CASE("JSON nested deeper than the limit is refused at once", "[formats][json_io]") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THROWS_WITH(parse_json_text(deep, "deep.json"), Catch::Contains("nested deeper than 64 levels"));
  std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  CHECK_NOTHROW(parse_json_text(ok, "ok.json"));
  CHECK_THROWS_AS(parse_json_text("[" + ok + "]", "x.json"), FormatError);
}

TEST_CASE("Readers take regular files only: a FIFO, /dev/zero or a directory is refused without blocking",
          "[formats][json_io]") {
  TempDir dir("json_io_special");
  const std::string fifo = dir.file("fifo.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Without O_NONBLOCK, opening a FIFO that has no writer would wait here forever.
  CHECK_THROWS_WITH(read_recipe(fifo), Catch::StartsWith(fifo + ": is a FIFO (named pipe), not a regular file"));
  CHECK_THROWS_AS(read_profile(fifo), FormatError);
  CHECK_THROWS_AS(read_run_record(fifo), FormatError);
  CHECK_THROWS_AS(read_metrics(fifo), FormatError);
  CHECK_THROWS_WITH(read_json_file("/dev/zero"), Catch::Contains("is a character device, not a regular file"));
  CHECK_THROWS_WITH(read_text_file(dir.path), Catch::Contains("is a directory"));
}

TEST_CASE("A JSON input larger than its bound is refused before it is read", "[formats][json_io]") {
  TempDir dir("json_io_big");
  const std::string big = dir.file("big.json");
  { std::ofstream(big) << "{}"; }
  REQUIRE(::truncate(big.c_str(), static_cast<off_t>(kMaxJsonFileBytes + 1)) == 0);  // sparse: no disk used
  CHECK_THROWS_WITH(read_recipe(big), Catch::Contains(std::to_string(kMaxJsonFileBytes + 1) + " bytes is more than"));
  CHECK_THROWS_WITH(read_text_file(big, 1 << 20), Catch::Contains("1048576-byte limit"));
  REQUIRE(::truncate(big.c_str(), 2) == 0);
  CHECK(read_text_file(big, 2) == "{}");
}

TEST_CASE("An atomic write works for a file name of 255 bytes, the longest a name can be", "[formats][json_io]") {
  TempDir dir("json_io_long");
  for (size_t len : {size_t{240}, size_t{250}, size_t{255}}) {
    INFO("name of " << len << " bytes");
    const std::string path = dir.file(std::string(len - 5, 'r') + ".json");
    write_file_atomic(path, "{}\n");
    CHECK(read_text_file(path) == "{}\n");
    write_file_atomic(path, "[]\n");  // and over an existing one
    CHECK(read_text_file(path) == "[]\n");
    CHECK(temp_name_beside(path).size() - dir.path.size() - 1 <= 255);
  }
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 3);
}

TEST_CASE("A write that fails (disk full) is a WriteError naming the file and the OS error, and leaves no file",
          "[formats][json_io]") {
  TempDir dir("json_io_full");
  const std::string path = dir.file("recipe.json");
  write_file_atomic(path, "old\n");
  {
    vlatune::test::FileSizeLimit limit(64);
    try {
      write_file_atomic(path, std::string(4096, 'x'));
      FAIL("the write did not fail");
    } catch (const WriteError& e) {
      CHECK(e.file() == path);
      CHECK_THAT(std::string(e.what()), Catch::StartsWith(path + ": write failed: File too large"));
    }
    CHECK_THROWS_AS(write_recipe(Recipe{}, dir.file("new.json")), WriteError);
  }
  CHECK(read_text_file(path) == "old\n");  // the old file is intact
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 1);  // no temporary file, no partial new.json
}

TEST_CASE("same_file tells an output that is one of the inputs, under any spelling", "[formats][json_io]") {
  TempDir dir("json_io_same");
  const std::string a = dir.file("a.json");
  write_file_atomic(a, "{}");
  CHECK(same_file(a, a));
  CHECK(same_file(a, dir.path + "//a.json"));
  std::filesystem::create_directory(dir.file("sub"));
  CHECK(same_file(a, dir.path + "/./sub/../a.json"));
  REQUIRE(::symlink(a.c_str(), dir.file("link.json").c_str()) == 0);
  CHECK(same_file(a, dir.file("link.json")));
  CHECK_FALSE(same_file(a, dir.file("b.json")));
  CHECK(same_file(dir.file("new.json"), dir.path + "/sub/../new.json"));  // neither exists yet
  CHECK(available_bytes(dir.file("not/yet/there")) > 0);
  CHECK_THROWS_WITH(require_free_space(dir.path, uint64_t{1} << 62, "a dataset"),
                    Catch::Contains("a dataset needs about") && Catch::Contains("available"));
}
