/// @file decimal.hpp
/// The one parser of unsigned decimal numbers in text a user typed or a file holds (ports,
/// sizes, GID indices, profile values): digits only, overflow refused.
#pragma once

#include "../config.hpp"

#include <cstdint>
#include <optional>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// The digits of `s` as a number; nullopt when `s` is empty, holds anything but 0-9 (no sign,
/// no spaces) or is above `max`.
constexpr std::optional<std::uint64_t> parse_decimal(std::string_view s, std::uint64_t max = UINT64_MAX) noexcept {
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (max - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

} // namespace detail
TBVERBS_NAMESPACE_END
