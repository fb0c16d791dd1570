/// @file wire.hpp
/// Byte-order-explicit encoding helpers and a CRC-32 for tbverbs' wire frames. Big-endian
/// with shifts, so the same bytes come out on every host (no platform byte-order header).
#pragma once

#include "../config.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// Writes `v` big-endian into `out[0..N)`.
template <class T> constexpr void put_be(std::byte* out, T v) noexcept {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    out[i] = static_cast<std::byte>(static_cast<std::uint64_t>(v) >> (8 * (sizeof(T) - 1 - i)));
}
/// Reads a big-endian T from `in[0..N)`.
template <class T> constexpr T get_be(const std::byte* in) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v = (v << 8) | static_cast<std::uint8_t>(in[i]);
  return static_cast<T>(v);
}

/// Writes the low `n` bytes of `v` big-endian into `out[0..n)` (for fields whose width is data).
inline void put_be(std::byte* out, std::uint64_t v, int n) noexcept {
  for (int i = n - 1; i >= 0; --i) {
    out[i] = static_cast<std::byte>(v & 0xFFu);
    v >>= 8;
  }
}
/// Reads `n` big-endian bytes from `in`.
inline std::uint64_t get_be(const std::byte* in, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<std::uint64_t>(in[i]);
  return v;
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) lookup tables for slicing-by-8:
/// table[k] advances a byte k positions further than table[0], the classic byte table.
struct Crc32Tables {
  std::uint32_t t[8][256];
};
/// The tables, computed on first use (a few microseconds, once per process). Not constexpr on
/// purpose: evaluating the 2048 entries at compile time cost every translation unit that
/// includes an endpoint or side-channel header about 0.05 s.
inline const Crc32Tables& crc32_tables() noexcept {
  static const Crc32Tables tables = [] {
    Crc32Tables x{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      x.t[0][i] = c;
    }
    for (std::size_t k = 1; k < 8; ++k)
      for (std::size_t i = 0; i < 256; ++i) x.t[k][i] = (x.t[k - 1][i] >> 8) ^ x.t[0][x.t[k - 1][i] & 0xFFu];
    return x;
  }();
  return tables;
}

/// CRC-32 of `bytes`, continuing from `crc` (crc32("123456789") == 0xCBF43926). Eight bytes per
/// step (slicing-by-8, several times faster than a byte at a time: side-channel frames reach
/// 64 MiB). The one CRC of every tbverbs wire form (endpoints, side-channel frames).
inline std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept {
  const auto& t = crc32_tables().t;
  std::uint32_t c = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  auto u = [](std::byte b) { return static_cast<std::uint32_t>(b); };
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = c ^ (u(p[0]) | u(p[1]) << 8 | u(p[2]) << 16 | u(p[3]) << 24);
    const std::uint32_t hi = u(p[4]) | u(p[5]) << 8 | u(p[6]) << 16 | u(p[7]) << 24;
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) c = t[0][(c ^ u(*p)) & 0xFFu] ^ (c >> 8);
  return ~c;
}


} // namespace detail
TBVERBS_NAMESPACE_END
