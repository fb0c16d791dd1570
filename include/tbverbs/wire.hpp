/// @file wire.hpp
/// `WireWriter` and `WireReader`: the one writer and reader of tbverbs' wire forms (endpoints,
/// side-channel messages, topology and memory advertisements): big-endian fields, bounds-checked
/// reads, and a CRC-32 trailer. Public so that a backend's own messages over the side channel are
/// written the same way (no hand-rolled byte shifts).
#pragma once

#include "detail/wire.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// Appends big-endian fields to a byte vector: the one writer of tbverbs' wire forms, paired with
/// WireReader. A message that carries its own magic, version and CRC writes them with these too.
class WireWriter {
public:
  /// Appends `v` in `sizeof(T)` big-endian bytes.
  template <class T> WireWriter& put(T v) {
    // Encoded on the stack, then appended: growing the vector with resize() made GCC 12 at -O3
    // warn of a memset out of bounds (a false -Warray-bounds, fatal under -Werror).
    std::byte field[sizeof(T)];
    detail::put_be<T>(field, v);
    out_.insert(out_.end(), field, field + sizeof(T));
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
  WireWriter& crc() { return put<std::uint32_t>(detail::crc32(out_)); }
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
    const T v = detail::get_be<T>(in_.data() + at_);
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
    if (!ok_ || detail::crc32(in_.first(covered)) != want) ok_ = false;
    return ok_;
  }

private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  bool ok_ = true;
};


TBVERBS_NAMESPACE_END
