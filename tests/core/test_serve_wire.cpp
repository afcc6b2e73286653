// openpi's wire format (serve/msgpack_numpy.h): bytes packed by openpi-client's msgpack_numpy decode to the
// arrays and values they hold; replies round-trip; malformed messages are refused with a message naming the key.
#ifdef VLATUNE_HAVE_SERVE
#include <catch2/catch.hpp>

#include <msgpack.hpp>

#include <cstring>
#include <string>

#include "serve/msgpack_numpy.h"

using namespace vlatune::serve;

namespace {

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// openpi_client.msgpack_numpy.packb({"img": np.arange(12, dtype=np.uint8).reshape(2, 2, 3), "prompt": "hi",
// "s": np.float32(1.5), "state": np.array([0.5, -2.0])}) with openpi-client 0.1.2 (msgpack 1.2.4, numpy 1.26).
const char* kPythonMessage =
    "84a3696d6784c40b5f5f6e6461727261795f5fc3c40464617461c40c000102030405060708090a0bc4056474797065a37c7531c4057368"
    "61706593020203a670726f6d7074a26869a17383c40d5f5f6e7067656e657269635f5fc3c40464617461cb3ff8000000000000c40564"
    "74797065a33c6634a5737461746584c40b5f5f6e6461727261795f5fc3c40464617461c410000000000000e03f00000000000000c0c405"
    "6474797065a33c6638c40573686170659102";

std::string error_of(const std::string& bytes) {
  try {
    decode_message(bytes.data(), bytes.size());
  } catch (const WireError& e) {
    return e.what();
  }
  FAIL("accepted");
  return "";
}

// One-key message {"k": value} where `write` packs the value.
template <typename F>
std::string one_key(F write) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> pk(b);
  pk.pack_map(1);
  pk.pack(std::string("k"));
  write(pk);
  return std::string(b.data(), b.size());
}

void pack_bin(msgpack::packer<msgpack::sbuffer>& pk, const std::string& s) {
  pk.pack_bin(static_cast<uint32_t>(s.size()));
  pk.pack_bin_body(s.data(), static_cast<uint32_t>(s.size()));
}

// {"k": <ndarray with this dtype, shape and data>} as msgpack_numpy packs it.
std::string array_message(const std::string& dtype, std::vector<int64_t> shape, const std::string& data) {
  return one_key([&](auto& pk) {
    pk.pack_map(4);
    pack_bin(pk, "__ndarray__");
    pk.pack(true);
    pack_bin(pk, "data");
    pack_bin(pk, data);
    pack_bin(pk, "dtype");
    pk.pack(dtype);
    pack_bin(pk, "shape");
    pk.pack(shape);
  });
}

}  // namespace

TEST_CASE("An observation packed by openpi-client's msgpack_numpy decodes to its arrays and values", "[serve]") {
  const std::string bytes = from_hex(kPythonMessage);
  REQUIRE(bytes.size() == 182);
  const auto obs = decode_message(bytes.data(), bytes.size());
  REQUIRE(obs.size() == 4);
  const WireValue& img = obs.at("img");
  REQUIRE(img.kind == WireValue::Kind::kArray);
  CHECK(img.array.dtype == "|u1");
  CHECK(img.array.shape == std::vector<int64_t>{2, 2, 3});
  CHECK(img.describe() == "a uint8 [2, 2, 3] array");
  for (int i = 0; i < 12; ++i) CHECK(static_cast<uint8_t>(img.array.data[static_cast<size_t>(i)]) == i);
  CHECK(obs.at("prompt").kind == WireValue::Kind::kString);
  CHECK(obs.at("prompt").text == "hi");
  CHECK(obs.at("s").kind == WireValue::Kind::kNumber);  // a numpy scalar
  CHECK(obs.at("s").number == 1.5);
  const WireValue& state = obs.at("state");
  CHECK(state.array.dtype == "<f8");
  double values[2];
  std::memcpy(values, state.array.data.data(), 16);
  CHECK(values[0] == 0.5);
  CHECK(values[1] == -2.0);
}

