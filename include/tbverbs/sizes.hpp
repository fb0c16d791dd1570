/// @file sizes.hpp
/// The one parser of unsigned decimal numbers in text a user typed or a file holds (ports,
/// GID indices, profile values, rank counts; digits only, overflow refused), and of byte sizes
/// written with a K, M or G suffix (TBVERBS_MAX_MESSAGE, TBVERBS_MESSAGE_BYTES, and every
/// example's and tool's size options). Public so that a program's own options parse as the
/// library's do.
#pragma once

#include "config.hpp"

#include <cstdint>
#include <optional>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

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

/// "64M", "4K", "1G", "4KB", "123" as bytes (K, M and G 1024-based, either case, an optional
/// trailing B); nullopt for anything else or above `max`.
constexpr std::optional<std::uint64_t> parse_size(std::string_view s, std::uint64_t max) noexcept {
  auto upper = [](char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; };
  if (!s.empty() && upper(s.back()) == 'B') {
    s.remove_suffix(1);
    if (s.empty()) return std::nullopt;
  }
  std::uint64_t mult = 1;
  if (!s.empty()) {
    const char unit = upper(s.back());
    if (unit == 'K' || unit == 'M' || unit == 'G') {
      mult = std::uint64_t{1} << (unit == 'K' ? 10 : unit == 'M' ? 20 : 30);
      s.remove_suffix(1);
    }
  }
  const auto v = parse_decimal(s, max / mult);
  if (!v) return std::nullopt;
  return *v * mult;
}

TBVERBS_NAMESPACE_END
