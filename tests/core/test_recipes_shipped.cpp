// Every shipped recipe (recipes/*.json) and the README's example parse as valid recipes.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "formats/json_io.h"
#include "formats/recipe.h"

using namespace vlatune::formats;

TEST_CASE("Every shipped recipe parses", "[recipes][recipe]") {
  const std::string dir = std::string(VLATUNE_RECIPES_DIR);
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path().string());
    CHECK_NOTHROW(read_recipe(entry.path().string()));
    ++parsed;
  }
  REQUIRE(parsed > 0);
}

TEST_CASE("The shipped defaults recipe is exactly the default recipe", "[recipes][recipe]") {
  const Recipe r = read_recipe(std::string(VLATUNE_RECIPES_DIR) + "/pi05_libero_defaults.json");
  CHECK(r == Recipe{});
}

TEST_CASE("The recipes README example parses", "[recipes][recipe]") {
  const std::string path = std::string(VLATUNE_RECIPES_DIR) + "/README.md";
  const std::string text = read_text_file(path);
  const std::string marker = "## Example";
  const size_t section = text.find(marker);
  REQUIRE(section != std::string::npos);
  const size_t open = text.find("```json\n", section);
  REQUIRE(open != std::string::npos);
  const size_t begin = open + 8;
  const size_t close = text.find("```", begin);
  REQUIRE(close != std::string::npos);
  const Recipe r = parse_recipe(parse_json_text(text.substr(begin, close - begin), path), path);
  CHECK(r.batch.micro_batch == 64);
  CHECK(r.recompute.modules.size() == 1);
  CHECK(r.fp8.modules.size() == 3);
}
