#include "serve/msgpack_numpy.h"

#include <msgpack.hpp>

#include <cstring>
#include <limits>

namespace vlatune::serve {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* type_name(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL:
      return "nil";
    case msgpack::type::BOOLEAN:
      return "a boolean";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER:
      return "an integer";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return "a float";
    case msgpack::type::STR:
      return "a string";
    case msgpack::type::BIN:
      return "bytes";
    case msgpack::type::ARRAY:
      return "a list";
    case msgpack::type::MAP:
      return "a map";
    default:
      return "an extension value";
  }
}

bool is_text(const msgpack::object& o) {
  return o.type == msgpack::type::STR || o.type == msgpack::type::BIN;
}

std::string text_of(const msgpack::object& o) {
  if (o.type == msgpack::type::STR) return std::string(o.via.str.ptr, o.via.str.size);
  return std::string(o.via.bin.ptr, o.via.bin.size);
}

bool is_number(const msgpack::object& o) {
  return o.type == msgpack::type::POSITIVE_INTEGER || o.type == msgpack::type::NEGATIVE_INTEGER ||
         o.type == msgpack::type::FLOAT32 || o.type == msgpack::type::FLOAT64;
}

double number_of(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::POSITIVE_INTEGER:
      return static_cast<double>(o.via.u64);
    case msgpack::type::NEGATIVE_INTEGER:
      return static_cast<double>(o.via.i64);
    default:
      return o.via.f64;
  }
}

// The member of a map whose key (str or bin, as Python packs str and bytes) is `name`; null when absent.
const msgpack::object* member(const msgpack::object& map, const char* name) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (is_text(kv.key) && text_of(kv.key) == name) return &kv.val;
  }
  return nullptr;
}

WireValue decode_array(const std::string& key, const msgpack::object& map) {
  auto fail = [&](const std::string& why) -> WireError { return WireError("'" + key + "': " + why); };
  const msgpack::object* data = member(map, "data");
  const msgpack::object* dtype = member(map, "dtype");
  const msgpack::object* shape = member(map, "shape");
  if (data == nullptr || dtype == nullptr || shape == nullptr)
    throw fail("a numpy array needs \"data\", \"dtype\" and \"shape\" (openpi-client's msgpack_numpy layout)");
  if (!is_text(*dtype)) throw fail(std::string("the array's dtype must be a string, got ") + type_name(*dtype));
  if (data->type != msgpack::type::BIN)
    throw fail(std::string("the array's data must be bytes, got ") + type_name(*data));
  if (shape->type != msgpack::type::ARRAY)
    throw fail(std::string("the array's shape must be a list, got ") + type_name(*shape));
  WireValue v;
  v.kind = WireValue::Kind::kArray;
  v.array.dtype = text_of(*dtype);
  int64_t item = 0;
  try {
    item = dtype_item_bytes(v.array.dtype);
  } catch (const WireError& e) {
    throw fail(e.what());
  }
  if (shape->via.array.size > 32) throw fail("the array has more than 32 dimensions");
  int64_t numel = 1;
  for (uint32_t i = 0; i < shape->via.array.size; ++i) {
    const msgpack::object& d = shape->via.array.ptr[i];
    if (d.type != msgpack::type::POSITIVE_INTEGER || d.via.u64 > (uint64_t{1} << 40))
      throw fail("the array's shape must hold non-negative integers");
    v.array.shape.push_back(static_cast<int64_t>(d.via.u64));
    numel *= v.array.shape.back();
    if (numel > (int64_t{1} << 40)) throw fail("the array's shape is too large");
  }
  if (static_cast<int64_t>(data->via.bin.size) != numel * item)
    throw fail("the array's data holds " + std::to_string(data->via.bin.size) + " bytes, its dtype " + v.array.dtype +
               " and shape " + shape_text(v.array.shape) + " need " + std::to_string(numel * item));
  v.array.data.assign(data->via.bin.ptr, data->via.bin.size);
  return v;
}

