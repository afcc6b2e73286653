// model/safetensors_io + model/state_dict: bit-exact round trips, every class of corrupt file rejected with the
// file name and the reason, and state-dict loads that report missing / unexpected / mismatched keys exactly.
// Every file a test reads is written by the test (by write_safetensors, or byte by byte for corrupt ones).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "temp_dir.h"

#include "../core/file_size_limit.h"
#include "formats/file_io.h"
#include "model/safetensors_io.h"
#include "model/state_dict.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <limits>

using Catch::Matchers::Contains;
using vlatune::model::load_state_dict;
using vlatune::model::LoadReport;
using vlatune::model::SafetensorsError;
using vlatune::model::SafetensorsFile;
using vlatune::model::save_state_dict;
using vlatune::model::StateDictError;
using vlatune::model::write_safetensors;

namespace {

// A fresh directory per test case, removed afterwards, that lists what the case left in it.
struct TempDir : vlatune::test::TempDir {
  TempDir() : vlatune::test::TempDir("st") {}
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.emplace_back(e->d_name);
      }
      ::closedir(d);
    }
    return out;
  }
};

uint64_t file_size(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return static_cast<uint64_t>(st.st_size);
}

void truncate_by(const std::string& path, uint64_t bytes) {
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(file_size(path) - bytes)) == 0);
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file with the given header text and data bytes, the length field set to the header's size.
std::string file_bytes(const std::string& header, const std::string& data = "") {
  return u64_le(header.size()) + header + data;
}

// The message of the SafetensorsError that fn throws ("" when it throws nothing; other exceptions fail).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

std::string open_error(const std::string& path) {
  return error_of([&] { SafetensorsFile::open(path); });
}

// Same dtype, same shape, same bytes (NaN payloads and -0.0 included).
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  auto ca = a.contiguous(), cb = b.contiguous();
  if (ca.nbytes() == 0) return true;  // memcmp on the null data pointer of an empty tensor would be UB
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// encoder.{0,2} = Linear, encoder.1 = ReLU (no parameters), head = Linear, plus a buffer: nested names, two kinds.
struct TinyNet : torch::nn::Module {
  torch::nn::Sequential encoder{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor scale;
  explicit TinyNet(int64_t head_in = 4) {
    encoder = register_module(
        "encoder", torch::nn::Sequential(torch::nn::Linear(3, 5), torch::nn::ReLU(), torch::nn::Linear(5, head_in)));
    head = register_module("head", torch::nn::Linear(head_in, 2));
    scale = register_buffer("scale", torch::full({2}, 0.5));
  }
};

const std::vector<std::string> kTinyNetNames = {
    "encoder.0.bias", "encoder.0.weight", "encoder.2.bias", "encoder.2.weight", "head.bias", "head.weight", "scale"};

std::vector<std::pair<std::string, torch::Tensor>> named_tensors_of(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  for (const auto& b : m.named_buffers()) out.emplace_back(b.key(), b.value().clone());
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------- round trips

TEST_CASE("Every supported dtype round-trips bit-exactly, with scalars and empty tensors", "[safetensors]") {
  TempDir tmp;
  torch::manual_seed(0);
  auto f32 = torch::randn({3, 4});
  f32[0][0] = std::numeric_limits<float>::quiet_NaN();
  f32[0][1] = -0.0f;
  f32[0][2] = std::numeric_limits<float>::infinity();
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"f32", f32},
      {"bf16", torch::randn({2, 3, 5}).to(torch::kBFloat16)},
      {"f16", torch::randn({7}).to(torch::kHalf)},
      {"i64", torch::tensor(
                  {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0}, std::numeric_limits<int64_t>::max()})},
      {"i32", torch::randint(-1000000, 1000000, {3, 3}, torch::kInt)},
      {"u8", torch::arange(256, torch::kInt).to(torch::kByte).reshape({16, 16})},
      {"bool", torch::tensor({true, false, false, true, true})},
      {"scalar_f32", torch::tensor(3.25f)},
      {"scalar_i64", torch::tensor(int64_t{-7})},
      {"empty_f32", torch::empty({0, 3})},
      {"empty_bool", torch::empty({4, 0}, torch::kBool)},
      {"strided_view", torch::arange(12, torch::kFloat).reshape({3, 4}).t()},  // written contiguous
  };
  const std::string path = tmp / "all.safetensors";
  write_safetensors(path, tensors);

  auto file = SafetensorsFile::open(path);
  REQUIRE(file.entries().size() == tensors.size());
  CHECK(file.metadata().empty());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    REQUIRE(file.contains(name));
    auto got = file.tensor(name);
    CHECK(got.device().is_cpu());
    CHECK(same_bits(got, t));
  }
  CHECK(file.entry("bf16").dtype == "BF16");
  CHECK(file.entry("bool").dtype == "BOOL");
  CHECK(file.entry("scalar_f32").shape.empty());
  CHECK(file.tensor("scalar_f32").dim() == 0);
  CHECK(file.entry("empty_f32").begin == file.entry("empty_f32").end);
  CHECK_FALSE(file.contains("nope"));
}

