/// @file message_size.hpp
/// Message sizes on Thunderbolt: 4 KiB frames, queue depths counted in frames, and the first guess
/// of the largest message a port delivers (which a link's warm-up then confirms).
#pragma once

#include "config.hpp"
#include "detail/decimal.hpp"
#include "error.hpp"
#include "measured_profile.hpp"
#include "result.hpp"
#include "types.hpp"

#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// Bytes of one Thunderbolt wire frame: the unit Apple's driver counts depths and pairs sends
/// with receives in (TN3205).
inline constexpr std::size_t frame_bytes = 4096;

/// The number of 4 KiB frames a message of `bytes` spans on Thunderbolt (an empty message still
/// takes one). A send and the receive it lands in must span the same number.
constexpr std::uint32_t frames_of(std::size_t bytes) noexcept {
  return bytes == 0 ? 1u : static_cast<std::uint32_t>((bytes + frame_bytes - 1) / frame_bytes);
}

/// The largest queue depth Apple's driver accepts, in frames (TN3205: "up to 4095").
inline constexpr std::uint32_t max_depth_frames = 4095;

/// The most work requests one queue of Apple's driver was seen to hold at once, whatever
/// ibv_create_qp granted: 63 sends of 64 granted, 63 receives of 128 (hellas-ai/thunderbolt-ibverbs
/// PR #41, 64 KiB messages; docs/field-reports.md). Code that runs under every reading keeps at
/// most this many posted and not completed per queue on Apple, besides the frame count.
inline constexpr std::uint32_t apple_max_posted_requests = 63;

/// A first guess of the largest message, with the rule that chose it.
struct MessageSizeGuess {
  std::size_t bytes = 0;    ///< Largest message to try (a whole number of frames on Thunderbolt).
  std::string_view reason;  ///< Which rule decided (for logs and explain output).
};

namespace detail {
/// Parses "65536", "64K", "16M" (bytes; parse_size's syntax, at most 1 TiB); 0 when malformed or
/// absurd.
inline std::size_t parse_message_bytes(std::string_view s) noexcept {
  return static_cast<std::size_t>(parse_size(s, std::uint64_t{1} << 40).value_or(0));
}

/// The macOS product version as major * 100 + minor (2603 for 26.3), or 0 when unknown (not
/// macOS, or sysctl failed).
inline int macos_version() noexcept {
#if defined(__APPLE__)
  char buf[32] = {};
  std::size_t len = sizeof buf - 1;
  if (::sysctlbyname("kern.osproductversion", buf, &len, nullptr, 0) != 0) return 0;
  int major = std::atoi(buf);
  const char* dot = std::strchr(buf, '.');
  return major * 100 + (dot != nullptr ? std::atoi(dot + 1) : 0);
#else
  return 0;
#endif
}
} // namespace detail

/// The largest message to try on a port of `platform`, before a warm-up confirms it:
///  1. `TBVERBS_MAX_MESSAGE` (bytes, or with a K, M or G suffix: detail::parse_size) when set: the operator knows;
///  2. else the port's max_msg_sz (TN3205: 16,773,120 = 4095 frames), capped at half the
///     device's max_mr_size (a message must fit in one region of a MemoryRegionSet);
///  3. the largest message tbverbs-probe delivered intact on this host, when `TBVERBS_PROFILE`
///     names its profile (measured_profile()): measured, not assumed, so it replaces rule 4;
///  4. else, on Apple, one frame when `sysctl kern.osproductversion` says macOS older than 26.3
///     (ds4 saw messages above 16 KiB not delivered on older macOS; JACCL uses messages of more
///     than one frame only from 26.3 on).
/// The result is at most `wanted` and, on Thunderbolt, a whole number of frames. The guess is
/// only a start: a link's warm-up steps down to one frame when larger messages are not
/// delivered, so the 26.2 behaviour is survived without knowing the version.
/// Errors: `invalid_argument` for a malformed `TBVERBS_MAX_MESSAGE`, or for a `TBVERBS_PROFILE`
/// that cannot be read or parsed (a profile the operator asked for is never silently ignored).
[[nodiscard]] inline Result<MessageSizeGuess> largest_message_guess(Platform platform, const PortAttributes& port,
                                                                    const DeviceAttributes& device,
                                                                    std::size_t wanted) {
  const bool frames = platform == Platform::apple;
  auto round = [&](std::size_t b) {  // down to whole frames on Thunderbolt, at least one
    const std::size_t whole = b / frame_bytes * frame_bytes;
    return !frames ? b : whole > frame_bytes ? whole : frame_bytes;
  };
  MessageSizeGuess g{wanted, "as asked"};
  if (const char* env = std::getenv("TBVERBS_MAX_MESSAGE"); env != nullptr && *env != '\0') {
    const std::size_t v = detail::parse_message_bytes(env);
    if (v == 0 || (frames && v < frame_bytes))
      return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                              std::string("TBVERBS_MAX_MESSAGE=") + env + " is not a size in bytes (e.g. 4096, 64K, 16M)" +
                                  (frames ? " of at least one 4 KiB frame" : "")));
    if (v < g.bytes) g = {v, "TBVERBS_MAX_MESSAGE"};
    g.bytes = round(g.bytes);
    return g;
  }
  if (port.max_msg_sz != 0 && port.max_msg_sz < g.bytes) g = {port.max_msg_sz, "the port's max_msg_sz"};
  if (device.max_mr_size != 0 && device.max_mr_size / 2 < g.bytes)
    g = {static_cast<std::size_t>(device.max_mr_size / 2), "half the device's max_mr_size (one region per message)"};
  auto profile = measured_profile();
  if (!profile) return fail(profile.error());
  if (profile->max_message_bytes) {
    if (*profile->max_message_bytes < g.bytes)
      g = {*profile->max_message_bytes, "measured by tbverbs-probe (TBVERBS_PROFILE)"};
  } else if (frames) {
    const int v = detail::macos_version();
    if (v != 0 && v < 2603 && g.bytes > frame_bytes)
      g = {frame_bytes, "macOS before 26.3 delivers messages of one 4 KiB frame only"};
  }
  g.bytes = round(g.bytes);
  return g;
}

TBVERBS_NAMESPACE_END
