// openpi's wire format (openpi-client's msgpack_numpy.py), through msgpack-cxx: a message is one msgpack map; a
// numpy array travels as the map {b"__ndarray__": True, b"data": <bin, the raw bytes>, b"dtype": "<f4",
// b"shape": [..]} (bin keys, as Python's msgpack packs bytes), a numpy scalar as {b"__npgeneric__": True,
// b"data": <value>, b"dtype": "<f4"}. Torch-free; every decoding problem is a WireError naming the key.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlatune::serve {

class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A numpy array: element type from its dtype string, C-order bytes.
struct NdArray {
  std::string dtype;  // numpy's dtype.str: "|u1", "<f4", "<f8", "<i8", "|b1", ...
  std::vector<int64_t> shape;
  std::string data;  // numel * item_bytes bytes, little-endian
  int64_t numel() const;
  // "uint8 [224, 224, 3]".
  std::string describe() const;
};

// One top-level value of an observation.
struct WireValue {
  enum class Kind { kArray, kString, kNumber, kBool, kNil, kOther };
  Kind kind = Kind::kNil;
  NdArray array;      // kArray (numpy scalars: shape [])
  std::string text;   // kString (msgpack str or bin)
  double number = 0;  // kNumber
  bool flag = false;  // kBool
  std::string other;  // kOther: what it was ("a map", "a list of 3")
  // "a uint8 array [224, 224, 3]", "a string", "a number", ...
  std::string describe() const;
};

// Limits of one decode (a message the client controls): nesting, entries, string and binary sizes.
struct WireLimits {
  int64_t max_keys = 256;
  int64_t max_string_bytes = 1 << 20;
  int64_t max_binary_bytes = int64_t{1} << 30;
};

// Decodes one message: a msgpack map with string keys -> its top-level values. Throws WireError for a message that
// is not msgpack, has trailing bytes, is not a map, has a non-string key, or a malformed numpy array (unknown or
// big-endian dtype, data size not matching the shape).
std::map<std::string, WireValue> decode_message(const char* data, size_t size, const WireLimits& limits = {});

// Element size in bytes of a numpy dtype string and its kind letter ('u', 'i', 'f', 'b'); WireError when the
// dtype is not a little-endian (or byte-order-free) bool, integer or float type.
int64_t dtype_item_bytes(const std::string& dtype, char* kind = nullptr);

// Encodes a message: a map of `fields` (JSON values as msgpack: objects as maps with string keys, arrays, strings,
// numbers, booleans, null) plus `arrays` as numpy arrays under their keys. Keys must differ.
std::string encode_message(const nlohmann::json& fields, const std::map<std::string, NdArray>& arrays = {});

// A float32 array [rows, cols] for encode_message.
NdArray float32_array(const float* values, int64_t rows, int64_t cols);

}  // namespace vlatune::serve