TEST_CASE("The writer's layout is the reference one: aligned header, buffer tiled without gaps", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "layout.safetensors";
  // Given order u8 (3 bytes), f32, i64, bf16: a gap-free buffer ordered by element size keeps each aligned.
  write_safetensors(path, {{"a_u8", torch::ones({3}, torch::kByte)},
                           {"b_f32", torch::ones({5})},
                           {"c_i64", torch::ones({2}, torch::kLong)},
                           {"d_bf16", torch::ones({3}, torch::kBFloat16)}});
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  CHECK((8 + n) % 8 == 0);
  CHECK(bytes[8] == '{');

  auto file = SafetensorsFile::open(path);
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& e : file.entries()) {
    spans.emplace_back(e.begin, e.end);
    const uint64_t itemsize = (e.end - e.begin) / static_cast<uint64_t>(c10::multiply_integers(e.shape));
    CHECK(e.begin % itemsize == 0);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (auto [b, e] : spans) {
    CHECK(b == at);
    at = e;
  }
  CHECK(8 + n + at == bytes.size());  // the last tensor ends the file
  CHECK(file.entry("c_i64").begin == 0);
  CHECK(file.entry("b_f32").begin == 16);
  CHECK(file.entry("d_bf16").begin == 36);
  CHECK(file.entry("a_u8").begin == 42);
}

TEST_CASE("A hand-written reference file reads; header padding spaces are accepted", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "hand.safetensors";
  std::string data(8, '\0');
  const float v[2] = {1.5f, -2.0f};
  std::memcpy(data.data(), v, 8);
  write_bytes(path, file_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("__metadata__":{"format":"pt"}}     )",
                               data));
  auto file = SafetensorsFile::open(path);
  CHECK(file.metadata().at("format") == "pt");
  CHECK(torch::equal(file.tensor("x"), torch::tensor({1.5f, -2.0f})));
}

TEST_CASE("Metadata round-trips", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "meta.safetensors";
  std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"vlatune.config", R"({"width": 64})"}, {"empty", ""}, {"unicode", "π0.5 ✓"}};
  write_safetensors(path, {{"w", torch::ones({2})}}, meta);
  CHECK(SafetensorsFile::open(path).metadata() == meta);
  write_safetensors(path, {}, meta);  // no tensors at all, replacing the previous file
  auto file = SafetensorsFile::open(path);
  CHECK(file.entries().empty());
  CHECK(file.metadata() == meta);
}

