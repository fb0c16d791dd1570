// Byte sizes as the examples and tools take them on the command line: "64M", "4K", "1G", "123"
// (bytes), K/M/G 1024-based, an optional trailing B. One parser for ring_all_sum, pingpong,
// devices and tbverbs-probe (issue 13: `pingpong --size 64K` was refused while the ring took 64M).
// Pure, so fuzz/fuzz_ring_config.cpp can feed it anything.
#pragma once

#include <tbverbs/sizes.hpp>

#include <cstddef>
#include <optional>
#include <string>

namespace cli {

/// Largest size accepted unless a caller gives its own bound: far above any real buffer, far below
/// what overflows a size_t or the allocator (issue 9: a wrapped size crashed).
constexpr std::size_t kMaxSizeArg = std::size_t{1} << 40;

/// "64M", "4K", "1G", "4KB", "123" -> bytes; nullopt for anything else or above `max`. The
/// library's own parser (tbverbs/detail/decimal.hpp), which TBVERBS_MAX_MESSAGE goes through too.
inline std::optional<std::size_t> parse_size(const std::string& s, std::size_t max = kMaxSizeArg) {
  const auto v = tbverbs::parse_size(s, max);
  if (!v) return std::nullopt;
  return static_cast<std::size_t>(*v);
}

/// How a size is written, for help texts and error messages.
constexpr const char* kSizeSyntax = "a size like 4096, 64K, 16M or 1G (K, M and G are 1024-based)";

} // namespace cli
