// Byte sizes as the examples and tools take them on the command line: "64M", "4K", "1G", "123"
// (bytes), K/M/G 1024-based, an optional trailing B. One parser for ring_all_sum, pingpong,
// devices and tbverbs-probe (issue 13: `pingpong --size 64K` was refused while the ring took 64M).
// Pure, so fuzz/fuzz_ring_config.cpp can feed it anything.
#pragma once

#include <cctype>
#include <cstddef>
#include <optional>
#include <string>

namespace cli {

/// Largest size accepted unless a caller gives its own bound: far above any real buffer, far below
/// what overflows a size_t or the allocator (issue 9: a wrapped size crashed).
constexpr std::size_t kMaxSizeArg = std::size_t{1} << 40;

/// "64M", "4K", "1G", "4KB", "123" -> bytes; nullopt for anything else or above `max`.
inline std::optional<std::size_t> parse_size(std::string s, std::size_t max = kMaxSizeArg) {
  if (s.empty() || s.size() > 24) return std::nullopt;
  std::size_t mult = 1;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  if (last == 'B') {
    s.pop_back();
    if (s.empty()) return std::nullopt;
  }
  const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  if (unit == 'K' || unit == 'M' || unit == 'G') {
    mult = unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : std::size_t{1024} * 1024 * 1024;
    s.pop_back();
  }
  if (s.empty() || s.size() > 15 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const unsigned long long v = std::stoull(s); // at most 15 digits: cannot throw
  if (v > max / mult) return std::nullopt;
  return static_cast<std::size_t>(v) * mult;
}

/// How a size is written, for help texts and error messages.
constexpr const char* kSizeSyntax = "a size like 4096, 64K, 16M or 1G (K, M and G are 1024-based)";

} // namespace cli