TEST_CASE("The writer rejects what it cannot store, naming the tensor and the file, and leaves no file",
          "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "bad.safetensors";
  auto msg = error_of([&] { write_safetensors(path, {{"w", torch::ones({2}, torch::kDouble)}}); });
  CHECK_THAT(msg, Contains(path) && Contains("'w'") && Contains("unsupported dtype") && Contains("Double"));
  msg = error_of([&] { write_safetensors(path, {{"w", torch::ones({2})}, {"w", torch::ones({2})}}); });
  CHECK_THAT(msg, Contains(path) && Contains("'w' is given twice"));
  msg = error_of([&] { write_safetensors(path, {{"__metadata__", torch::ones({2})}}); });
  CHECK_THAT(msg, Contains("reserved"));
  msg = error_of([&] { write_safetensors(path, {{"u", torch::Tensor()}}); });
  CHECK_THAT(msg, Contains("'u' is undefined"));
  // An output that cannot be written is a failed write (formats::WriteError, exit 1), not a bad file.
  CHECK_THROWS_AS(write_safetensors(tmp / "no/such/dir/x.safetensors", {{"w", torch::ones({2})}}),
                  vlatune::formats::WriteError);
  try {
    write_safetensors(tmp / "no/such/dir/x.safetensors", {{"w", torch::ones({2})}});
  } catch (const vlatune::formats::WriteError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Contains("no/such/dir/x.safetensors") && Contains("cannot create"));
  CHECK(tmp.names().empty());  // neither the file nor a temporary one left behind
}

// ------------------------------------------------------------------------------------------ corrupt files

TEST_CASE("Unreadable and truncated files are rejected with the file name and the reason", "[safetensors]") {
  TempDir tmp;
  const std::string missing = tmp / "missing.safetensors";
  CHECK_THAT(open_error(missing), Contains(missing) && Contains("cannot open") && Contains("No such file"));
  CHECK_THAT(open_error(tmp.path), Contains(tmp.path) && Contains("not a regular file"));

  const std::string tiny = tmp / "tiny.safetensors";
  write_bytes(tiny, "abc");
  CHECK_THAT(open_error(tiny), Contains(tiny) && Contains("3 bytes, shorter than the 8-byte header length"));
  write_bytes(tiny, "");
  CHECK_THAT(open_error(tiny), Contains("0 bytes"));

  const std::string longer = tmp / "longer.safetensors";
  write_bytes(longer, u64_le(1000) + "{}");
  CHECK_THAT(open_error(longer), Contains(longer) && Contains("header length 1000 bytes exceeds the 2 bytes"));

  const std::string absurd = tmp / "absurd.safetensors";
  write_bytes(absurd, u64_le(uint64_t{1} << 62) + "{}");
  CHECK_THAT(open_error(absurd), Contains(absurd) && Contains("is absurd"));
  write_bytes(absurd, u64_le(100'000'001) + "{}");
  CHECK_THAT(open_error(absurd), Contains("is absurd"));

  // A good file cut short: the last tensor's bytes are gone.
  const std::string cut = tmp / "cut.safetensors";
  write_safetensors(cut, {{"a", torch::ones({4})}, {"b", torch::ones({4})}});
  truncate_by(cut, 1);
  CHECK_THAT(open_error(cut), Contains(cut) && Contains("out of range") && Contains("truncated"));
}

TEST_CASE("Headers that are not a JSON object are rejected", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "h.safetensors";
  write_bytes(path, file_bytes("{\"a\": {\"dtype\": "));
  CHECK_THAT(open_error(path), Contains(path) && Contains("header is not valid JSON"));
  write_bytes(path, file_bytes("not json at all"));
  CHECK_THAT(open_error(path), Contains("header is not valid JSON"));
  write_bytes(path, file_bytes("{\"a\xff\": 1}"));  // invalid UTF-8
  CHECK_THAT(open_error(path), Contains("header is not valid JSON"));
  write_bytes(path, file_bytes("[1, 2]"));
  CHECK_THAT(open_error(path), Contains(path) && Contains("header is not a JSON object (it is a array)"));
  write_bytes(path, file_bytes(""));
  CHECK_THAT(open_error(path), Contains("header is not valid JSON"));
  write_bytes(path, file_bytes(R"({"__metadata__": [1]})"));
  CHECK_THAT(open_error(path), Contains("__metadata__ is not a JSON object"));
  write_bytes(path, file_bytes(R"({"__metadata__": {"k": 1}})"));
  CHECK_THAT(open_error(path), Contains("__metadata__ value of 'k' is not a string"));
}

