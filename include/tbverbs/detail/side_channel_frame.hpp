/// @file side_channel_frame.hpp
/// The side channel's wire frames: a fixed, checksummed, versioned header with the job token,
/// and payload readers and writers. Pure codec: no sockets (side_channel.hpp carries them).
#pragma once

#include "../config.hpp"
#include "../error.hpp"
#include "../result.hpp"
#include "wire.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace detail {
/// Internals of the side channel: frame codec, sockets and per-connection state.
namespace sc {

/// "TBSC": the first four bytes of every frame.
inline constexpr std::uint32_t frame_magic = 0x54425343u;
/// The frame layout this build speaks. Magic and version stay at bytes 0..5 in every version.
inline constexpr std::uint16_t protocol_version = 2;
/// Size of the fixed frame header.
inline constexpr std::size_t header_bytes = 32;

/// What a frame carries.
enum class FrameType : std::uint16_t {
  hello = 1,   ///< rank, size, listen port: identifies a connecting rank.
  welcome,     ///< rank 0 to the others: everyone joined, plus every rank's mesh address.
  gather_in,   ///< A rank's all_gather contribution, to rank 0.
  gather_out,  ///< Every rank's contribution, from rank 0.
  barrier_in,  ///< A rank reached the barrier, to rank 0.
  barrier_out, ///< Everyone reached the barrier, from rank 0.
  data,        ///< A point-to-point message.
  abort,       ///< The sender gave up: error kind, the rank where it started, and why.
  leaving,     ///< The sender is leaving the job (closing): its words on where it stands (version 2).
};
/// One past the largest FrameType value.
inline constexpr std::uint16_t frame_type_end = 10;

/// A printable name for a frame type.
constexpr std::string_view type_name(FrameType t) noexcept {
  switch (t) {
  case FrameType::hello:
    return "hello";
  case FrameType::welcome:
    return "welcome";
  case FrameType::gather_in:
  case FrameType::gather_out:
    return "all_gather";
  case FrameType::barrier_in:
  case FrameType::barrier_out:
    return "barrier";
  case FrameType::data:
    return "data";
  case FrameType::abort:
    return "abort";
  case FrameType::leaving:
    return "leaving";
  }
  return "unknown";
}
/// True for the frames of a collective (which must be called in the same order on every rank).
constexpr bool is_collective(FrameType t) noexcept {
  return t == FrameType::gather_in || t == FrameType::gather_out || t == FrameType::barrier_in ||
         t == FrameType::barrier_out;
}

/// The decoded fixed header, all fields in host order. Wire layout (big-endian):
/// magic u32 | version u16 | type u16 | job token u64 | sender u32 | length u32 |
/// payload CRC-32 u32 | header CRC-32 u32 (over the 28 bytes before it).
struct FrameHeader {
  std::uint32_t magic = frame_magic;        ///< Must be frame_magic.
  std::uint16_t version = protocol_version; ///< Must not be newer than protocol_version.
  std::uint16_t type = 0;                   ///< A FrameType.
  std::uint64_t job_token = 0;              ///< The sender's job token.
  std::uint32_t sender = 0;                 ///< The sender's rank.
  std::uint32_t length = 0;                 ///< Payload bytes after the header.
  std::uint32_t payload_crc = 0;            ///< CRC-32 of the payload.
  std::uint32_t header_crc = 0;             ///< CRC-32 of header bytes 0..27.
};

/// A received, validated frame.
struct Frame {
  FrameType type = FrameType::data; ///< What it carries.
  int sender = -1;                  ///< The sender's rank.
  std::vector<std::byte> payload;   ///< Its payload.
};

/// Serialises `h` into `out`, computing the header CRC (h.header_crc is ignored).
inline void encode_header(const FrameHeader& h, std::span<std::byte, header_bytes> out) noexcept {
  std::byte* p = out.data();
  put_be(p + 0, h.magic, 4);
  put_be(p + 4, h.version, 2);
  put_be(p + 6, h.type, 2);
  put_be(p + 8, h.job_token, 8);
  put_be(p + 16, h.sender, 4);
  put_be(p + 20, h.length, 4);
  put_be(p + 24, h.payload_crc, 4);
  put_be(p + 28, crc32(std::span<const std::byte>(p, 28)), 4);
}

/// A header for a frame of `type` carrying `payload`, with its length and payload CRC filled in.
inline FrameHeader make_header(FrameType type, std::uint64_t token, int sender,
                               std::span<const std::byte> payload) noexcept {
  FrameHeader h;
  h.type = static_cast<std::uint16_t>(type);
  h.job_token = token;
  h.sender = static_cast<std::uint32_t>(sender);
  h.length = static_cast<std::uint32_t>(payload.size());
  h.payload_crc = crc32(payload);
  return h;
}

/// Header and payload in one buffer (tests write such buffers, corrupted or not, to sockets).
inline std::vector<std::byte> encode_frame(const FrameHeader& h, std::span<const std::byte> payload) {
  std::vector<std::byte> out(header_bytes + payload.size());
  encode_header(h, std::span<std::byte, header_bytes>(out.data(), header_bytes));
  if (!payload.empty()) std::memcpy(out.data() + header_bytes, payload.data(), payload.size());
  return out;
}

/// Decodes and checks a header received from `from` ("rank 2", or an address before the rank is
/// known): magic, version, header CRC, job token, type and length cap, in that order. Any failure
/// is ErrorKind::bad_frame naming what was wrong and who sent it.
inline Result<FrameHeader> decode_header(std::span<const std::byte, header_bytes> in,
                                         std::uint64_t expected_token, std::uint32_t max_length,
                                         std::string_view from) {
  const std::byte* p = in.data();
  FrameHeader h;
  h.magic = static_cast<std::uint32_t>(get_be(p + 0, 4));
  h.version = static_cast<std::uint16_t>(get_be(p + 4, 2));
  h.type = static_cast<std::uint16_t>(get_be(p + 6, 2));
  h.job_token = get_be(p + 8, 8);
  h.sender = static_cast<std::uint32_t>(get_be(p + 16, 4));
  h.length = static_cast<std::uint32_t>(get_be(p + 20, 4));
  h.payload_crc = static_cast<std::uint32_t>(get_be(p + 24, 4));
  h.header_crc = static_cast<std::uint32_t>(get_be(p + 28, 4));
  char buf[256];
  const std::string who(from.substr(0, 64));
  auto bad = [&] { return fail(Error::make(Step::side_channel, ErrorKind::bad_frame, buf)); };
  if (h.magic != frame_magic) {
    std::snprintf(buf, sizeof buf,
                  "%s sent a frame with foreign magic 0x%08x (not a tbverbs side channel: wrong port?)",
                  who.c_str(), static_cast<unsigned>(h.magic));
    return bad();
  }
  if (h.version > protocol_version || h.version == 0) {
    std::snprintf(buf, sizeof buf,
                  "%s speaks side-channel protocol version %u, this build speaks %u: run the same "
                  "tbverbs version on every host",
                  who.c_str(), static_cast<unsigned>(h.version), static_cast<unsigned>(protocol_version));
    return bad();
  }
  if (crc32(std::span<const std::byte>(p, 28)) != h.header_crc) {
    std::snprintf(buf, sizeof buf, "%s sent a frame whose header checksum does not match (corrupt frame)",
                  who.c_str());
    return bad();
  }
  if (h.job_token != expected_token) {
    // This rank's own token is the job's credential: never printed.
    std::snprintf(buf, sizeof buf,
                  "%s has job token 0x%016llx, not this rank's: a rank of another job, or ranks "
                  "started with different secrets (TBVERBS_JOB_SECRET)",
                  who.c_str(), static_cast<unsigned long long>(h.job_token));
    return bad();
  }
  if (h.type == 0 || h.type >= frame_type_end) {
    std::snprintf(buf, sizeof buf, "%s sent a frame of unknown type %u", who.c_str(),
                  static_cast<unsigned>(h.type));
    return bad();
  }
  if (h.length > max_length) {
    std::snprintf(buf, sizeof buf, "%s announced a %lu-byte frame, above the %lu-byte cap", who.c_str(),
                  static_cast<unsigned long>(h.length), static_cast<unsigned long>(max_length));
    return bad();
  }
  return h;
}

/// Appends big-endian integers and byte strings to a payload.
struct Writer {
  std::vector<std::byte> out; ///< The payload so far.
  /// Appends the low `n` bytes of `v`, big-endian.
  void num(std::uint64_t v, int n) {
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(n));
    put_be(out.data() + at, v, n);
  }
  /// Appends raw bytes.
  void bytes(std::span<const std::byte> b) { out.insert(out.end(), b.begin(), b.end()); }
  /// Appends the bytes of `s`.
  void text(std::string_view s) { bytes(std::as_bytes(std::span<const char>(s.data(), s.size()))); }
};

/// Reads a payload with bounds checks: a short read sets `ok` to false and yields zeros.
struct Reader {
  std::span<const std::byte> in; ///< What is left.
  bool ok = true;                ///< False once a read ran past the end.
  /// Reads `n` big-endian bytes.
  std::uint64_t num(int n) {
    if (!ok || in.size() < static_cast<std::size_t>(n)) {
      ok = false;
      return 0;
    }
    const auto v = get_be(in.data(), n);
    in = in.subspan(static_cast<std::size_t>(n));
    return v;
  }
  /// Reads `n` raw bytes.
  std::span<const std::byte> bytes(std::size_t n) {
    if (!ok || in.size() < n) {
      ok = false;
      return {};
    }
    auto b = in.first(n);
    in = in.subspan(n);
    return b;
  }
  /// Reads `n` bytes as text.
  std::string text(std::size_t n) {
    auto b = bytes(n);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
};

} // namespace sc
} // namespace detail
TBVERBS_NAMESPACE_END
