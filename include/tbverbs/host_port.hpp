/// @file host_port.hpp
/// "host:port" text as the side channel and the launchers take it.
#pragma once

#include "config.hpp"
#include "detail/decimal.hpp"
#include "error.hpp"
#include "result.hpp"

#include <cstdint>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// A parsed "host:port" (or "[ipv6]:port") address.
struct HostPort {
  std::string host;       ///< Host name or numeric address; empty means "any local address".
  std::uint16_t port = 0; ///< TCP port; 0 asks the system for a free one (listening only).

  /// "host:port", with brackets around an IPv6 literal.
  std::string to_string() const {
    const bool v6 = host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

/// Parses "host:port", "[ipv6]:port" or ":port" (any local address). A bare IPv6 address without
/// brackets is refused because its last colon is ambiguous.
/// Fails with ErrorKind::invalid_argument naming what is wrong.
[[nodiscard]] inline Result<HostPort> parse_host_port(std::string_view text) {
  auto bad = [&](const char* why) {
    return fail(Error::make(Step::side_channel, ErrorKind::invalid_argument,
                            "address \"" + std::string(text.substr(0, 120)) + "\": " + why));
  };
  HostPort hp;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return bad("missing ']' after the IPv6 address");
    hp.host = std::string(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("missing \":port\"");
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("missing \":port\"");
    if (text.find(':') != colon) return bad("put an IPv6 address in brackets: [addr]:port");
    hp.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  // A host is a name or a numeric address: no brackets left over, no NUL, no spaces or control
  // characters (text from the environment can carry any of them), and brackets only around IPv6.
  for (char ch : hp.host)
    if (ch == '[' || ch == ']' || static_cast<unsigned char>(ch) <= ' ' || ch == 0x7f)
      return bad("the host has a bracket, a space or a control character");
  if (!text.empty() && text.front() == '[' && hp.host.find(':') == std::string::npos)
    return bad("brackets are for IPv6 addresses only");
  const auto value = detail::parse_decimal(port, 65535);
  if (!value) return bad("the port must be a number from 0 to 65535");
  hp.port = static_cast<std::uint16_t>(*value);
  return hp;
}

TBVERBS_NAMESPACE_END