TEST_CASE("Malformed entries are rejected naming the tensor", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "e.safetensors";
  const std::string data(64, '\0');
  struct Case {
    const char* entry;
    const char* reason;
  };
  const Case cases[] = {
      {R"("w": 3)", "tensor 'w': entry is not a JSON object (it is a number)"},
      {R"("w": {"shape": [2], "data_offsets": [0, 8]})", "tensor 'w': entry has no 'dtype'"},
      {R"("w": {"dtype": "F32", "data_offsets": [0, 8]})", "tensor 'w': entry has no 'shape'"},
      {R"("w": {"dtype": "F32", "shape": [2]})", "tensor 'w': entry has no 'data_offsets'"},
      {R"("w": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]})", "tensor 'w': 'dtype' is not a string"},
      {R"("w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]})", "tensor 'w': 'shape' is not an array"},
      {R"("w": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]})", "shape[0] is not an integer"},
      {R"("w": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]})", "shape[0] is not an integer"},
      {R"("w": {"dtype": "F32", "shape": [2, -4], "data_offsets": [0, 8]})",
       "tensor 'w': negative dimension -4 at shape[1]"},
      {R"("w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]})", "overflows"},
      {R"("w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]})", "overflows"},
      {R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 16]})",
       "tensor 'w': 'data_offsets' is not two non-negative integers"},
      {R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]})", "'data_offsets' is not two non-negative"},
      {R"("w": {"dtype": "F32", "shape": [2], "data_offsets": "0-8"})", "'data_offsets' is not two non-negative"},
      {R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]})",
       "tensor 'w': data_offsets reversed: begin 8 > end 0"},
      {R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [60, 68]})",
       "tensor 'w': data_offsets [60, 68] out of range: the data buffer has 64 bytes"},
      {R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 18446744073709551615]})", "out of range"},
      {R"("w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 8]})",
       "tensor 'w': data_offsets span 8 bytes, but F32 [2, 3] needs 24"},
      {R"("w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]})",
       "tensor 'w': unsupported dtype 'F64' (supported: F32, BF16, F16, I64, I32, U8, BOOL)"},
      {R"("w": {"dtype": "f32", "shape": [2], "data_offsets": [0, 8]})", "unsupported dtype 'f32'"},
      {R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "v": {"dtype": "I32", "shape": [2],
           "data_offsets": [4, 12]})",
       "tensors 'w' [0, 8) and 'v' [4, 12) overlap"},
      {R"("w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "v": {"dtype": "U8", "shape": [2],
           "data_offsets": [6, 8]})",
       "tensors 'w' [0, 16) and 'v' [6, 8) overlap"},
      {R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "w": {"dtype": "F32", "shape": [2],
           "data_offsets": [8, 16]})",
       "header lists the key 'w' twice"},
      {R"("w": {"dtype": "F32", "dtype": "I32", "shape": [2], "data_offsets": [0, 8]})",
       "header entry 'w' lists the key 'dtype' twice"},
  };
  for (const auto& c : cases) {
    INFO(c.entry);
    write_bytes(path, file_bytes(std::string("{") + c.entry + "}", data));
    CHECK_THAT(open_error(path), Contains(path) && Contains(c.reason));
  }
  // Deep nesting where a number belongs: rejected, not a stack overflow while parsing, reporting or freeing it.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write_bytes(path, file_bytes(R"({"w": {"dtype": "F32", "shape": [)" + deep + R"(], "data_offsets": [0, 8]}})", data));
  CHECK_THAT(open_error(path), Contains("tensor 'w': shape[0] is not an integer (an array)"));
  write_bytes(path, file_bytes(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": )" + deep + "}}", data));
  CHECK_THAT(open_error(path), Contains("tensor 'w': 'data_offsets' is not two non-negative integers"));
  // The same offsets, sizes and an empty tensor inside another one's span are fine.
  write_bytes(path, file_bytes(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                               R"( "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},)"
                               R"( "v": {"dtype": "I32", "shape": [2], "data_offsets": [8, 16]}})",
                               data));
  CHECK(open_error(path).empty());
}

