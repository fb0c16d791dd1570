/// @file detail/json.hpp
/// A small strict JSON reader (RFC 8259) for the files an operator gives the collectives layer
/// (JACCL device files, mlx.distributed_config hostfiles), so the library headers need no JSON
/// dependency. Bounded: at most 64 levels of nesting and the input's own size; every error names
/// the byte offset. Not a general-purpose library: numbers are kept as doubles.
#pragma once

#include "../config.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace detail {
namespace json {

/// One JSON value.
struct Value {
  enum class Kind : std::uint8_t { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool b = false;
  double number = 0;
  std::string text;                                 ///< A string's value.
  std::vector<Value> items;                         ///< An array's elements.
  std::vector<std::string> keys;                    ///< An object's member names, in file order.
  std::vector<Value> values;                        ///< An object's member values (values[k] is keys[k]'s).

  bool is_null() const noexcept { return kind == Kind::null; }
  bool is_string() const noexcept { return kind == Kind::string; }
  bool is_array() const noexcept { return kind == Kind::array; }
  bool is_object() const noexcept { return kind == Kind::object; }
  /// The member `key` of an object (the last one of that name), or nullptr.
  const Value* find(std::string_view key) const noexcept {
    const Value* found = nullptr;
    for (std::size_t k = 0; k < keys.size() && k < values.size(); ++k)
      if (keys[k] == key) found = &values[k];
    return found;
  }
};

/// Parses `text` as one JSON value. Returns nullopt and sets `error` ("offset N: ...") when it is
/// not valid JSON.
inline std::optional<Value> parse(std::string_view text, std::string& error);

namespace impl {
struct Parser {
  std::string_view s;
  std::size_t i = 0;
  std::string& error;
  static constexpr int max_depth = 64;

  bool fail(const char* what) {
    if (error.empty()) error = "offset " + std::to_string(i) + ": " + what;
    return false;
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool literal(std::string_view word) {
    if (s.substr(i, word.size()) != word) return fail("invalid literal");
    i += word.size();
    return true;
  }
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool hex4(std::uint32_t& out) {
    if (s.size() - i < 4) return fail("truncated \\u escape");
    out = 0;
    for (int k = 0; k < 4; ++k) {
      const int h = hex(s[i + static_cast<std::size_t>(k)]);
      if (h < 0) return fail("invalid \\u escape");
      out = out * 16 + static_cast<std::uint32_t>(h);
    }
    i += 4;
    return true;
  }
  static void utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool string(std::string& out) {
    ++i; // the opening quote
    for (;;) {
      if (i >= s.size()) return fail("unterminated string");
      const char c = s[i++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) return fail("unterminated escape");
      const char e = s[i++];
      switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        std::uint32_t cp = 0;
        if (!hex4(cp)) return false;
        if (cp >= 0xD800 && cp <= 0xDBFF) { // a surrogate pair
          std::uint32_t lo = 0;
          if (s.substr(i, 2) != "\\u") return fail("unpaired surrogate");
          i += 2;
          if (!hex4(lo)) return false;
          if (lo < 0xDC00 || lo > 0xDFFF) return fail("unpaired surrogate");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return fail("unpaired surrogate");
        }
        utf8(out, cp);
        break;
      }
      default: return fail("invalid escape");
      }
    }
  }
  bool number(double& out) {
    const std::size_t start = i;
    if (i < s.size() && s[i] == '-') ++i;
    if (i >= s.size()) return fail("truncated number");
    if (s[i] == '0') {
      ++i;
    } else if (s[i] >= '1' && s[i] <= '9') {
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    } else {
      return fail("invalid number");
    }
    if (i < s.size() && s[i] == '.') {
      ++i;
      if (i >= s.size() || s[i] < '0' || s[i] > '9') return fail("invalid fraction");
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      ++i;
      if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
      if (i >= s.size() || s[i] < '0' || s[i] > '9') return fail("invalid exponent");
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    }
    // The value: digits and exponent by hand (no locale, no strtod on an unterminated view).
    const std::string_view t = s.substr(start, i - start);
    double v = 0, scale = 1;
    std::size_t k = t[0] == '-' ? 1 : 0;
    for (; k < t.size() && t[k] >= '0' && t[k] <= '9'; ++k) v = v * 10 + (t[k] - '0');
    if (k < t.size() && t[k] == '.')
      for (++k; k < t.size() && t[k] >= '0' && t[k] <= '9'; ++k) v += (t[k] - '0') * (scale /= 10);
    if (k < t.size()) { // exponent
      ++k;
      const bool neg = t[k] == '-';
      if (t[k] == '+' || t[k] == '-') ++k;
      int e = 0;
      for (; k < t.size(); ++k) e = e < 10000 ? e * 10 + (t[k] - '0') : e;
      for (int j = 0; j < e && v != 0 && v < 1e308 && v > 1e-308; ++j) v = neg ? v / 10 : v * 10;
    }
    out = t[0] == '-' ? -v : v;
    return true;
  }
  bool value(Value& v, int depth) {
    if (depth > max_depth) return fail("nested too deeply");
    ws();
    if (i >= s.size()) return fail("unexpected end");
    const char c = s[i];
    if (c == 'n') return literal("null");
    if (c == 't') {
      v.kind = Value::Kind::boolean;
      v.b = true;
      return literal("true");
    }
    if (c == 'f') {
      v.kind = Value::Kind::boolean;
      return literal("false");
    }
    if (c == '"') {
      v.kind = Value::Kind::string;
      return string(v.text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Value::Kind::number;
      return number(v.number);
    }
    if (c == '[') {
      v.kind = Value::Kind::array;
      ++i;
      ws();
      if (i < s.size() && s[i] == ']') {
        ++i;
        return true;
      }
      for (;;) {
        v.items.emplace_back();
        if (!value(v.items.back(), depth + 1)) return false;
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == ']') {
          ++i;
          return true;
        }
        return fail("expected ',' or ']'");
      }
    }
    if (c == '{') {
      v.kind = Value::Kind::object;
      ++i;
      ws();
      if (i < s.size() && s[i] == '}') {
        ++i;
        return true;
      }
      for (;;) {
        ws();
        if (i >= s.size() || s[i] != '"') return fail("expected a member name");
        std::string key;
        if (!string(key)) return false;
        ws();
        if (i >= s.size() || s[i] != ':') return fail("expected ':'");
        ++i;
        v.keys.push_back(std::move(key));
        v.values.emplace_back();
        if (!value(v.values.back(), depth + 1)) return false;
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == '}') {
          ++i;
          return true;
        }
        return fail("expected ',' or '}'");
      }
    }
    return fail("unexpected character");
  }
};
} // namespace impl

inline std::optional<Value> parse(std::string_view text, std::string& error) {
  error.clear();
  impl::Parser p{text, 0, error};
  Value v;
  if (!p.value(v, 0)) return std::nullopt;
  p.ws();
  if (p.i != text.size()) {
    p.fail("trailing characters after the value");
    return std::nullopt;
  }
  return v;
}

} // namespace json
} // namespace detail
TBVERBS_NAMESPACE_END
