// What a user types that the ring reads before anything else: sizes ("64M"), rank numbers from the
// environment, and the device file (JACCL's matrix, or mlx.distributed_config's hostfile). Pure
// functions, so fuzz/fuzz_ring_config.cpp can feed them anything.
#pragma once

#include <tbverbs/sizes.hpp>

#include <tbverbs/collective/device_file.hpp>

#include <cctype>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ring {

// Largest buffer a rank may ask for: far above any real all_sum (1 GiB per rank is the issue's
// bound), far below what overflows a size_t or the allocator (issue 9: a wrapped size crashed).
constexpr std::size_t kMaxBytes = std::size_t{1} << 40;

// "64M", "4K", "1G", "123" (bytes); nullopt for anything else or above kMaxBytes. The parser
// every example and tool shares (the library's tbverbs::parse_size).
inline std::optional<std::size_t> parse_size(const std::string& s) {
  const auto v = tbverbs::parse_size(s, kMaxBytes);
  return v ? std::optional<std::size_t>(static_cast<std::size_t>(*v)) : std::nullopt;
}

// A rank number from the environment: digits only ("one" is not rank 0).
std::optional<int> parse_rank(const std::string& s) {
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(s);
}

// The device file (JACCL's matrix, or mlx.distributed_config's hostfile): the collectives layer's
// one reader of it (tbverbs/collective/device_file.hpp, which documents the format).
using tbverbs::DeviceFileCables;
using tbverbs::parse_device_file;

}  // namespace ring
