// Parsers refuse what no valid input contains (issue 9, "parsers that accept what they should
// refuse"): endpoint frames with a checksum that matches but fields no peer sends, and GID text
// with an embedded NUL.
#include <tbverbs/collective/network.hpp>
#include <tbverbs/tbverbs.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <string>

using tbverbs::Endpoint;
using tbverbs::ErrorKind;

namespace {
Endpoint valid() {
  Endpoint e;
  e.qp_num = 0x123;
  e.psn = 0x456;
  e.qp_type = tbverbs::QpType::uc;
  e.gid = tbverbs::Gid::from_ipv4(0x0a630001);
  return e;
}
// The wire form of a valid endpoint with `change` applied and the checksum made right again, so
// only the field check can refuse it.
std::string refusal(const std::function<void(std::byte*)>& change) {
  auto w = valid().serialize();
  change(w.data());
  tbverbs::detail::put_be<std::uint32_t>(w.data() + 44, tbverbs::detail::crc32({w.data(), 44}));
  auto r = Endpoint::parse(w);
  if (r) return "";
  CHECK(r.error().kind == ErrorKind::bad_frame);
  return std::string(r.error().detail.view());
}
} // namespace

TEST_CASE("endpoint parse refuses QP number 0, a zero GID, a set reserved byte, unknown capability bits, an "
          "unknown link layer and UD",
          "[endpoint][strict]") {
  REQUIRE(Endpoint::parse(valid().serialize()));
  CHECK(refusal([](std::byte* p) { tbverbs::detail::put_be<std::uint32_t>(p + 8, 0); }).find("QP number 0") !=
        std::string::npos);
  CHECK(refusal([](std::byte* p) {
          for (int i = 28; i < 44; ++i) p[i] = std::byte{0};
        }).find("zero GID") != std::string::npos);
  CHECK(refusal([](std::byte* p) { p[23] = std::byte{1}; }).find("reserved byte") != std::string::npos);
  CHECK(refusal([](std::byte* p) { tbverbs::detail::put_be<std::uint32_t>(p + 24, 0x80); }).find("capability bits 0x80") !=
        std::string::npos);
  CHECK(refusal([](std::byte* p) { p[22] = std::byte{7}; }).find("link layer 7") != std::string::npos);
  CHECK(refusal([](std::byte* p) { p[20] = std::byte{4}; }).find("UD") != std::string::npos);
}

TEST_CASE("GID text with an embedded NUL is refused (inet_pton would stop at it)", "[gid][strict]") {
  using namespace std::string_view_literals;
  CHECK(tbverbs::Gid::parse("fe80::1"sv));
  CHECK_FALSE(tbverbs::Gid::parse("fe80::1\0junk"sv));
}

TEST_CASE("AlignedBuffer::allocate(SIZE_MAX) is an error, not a buffer of 0 bytes", "[strict]") {
  auto b = tbverbs::AlignedBuffer::allocate(SIZE_MAX);
  REQUIRE_FALSE(b);
  CHECK(b.error().is(ENOMEM));
  auto page = tbverbs::AlignedBuffer::allocate(1);
  REQUIRE(page);
  CHECK(page->size() == tbverbs::AlignedBuffer::page_size());
}

TEST_CASE("the one number and size parser (detail/decimal.hpp): digits only, suffixes K/M/G and B, overflow refused",
          "[parsers]") {
  using tbverbs::detail::parse_decimal;
  using tbverbs::detail::parse_size;
  CHECK(parse_decimal("0") == 0u);
  CHECK(parse_decimal("65535", 65535) == 65535u);
  CHECK_FALSE(parse_decimal("65536", 65535));
  CHECK(parse_decimal("18446744073709551615") == UINT64_MAX);
  CHECK_FALSE(parse_decimal("18446744073709551616")); // one above: overflow, not a wrap
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "12a"}) CHECK_FALSE(parse_decimal(bad));
  constexpr std::uint64_t tib = std::uint64_t{1} << 40;
  CHECK(parse_size("123", tib) == 123u);
  CHECK(parse_size("4K", tib) == 4096u);
  CHECK(parse_size("4k", tib) == 4096u);
  CHECK(parse_size("4KB", tib) == 4096u);
  CHECK(parse_size("64M", tib) == (64u << 20));
  CHECK(parse_size("1G", tib) == (std::uint64_t{1} << 30));
  CHECK(parse_size("1024G", tib) == tib);
  CHECK_FALSE(parse_size("1025G", tib));
  for (const char* bad : {"", "B", "K", "KB", "1T", "1KK", "-4K", "4 K", "99999999999999999999999"})
    CHECK_FALSE(parse_size(bad, tib));
  static_assert(parse_size("16M", tib) == (16u << 20)); // constexpr, as the tools' option checks use it
}

TEST_CASE("collective settings: one parser for TBVERBS_MEMORY/_TRANSPORT/_ALGORITHM and ring_all_sum's flags",
          "[parsers][collective]") {
  using namespace tbverbs::collective;
  CHECK(parse_setting<Memory>("auto") == Memory::automatic);
  CHECK(parse_setting<Memory>("registered") == Memory::registered);
  CHECK(parse_setting<Memory>("staged") == Memory::staged);
  CHECK(parse_setting<Transport>("auto") == Transport::automatic);
  CHECK(parse_setting<Transport>("send") == Transport::send);
  CHECK(parse_setting<Transport>("write") == Transport::write);
  CHECK(parse_setting<Algorithm>("auto") == Algorithm::automatic);
  CHECK(parse_setting<Algorithm>("ring") == Algorithm::ring);
  CHECK(parse_setting<Algorithm>("latency") == Algorithm::latency);
  CHECK(parse_setting<Algorithm>("mesh") == Algorithm::mesh);
  // Exact words only: no case folding, prefixes, other settings' words or the "?" of an unknown value.
  for (const char* bad : {"", "Auto", "stage", "registered ", "?", "ring"})
    CHECK_FALSE(parse_setting<Memory>(bad).has_value());
  CHECK_FALSE(parse_setting<Transport>("staged").has_value());
  CHECK_FALSE(parse_setting<Algorithm>("write").has_value());
  // Every name parses back to its value.
  for (Memory m : {Memory::automatic, Memory::registered, Memory::staged})
    CHECK(parse_setting<Memory>(memory_name(m)) == m);
  for (Transport t : {Transport::automatic, Transport::send, Transport::write})
    CHECK(parse_setting<Transport>(transport_name(t)) == t);
  CHECK(setting_choices<Memory>() == "auto, registered or staged");
  CHECK(setting_choices<Transport>() == "auto, send or write");
  CHECK(setting_choices<Algorithm>() == "auto, ring, latency or mesh");
}
