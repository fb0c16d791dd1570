/// @file format.hpp
/// `std::formatter` for tbverbs' printable types, where the standard library has `<format>`
/// (`__cpp_lib_format`; libstdc++ 13+, libc++ 17+; not g++ 12): `std::format("{}", endpoint)`.
///
/// Each formats as its `to_string` does and takes the string format spec (`{:>40}`). The umbrella
/// tbverbs.hpp includes it (measured: with clang 19 and libc++ the umbrella's -fsyntax-only time
/// does not change, its headers reach \<format\> already); the lean data_path.hpp does not. With
/// g++ 12 it declares nothing: use `to_string` or `operator<<`, which every build has.
#pragma once

#include "config.hpp"
#include "endpoint.hpp"
#include "error.hpp"
#include "gid.hpp"
#include "types.hpp"

#include <version>

#if defined(__cpp_lib_format) && __cpp_lib_format >= 201907L
#include <format>
#include <string_view>

/// 1 when format.hpp declares the std::formatter specialisations (the library has `<format>`).
#define TBVERBS_HAS_FORMATTER 1

TBVERBS_NAMESPACE_BEGIN
namespace detail {
/// A formatter that formats `to_string(value)` with the string spec (fill, align, width).
template <class T> struct ToStringFormatter : std::formatter<std::string_view, char> {
  /// Formats `to_string(v)`.
  template <class Context> auto format(const T& v, Context& ctx) const {
    return std::formatter<std::string_view, char>::format(std::string_view(to_string(v)), ctx);
  }
};
} // namespace detail
TBVERBS_NAMESPACE_END

/// Formats an Endpoint as `to_string` does.
template <> struct std::formatter<tbverbs::Endpoint, char> : tbverbs::detail::ToStringFormatter<tbverbs::Endpoint> {};
/// Formats a Gid as its IPv6 text.
template <> struct std::formatter<tbverbs::Gid, char> : tbverbs::detail::ToStringFormatter<tbverbs::Gid> {};
/// Formats a GidSelection as `describe()` does.
template <> struct std::formatter<tbverbs::GidSelection, char>
    : tbverbs::detail::ToStringFormatter<tbverbs::GidSelection> {};
/// Formats a QpType: "UC".
template <> struct std::formatter<tbverbs::QpType, char> : tbverbs::detail::ToStringFormatter<tbverbs::QpType> {};
/// Formats an Mtu in bytes: "1024".
template <> struct std::formatter<tbverbs::Mtu, char> : tbverbs::detail::ToStringFormatter<tbverbs::Mtu> {};
/// Formats a PortState: "PORT_ACTIVE".
template <> struct std::formatter<tbverbs::PortState, char> : tbverbs::detail::ToStringFormatter<tbverbs::PortState> {};
/// Formats a LinkLayer: "Thunderbolt".
template <> struct std::formatter<tbverbs::LinkLayer, char> : tbverbs::detail::ToStringFormatter<tbverbs::LinkLayer> {};
/// Formats a GidType: "RoCE v2".
template <> struct std::formatter<tbverbs::GidType, char> : tbverbs::detail::ToStringFormatter<tbverbs::GidType> {};
/// Formats an Error as its whole `message()`.
template <> struct std::formatter<tbverbs::Error, char> : tbverbs::detail::ToStringFormatter<tbverbs::Error> {};

#else
/// 1 when format.hpp declares the std::formatter specialisations (the library has `<format>`).
#define TBVERBS_HAS_FORMATTER 0
#endif
