/// @file detail/printable.hpp
/// Text that came from another process, made safe to print: control characters escaped, the
/// length bounded.
#pragma once

#include "../config.hpp"

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// `text` with every control character (below 0x20, and 0x7f) written as "\xNN", cut to at most
/// `max` characters with "..." at the end when longer. A peer's words are data: printed this way
/// they cannot move a terminal's cursor, clear its screen or forge a line of output.
inline std::string printable(std::string_view text, std::size_t max) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() < max ? text.size() : max);
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    const std::size_t need = (u < 0x20 || u == 0x7f) ? 4 : 1;
    if (out.size() + need > max) {
      out.resize(out.size() > max - 3 && max >= 3 ? max - 3 : out.size());
      out += "...";
      return out;
    }
    if (need == 4) {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 0xf];
    } else {
      out += ch;
    }
  }
  return out;
}

/// Whether `text` holds a control character (below 0x20, or 0x7f). A field of a peer's message
/// that names something (a device) or was written by our own code (a problem) has none: a message
/// with one is refused, so what is accepted prints as it came and round-trips.
inline bool has_control(std::string_view text) {
  for (const char ch : text)
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) == 0x7f) return true;
  return false;
}

/// printable() of bytes.
inline std::string printable(std::span<const std::byte> bytes, std::size_t max) {
  return printable(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), max);
}

} // namespace detail
TBVERBS_NAMESPACE_END