TEST_CASE("tensor() rejects unknown names and BOOL bytes other than 0 and 1", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "t.safetensors";
  write_bytes(path, file_bytes(R"({"flags": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}})",
                               std::string("\x01\x02\x00", 3)));
  auto file = SafetensorsFile::open(path);
  auto msg = error_of([&] { file.tensor("flags"); });
  CHECK_THAT(msg, Contains(path) && Contains("tensor 'flags': BOOL element 1 is 2"));
  msg = error_of([&] { file.tensor("weights"); });
  CHECK_THAT(msg, Contains(path) && Contains("no tensor 'weights'"));
}

// --------------------------------------------------------------------------------------------- state dicts

TEST_CASE("save_state_dict then load_state_dict gives bit-identical parameters and buffers", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "net.safetensors";
  torch::manual_seed(1);
  TinyNet src;
  src.scale.fill_(3.0);
  save_state_dict(src, path, {{"model", "tiny"}});
  CHECK(SafetensorsFile::open(path).metadata().at("model") == "tiny");

  torch::manual_seed(2);
  TinyNet dst;
  LoadReport report = load_state_dict(dst, path);
  CHECK(report.ok());
  CHECK(report.loaded == kTinyNetNames);
  CHECK(report.stripped_prefix.empty());
  auto want = named_tensors_of(src), got = named_tensors_of(dst);
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(want[i].first == got[i].first);
    CHECK(same_bits(want[i].second, got[i].second));
  }
  CHECK(dst.head->weight.requires_grad());  // the load went around autograd, leaving parameters as they were
  CHECK(dst.head->weight.grad_fn() == nullptr);
}

TEST_CASE("load_state_dict converts to the parameter's dtype", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "bf16.safetensors";
  TinyNet src;
  std::vector<std::pair<std::string, torch::Tensor>> bf16;
  for (auto& [name, t] : named_tensors_of(src)) bf16.emplace_back(name, t.to(torch::kBFloat16));
  write_safetensors(path, bf16);
  TinyNet dst;
  REQUIRE(load_state_dict(dst, path).ok());
  CHECK(dst.head->weight.scalar_type() == torch::kFloat);
  CHECK(torch::equal(dst.head->weight, src.head->weight.detach().to(torch::kBFloat16).to(torch::kFloat)));
}

TEST_CASE("load_state_dict reports missing, unexpected and shape-mismatched keys exactly", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "partial.safetensors";
  TinyNet src(/*head_in=*/6);  // encoder.2 and head differ in shape from TinyNet(4)
  auto tensors = named_tensors_of(src);
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](const auto& kv) { return kv.first == "encoder.0.bias" || kv.first == "scale"; }),
                tensors.end());
  tensors.emplace_back("encoder.1.weight", torch::ones({1}));  // ReLU has no parameters
  tensors.emplace_back("lm_head.weight", torch::ones({2, 2}));
  write_safetensors(path, tensors);

  TinyNet dst(/*head_in=*/4);
  const auto before = named_tensors_of(dst);

  // strict: throws with the summary, names everything, and copies nothing.
  try {
    load_state_dict(dst, path);
    FAIL("strict load did not throw");
  } catch (const StateDictError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains(path) && Contains("2 missing: encoder.0.bias, scale") &&
                        Contains("2 unexpected: encoder.1.weight, lm_head.weight") &&
                        Contains("encoder.2.weight: expected [4, 5], got [6, 5]") &&
                        Contains("head.weight: expected [2, 4], got [2, 6]"));
    CHECK(e.report().loaded.empty());
    CHECK(e.report().missing.size() == 2);
  }
  const auto after_strict = named_tensors_of(dst);
  for (size_t i = 0; i < before.size(); ++i) CHECK(same_bits(before[i].second, after_strict[i].second));

  // non-strict: the exact lists, and the rest loaded.
  LoadReport r = load_state_dict(dst, path, /*strict=*/false);
  CHECK_FALSE(r.ok());
  CHECK(r.missing == std::vector<std::string>{"encoder.0.bias", "scale"});
  CHECK(r.unexpected == std::vector<std::string>{"encoder.1.weight", "lm_head.weight"});
  CHECK(r.shape_mismatched == std::vector<std::string>{"encoder.2.bias: expected [4], got [6]",
                                                       "encoder.2.weight: expected [4, 5], got [6, 5]",
                                                       "head.weight: expected [2, 4], got [2, 6]"});
  CHECK(r.loaded == std::vector<std::string>{"encoder.0.weight", "head.bias"});
  CHECK(same_bits(dst.encoder->ptr<torch::nn::LinearImpl>(0)->weight.detach(),
                  src.encoder->ptr<torch::nn::LinearImpl>(0)->weight.detach()));
  CHECK(same_bits(dst.head->bias.detach(), src.head->bias.detach()));
  CHECK_THAT(r.summary(), Contains(path) && Contains("loaded 2 of 7 tensors"));
}

