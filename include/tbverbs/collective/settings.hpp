/// @file collective/settings.hpp
/// The communicator's settings that are words (TBVERBS_MEMORY, TBVERBS_TRANSPORT,
/// TBVERBS_ALGORITHM and the tools' flags): `collective::Memory`, `collective::Transport` (and
/// Algorithm, from collective/call.hpp), their names and the one parser of all three.
#pragma once

#include "call.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// How user buffers reach the NIC (docs/collectives.md, "Memory"): `automatic` sends and
/// receives straight from and into memory registered with Communicator::register_memory and
/// stages everything else; `registered` also registers any other buffer on first use and keeps it
/// in the registration cache (the caller keeps those buffers mapped, or calls
/// Communicator::forget_memory before freeing one); `staged` never registers user memory: every
/// message is copied through the communicator's registered scratch slots.
enum class Memory : std::uint8_t { automatic, registered, staged };

/// How messages travel: `send` (SEND/RECV, every driver), `write` (RDMA WRITE with immediate into
/// the peer's scratch memory: RC only; Apple's UC driver accepts a WRITE but does not execute it,
/// so there SEND/RECV is used), `automatic` (the one measured faster on the emulator: SEND/RECV,
/// docs/collective-backend.md, section 6b).
enum class Transport : std::uint8_t { automatic, send, write };

/// "auto", "registered", "staged": TBVERBS_MEMORY's and ring_all_sum --memory's words.
constexpr std::string_view memory_name(Memory m) noexcept {
  switch (m) {
  case Memory::automatic: return "auto";
  case Memory::registered: return "registered";
  case Memory::staged: return "staged";
  }
  return "?";
}

/// "auto", "send", "write": TBVERBS_TRANSPORT's and ring_all_sum --transport's words.
constexpr std::string_view transport_name(Transport t) noexcept {
  switch (t) {
  case Transport::automatic: return "auto";
  case Transport::send: return "send";
  case Transport::write: return "write";
  }
  return "?";
}

/// The word of any setting: memory_name, transport_name or algorithm_name, by type (the one name
/// table parse_setting and setting_choices walk).
constexpr std::string_view setting_name(Memory m) noexcept { return memory_name(m); }
/// The word of a Transport (transport_name) or an Algorithm (algorithm_name), as setting_name(Memory).
constexpr std::string_view setting_name(Transport t) noexcept { return transport_name(t); }
/// The word of a Transport (transport_name) or an Algorithm (algorithm_name), as setting_name(Memory).
constexpr std::string_view setting_name(Algorithm a) noexcept { return algorithm_name(a); }
/// How many values a setting (Memory, Transport, Algorithm) has: 0 .. setting_count - 1.
template <class Setting> constexpr std::uint8_t setting_count = std::is_same_v<Setting, Algorithm> ? 4 : 3;

/// The setting called `name` (the words of memory_name, transport_name and algorithm_name: the
/// one parser of TBVERBS_MEMORY, TBVERBS_TRANSPORT, TBVERBS_ALGORITHM and ring_all_sum's flags),
/// or nullopt. `Setting` is Memory, Transport or Algorithm.
template <class Setting> constexpr std::optional<Setting> parse_setting(std::string_view name) noexcept {
  for (std::uint8_t v = 0; v < setting_count<Setting>; ++v)
    if (setting_name(static_cast<Setting>(v)) == name) return static_cast<Setting>(v);
  return std::nullopt;
}

/// The accepted words of a setting, for an error message: "auto, registered or staged".
template <class Setting> inline std::string setting_choices() {
  constexpr std::uint8_t n = setting_count<Setting>;
  std::string out;
  for (std::uint8_t v = 0; v < n; ++v)
    out.append(v == 0 ? "" : v + 1 == n ? " or " : ", ").append(setting_name(static_cast<Setting>(v)));
  return out;
}

} // namespace collective
TBVERBS_NAMESPACE_END
