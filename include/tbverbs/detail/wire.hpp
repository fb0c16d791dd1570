/// @file wire.hpp
/// Byte-order-explicit encoding helpers and a CRC-32 for tbverbs' wire frames. Big-endian
/// with shifts, so the same bytes come out on every host (no platform byte-order header).
#pragma once

#include "../config.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

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

inline constexpr auto crc32_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}();

/// CRC-32 (IEEE 802.3, reflected) of `bytes`.
constexpr std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
  for (std::byte b : bytes) crc = crc32_table[(crc ^ static_cast<std::uint8_t>(b)) & 0xff] ^ (crc >> 8);
  return ~crc;
}

} // namespace detail
TBVERBS_NAMESPACE_END