TEST_CASE("LeRobot's model. prefix is stripped when it explains the file", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "lerobot.safetensors";
  torch::manual_seed(3);
  TinyNet src;
  std::vector<std::pair<std::string, torch::Tensor>> prefixed;
  for (auto& [name, t] : named_tensors_of(src)) prefixed.emplace_back("model." + name, t);
  prefixed.emplace_back("normalize_inputs.mean", torch::zeros({3}));  // LeRobot keeps other keys beside `model.`
  write_safetensors(path, prefixed);

  TinyNet dst;
  LoadReport r = load_state_dict(dst, path, /*strict=*/false);
  CHECK(r.stripped_prefix == "model.");
  CHECK(r.loaded == kTinyNetNames);
  CHECK(r.missing.empty());
  CHECK(r.unexpected == std::vector<std::string>{"normalize_inputs.mean"});
  CHECK(same_bits(dst.head->weight.detach(), src.head->weight.detach()));
  CHECK_THAT(r.summary(), Contains("prefix 'model.'"));

  // Fully prefixed: a strict load succeeds.
  prefixed.pop_back();
  write_safetensors(path, prefixed);
  TinyNet dst2;
  CHECK(load_state_dict(dst2, path).ok());

  // A module whose own top level is `model` keeps the prefix.
  struct Wrapper : torch::nn::Module {
    std::shared_ptr<TinyNet> model;
    Wrapper() { model = register_module("model", std::make_shared<TinyNet>()); }
  } wrapper;
  LoadReport w = load_state_dict(wrapper, path);
  CHECK(w.stripped_prefix.empty());
  CHECK(w.loaded.size() == kTinyNetNames.size());
}

TEST_CASE("A corrupt file fails load_state_dict with the file's error, leaving the module untouched", "[safetensors]") {
  TempDir tmp;
  const std::string path = tmp / "corrupt.safetensors";
  TinyNet net;
  save_state_dict(net, path);
  truncate_by(path, 4);
  TinyNet dst;
  auto msg = error_of([&] { load_state_dict(dst, path, /*strict=*/false); });
  CHECK_THAT(msg, Contains(path) && Contains("out of range"));
}

TEST_CASE("A FIFO is refused at once, and a write that fails half way leaves neither the file nor a temporary one",
          "[safetensors]") {
  TempDir tmp;
  const std::string fifo = tmp / "fifo.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THAT(open_error(fifo), Contains(fifo) && Contains("not a regular file"));  // no writer: used to block
  ::unlink(fifo.c_str());

  const std::string path = tmp / "w.safetensors";
  {
    vlatune::test::FileSizeLimit limit(4096);  // as a full disk: every write past 4 KiB fails
    try {
      write_safetensors(path, {{"w", torch::ones({4096})}});
      FAIL("the write did not fail");
    } catch (const vlatune::formats::WriteError& e) {
      CHECK_THAT(std::string(e.what()), Contains(path) && Contains("File too large"));
    }
  }
  CHECK(tmp.names().empty());
}