TEST_CASE("A reply encodes its fields and float32 arrays as msgpack_numpy expects, and decodes back", "[serve]") {
  const float actions[6] = {1, 2, 3, 4, 5, 6.5f};
  const nlohmann::json fields = {{"policy_timing", {{"infer_ms", 12.5}}}, {"n", 3}, {"ok", true}, {"name", "x"}};
  const std::string bytes = encode_message(fields, {{"actions", float32_array(actions, 2, 3)}});
  // The array's inner keys are bytes (bin), as Python packs b"__ndarray__" (unpack_array looks them up as bytes).
  const auto handle = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& root = handle.get();
  bool found = false;
  for (uint32_t i = 0; i < root.via.map.size; ++i) {
    const auto& kv = root.via.map.ptr[i];
    if (std::string(kv.key.via.str.ptr, kv.key.via.str.size) != "actions") continue;
    found = true;
    for (uint32_t j = 0; j < kv.val.via.map.size; ++j) CHECK(kv.val.via.map.ptr[j].key.type == msgpack::type::BIN);
  }
  CHECK(found);
  const auto back = decode_message(bytes.data(), bytes.size());
  CHECK(back.at("actions").array.describe() == "float32 [2, 3]");
  CHECK(back.at("actions").array.data == std::string(reinterpret_cast<const char*>(actions), sizeof(actions)));
  CHECK(back.at("n").number == 3);
  CHECK(back.at("ok").flag);
  CHECK(back.at("name").text == "x");
  CHECK(back.at("policy_timing").describe() == "a map");
}

TEST_CASE("Malformed messages are refused with what is wrong and which key", "[serve]") {
  CHECK_THAT(error_of(std::string("\xc1", 1)), Catch::Contains("not valid msgpack"));
  const std::string good = from_hex(kPythonMessage);
  CHECK_THAT(error_of(good.substr(0, 40)), Catch::Contains("truncated"));
  CHECK_THAT(error_of(good + "xy"), Catch::Contains("2 bytes after its msgpack value"));
  {
    msgpack::sbuffer b;
    msgpack::pack(b, std::vector<int>{1, 2});
    CHECK_THAT(error_of(std::string(b.data(), b.size())),
               Catch::Contains("must be a msgpack map") && Catch::Contains("got a list"));
  }
  {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(1);
    pk.pack(7);
    pk.pack(1);
    CHECK_THAT(error_of(std::string(b.data(), b.size())), Catch::Contains("keys must be strings, got an integer"));
  }
  CHECK_THAT(error_of(array_message(">f4", {1}, "abcd")), Catch::Contains("'k': unsupported dtype '>f4' (big-endian)"));
  CHECK_THAT(error_of(array_message("|O", {1}, "abcdefgh")), Catch::Contains("'k': unsupported dtype '|O'"));
  CHECK_THAT(error_of(array_message("<f2", {2}, "abcd")), Catch::Contains("float32 and float64 arrays are supported"));
  CHECK_THAT(error_of(array_message("<f4", {2, 3}, "abcd")),
             Catch::Contains("'k': the array's data holds 4 bytes, its dtype <f4 and shape [2, 3] need 24"));
  CHECK_THAT(error_of(one_key([](auto& pk) {
               pk.pack_map(1);
               pack_bin(pk, "__ndarray__");
               pk.pack(true);
             })),
             Catch::Contains("'k': a numpy array needs \"data\", \"dtype\" and \"shape\""));
  CHECK_THAT(error_of(one_key([](auto& pk) {
               pk.pack_map(2);
               pack_bin(pk, "__npgeneric__");
               pk.pack(true);
               pack_bin(pk, "data");
               pk.pack(std::string("x"));
             })),
             Catch::Contains("'k': a numpy scalar needs a numeric \"data\""));
  {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(2);
    pk.pack(std::string("k"));
    pk.pack(1);
    pk.pack(std::string("k"));
    pk.pack(2);
    CHECK_THAT(error_of(std::string(b.data(), b.size())), Catch::Contains("'k': the key appears twice"));
  }
}

TEST_CASE("numpy dtype strings map to element sizes; others are refused", "[serve]") {
  char kind = 0;
  CHECK(dtype_item_bytes("|u1", &kind) == 1);
  CHECK(kind == 'u');
  CHECK(dtype_item_bytes("<i8", &kind) == 8);
  CHECK(kind == 'i');
  CHECK(dtype_item_bytes("<f4") == 4);
  CHECK(dtype_item_bytes("=f8") == 8);
  CHECK(dtype_item_bytes("|b1", &kind) == 1);
  CHECK(kind == 'b');
  for (const char* bad : {"", "f4", "<c8", "<U10", "<u3", "|b2", "<f16", "<M8"}) {
    INFO(bad);
    CHECK_THROWS_AS(dtype_item_bytes(bad), WireError);
  }
}

#endif  // VLATUNE_HAVE_SERVE