WireValue decode_value(const std::string& key, const msgpack::object& o) {
  WireValue v;
  if (o.type == msgpack::type::MAP) {
    if (member(o, "__ndarray__") != nullptr) return decode_array(key, o);
    if (member(o, "__npgeneric__") != nullptr) {
      const msgpack::object* data = member(o, "data");
      if (data == nullptr || !(is_number(*data) || data->type == msgpack::type::BOOLEAN))
        throw WireError("'" + key + "': a numpy scalar needs a numeric \"data\"");
      if (data->type == msgpack::type::BOOLEAN) {
        v.kind = WireValue::Kind::kBool;
        v.flag = data->via.boolean;
      } else {
        v.kind = WireValue::Kind::kNumber;
        v.number = number_of(*data);
      }
      return v;
    }
    v.kind = WireValue::Kind::kOther;
    v.other = "a map";
    return v;
  }
  if (is_text(o)) {
    v.kind = WireValue::Kind::kString;
    v.text = text_of(o);
  } else if (is_number(o)) {
    v.kind = WireValue::Kind::kNumber;
    v.number = number_of(o);
  } else if (o.type == msgpack::type::BOOLEAN) {
    v.kind = WireValue::Kind::kBool;
    v.flag = o.via.boolean;
  } else if (o.type == msgpack::type::NIL) {
    v.kind = WireValue::Kind::kNil;
  } else {
    v.kind = WireValue::Kind::kOther;
    v.other = o.type == msgpack::type::ARRAY ? "a list of " + std::to_string(o.via.array.size) : type_name(o);
  }
  return v;
}

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_json(Packer& pk, const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object:
      pk.pack_map(static_cast<uint32_t>(j.size()));
      for (const auto& item : j.items()) {
        pk.pack(item.key());
        pack_json(pk, item.value());
      }
      break;
    case nlohmann::json::value_t::array:
      pk.pack_array(static_cast<uint32_t>(j.size()));
      for (const auto& e : j) pack_json(pk, e);
      break;
    case nlohmann::json::value_t::string:
      pk.pack(j.get<std::string>());
      break;
    case nlohmann::json::value_t::boolean:
      pk.pack(j.get<bool>());
      break;
    case nlohmann::json::value_t::number_integer:
      pk.pack(j.get<int64_t>());
      break;
    case nlohmann::json::value_t::number_unsigned:
      pk.pack(j.get<uint64_t>());
      break;
    case nlohmann::json::value_t::number_float:
      pk.pack_double(j.get<double>());
      break;
    default:
      pk.pack_nil();
  }
}

void pack_bin_key(Packer& pk, const char* name) {
  const auto n = static_cast<uint32_t>(std::strlen(name));
  pk.pack_bin(n);
  pk.pack_bin_body(name, n);
}

}  // namespace

int64_t NdArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string NdArray::describe() const {
  char kind = 0;
  int64_t bytes = 0;
  try {
    bytes = dtype_item_bytes(dtype, &kind);
  } catch (const WireError&) {
    return dtype + " " + shape_text(shape);
  }
  const std::string name = kind == 'b'   ? "bool"
                           : kind == 'u' ? "uint" + std::to_string(8 * bytes)
                           : kind == 'i' ? "int" + std::to_string(8 * bytes)
                                         : "float" + std::to_string(8 * bytes);
  return name + " " + shape_text(shape);
}

std::string WireValue::describe() const {
  switch (kind) {
    case Kind::kArray: {
      const std::string what = array.describe();
      return (what.rfind("int", 0) == 0 ? "an " : "a ") + what + " array";
    }
    case Kind::kString:
      return "a string";
    case Kind::kNumber:
      return "a number";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNil:
      return "None";
    case Kind::kOther:
      return other;
  }
  return other;
}

