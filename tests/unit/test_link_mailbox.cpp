// LinkMailbox between two ranks of one side channel in this process: a peer on another link
// protocol version (an older tbverbs, which sends no LinkOffer before its endpoint) is named at
// once, with both versions, instead of leaving this side waiting for an offer that never comes.
#include "two_ranks.hpp"

#include <tbverbs/link.hpp>

#include <catch2/catch_test_macros.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <future>
#include <string>

using namespace tbverbs;

TEST_CASE("LinkMailbox: a peer on another link protocol version is named at once", "[link][mailbox]") {
  using namespace std::chrono_literals;
  auto [zero_rank, one_rank] = two_ranks(0x21);
  SideChannel* zero = &zero_rank;
  SideChannel* one = &one_rank;

  // Rank 1 is an older build: its first link message is a version-2 endpoint ("TBLK", version 2,
  // type 1, link 7, attempt 0), where this build expects a version-3 offer.
  std::array<std::byte, 16> old{};
  detail::put_be<std::uint32_t>(old.data(), 0x54424c4bu);
  detail::put_be<std::uint16_t>(old.data() + 4, 2);
  detail::put_be<std::uint16_t>(old.data() + 6, 1);
  detail::put_be<std::uint32_t>(old.data() + 8, 7);
  REQUIRE(one->send_to(0, old, std::chrono::steady_clock::now() + 2s));
  LinkMailbox mailbox(*zero);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = mailbox.recv(1, LinkMailbox::Type::offer, 7, 0, std::chrono::steady_clock::now() + 5s);
  REQUIRE_FALSE(r);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s); // not the 5 s deadline
  CHECK(r.error().is(ErrorKind::bad_frame));
  const std::string m = r.error().message();
  CHECK(m.find("version 2, this build 3") != std::string::npos);
  CHECK(m.find("same tbverbs release") != std::string::npos);
}
