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
/// includes an endpoint or side-channel header about 0.05 s (issue 8, finding 14).
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


/// Appends big-endian fields to a byte vector: the one writer of tbverbs' wire forms, paired with
/// WireReader. A message that carries its own magic, version and CRC writes them with these too.
class WireWriter {
public:
  /// Appends `v` in `sizeof(T)` big-endian bytes.
  template <class T> WireWriter& put(T v) {
    const std::size_t at = out_.size();
    out_.resize(at + sizeof(T));
    put_be<T>(out_.data() + at, v);
    return *this;
  }
  /// Appends raw bytes.
  WireWriter& bytes(std::span<const std::byte> b) {
    out_.insert(out_.end(), b.begin(), b.end());
    return *this;
  }
  /// Appends a string as a 16-bit length and its bytes (at most 65535 of them; longer is cut).
  WireWriter& str(std::string_view s) {
    const std::size_t n = s.size() < 65535 ? s.size() : 65535;
    put<std::uint16_t>(static_cast<std::uint16_t>(n));
    bytes(std::as_bytes(std::span(s.data(), n)));
    return *this;
  }
  /// Appends the CRC-32 of everything written so far (a trailer WireReader::check_crc verifies).
  WireWriter& crc() { return put<std::uint32_t>(crc32(out_)); }
  /// The bytes written so far.
  const std::vector<std::byte>& data() const noexcept { return out_; }
  /// Takes the bytes.
  std::vector<std::byte> take() noexcept { return std::move(out_); }

private:
  std::vector<std::byte> out_;
};

/// Reads big-endian fields from a byte span, bounds-checked: a read past the end yields zero and
/// clears ok(), so a parser checks once at the end instead of at every field. Never reads outside
/// the span.
class WireReader {
public:
  /// Reads from `in`.
  explicit WireReader(std::span<const std::byte> in) noexcept : in_(in) {}
  /// True while every read so far was inside the span.
  bool ok() const noexcept { return ok_; }
  /// Bytes not read yet.
  std::size_t remaining() const noexcept { return in_.size() - at_; }
  /// Reads a `sizeof(T)`-byte big-endian value (0 past the end).
  template <class T> T get() noexcept {
    if (!ok_ || remaining() < sizeof(T)) {
      ok_ = false;
      return T{};
    }
    const T v = get_be<T>(in_.data() + at_);
    at_ += sizeof(T);
    return v;
  }
  /// The next `n` bytes (empty past the end).
  std::span<const std::byte> bytes(std::size_t n) noexcept {
    if (!ok_ || remaining() < n) {
      ok_ = false;
      return {};
    }
    const auto b = in_.subspan(at_, n);
    at_ += n;
    return b;
  }
  /// A string written by WireWriter::str.
  std::string str() {
    const auto n = get<std::uint16_t>();
    const auto b = bytes(n);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  /// Reads the CRC-32 trailer WireWriter::crc wrote and checks it against every byte before it;
  /// false (and !ok()) when it does not match or is missing.
  bool check_crc() noexcept {
    const std::size_t covered = at_;
    const auto want = get<std::uint32_t>();
    if (!ok_ || crc32(in_.first(covered)) != want) ok_ = false;
    return ok_;
  }

private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  bool ok_ = true;
};

} // namespace detail
TBVERBS_NAMESPACE_END