int64_t dtype_item_bytes(const std::string& dtype, char* kind) {
  auto fail = [&](const std::string& why) -> WireError {
    return WireError("unsupported dtype '" + dtype + "' (" + why + ")");
  };
  if (dtype.size() < 3) throw fail("expected numpy's dtype.str, e.g. '|u1' or '<f4'");
  const char order = dtype[0], k = dtype[1];
  if (order == '>') throw fail("big-endian");
  if (order != '<' && order != '|' && order != '=') throw fail("expected numpy's dtype.str, e.g. '|u1' or '<f4'");
  int64_t bytes = 0;
  for (size_t i = 2; i < dtype.size(); ++i) {
    if (dtype[i] < '0' || dtype[i] > '9') throw fail("expected numpy's dtype.str, e.g. '|u1' or '<f4'");
    bytes = bytes * 10 + (dtype[i] - '0');
    if (bytes > 16) throw fail("element size");
  }
  const bool ok = (k == 'b' && bytes == 1) ||
                  ((k == 'u' || k == 'i') && (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)) ||
                  (k == 'f' && (bytes == 4 || bytes == 8));
  if (!ok) throw fail("bool, integer, float32 and float64 arrays are supported");
  if (kind != nullptr) *kind = k;
  return bytes;
}

std::map<std::string, WireValue> decode_message(const char* data, size_t size, const WireLimits& limits) {
  msgpack::object_handle oh;
  std::size_t offset = 0;
  const msgpack::unpack_limit limit(/*array=*/static_cast<std::size_t>(limits.max_keys),
                                    /*map=*/static_cast<std::size_t>(limits.max_keys),
                                    /*str=*/static_cast<std::size_t>(limits.max_string_bytes),
                                    /*bin=*/static_cast<std::size_t>(limits.max_binary_bytes), /*ext=*/0,
                                    /*depth=*/8);
  try {
    msgpack::unpack(oh, data, size, offset, nullptr, nullptr, limit);
  } catch (const msgpack::insufficient_bytes&) {
    throw WireError("the message is not a complete msgpack value (truncated)");
  } catch (const std::exception& e) {
    throw WireError(std::string("the message is not valid msgpack (") + e.what() +
                    "; send a dict packed with openpi_client.msgpack_numpy)");
  }
  if (offset != size)
    throw WireError("the message has " + std::to_string(size - offset) + " bytes after its msgpack value");
  const msgpack::object& root = oh.get();
  if (root.type != msgpack::type::MAP)
    throw WireError(std::string("the message must be a msgpack map (a dict of observation keys), got ") +
                    type_name(root));
  std::map<std::string, WireValue> out;
  for (uint32_t i = 0; i < root.via.map.size; ++i) {
    const msgpack::object_kv& kv = root.via.map.ptr[i];
    if (!is_text(kv.key)) throw WireError(std::string("observation keys must be strings, got ") + type_name(kv.key));
    const std::string key = text_of(kv.key);
    if (out.count(key) != 0) throw WireError("'" + key + "': the key appears twice");
    out.emplace(key, decode_value(key, kv.val));
  }
  return out;
}

std::string encode_message(const nlohmann::json& fields, const std::map<std::string, NdArray>& arrays) {
  if (!fields.is_object()) throw std::invalid_argument("encode_message: the fields must be a JSON object");
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  pk.pack_map(static_cast<uint32_t>(fields.size() + arrays.size()));
  for (const auto& item : fields.items()) {
    if (arrays.count(item.key()) != 0) throw std::invalid_argument("encode_message: key '" + item.key() + "' twice");
    pk.pack(item.key());
    pack_json(pk, item.value());
  }
  for (const auto& [key, a] : arrays) {
    pk.pack(key);
    pk.pack_map(4);
    pack_bin_key(pk, "__ndarray__");
    pk.pack(true);
    pack_bin_key(pk, "data");
    pk.pack_bin(static_cast<uint32_t>(a.data.size()));
    pk.pack_bin_body(a.data.data(), static_cast<uint32_t>(a.data.size()));
    pack_bin_key(pk, "dtype");
    pk.pack(a.dtype);
    pack_bin_key(pk, "shape");
    pk.pack_array(static_cast<uint32_t>(a.shape.size()));
    for (int64_t d : a.shape) pk.pack(d);
  }
  return std::string(buffer.data(), buffer.size());
}

NdArray float32_array(const float* values, int64_t rows, int64_t cols) {
  NdArray a;
  a.dtype = "<f4";
  a.shape = {rows, cols};
  a.data.assign(reinterpret_cast<const char*>(values), static_cast<size_t>(rows * cols) * sizeof(float));
  return a;
}

}  // namespace vlatune::serve
