// LinkMailbox between two ranks of one side channel in this process: a peer on another link
// protocol version (an older tbverbs, which sends no LinkOffer before its endpoint) is named at
// once, with both versions, instead of leaving this side waiting for an offer that never comes.
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
  auto options = [](int rank, std::uint16_t port) {
    SideChannelOptions o;
    o.rank = rank;
    o.size = 2;
    o.coordinator = "127.0.0.1:" + std::to_string(port);
    o.job_token = 0x21;
    o.timeout = 5s;
    return o;
  };
  std::promise<std::uint16_t> listening;
  auto port = listening.get_future();
  SideChannelOptions o0 = options(0, 0);
  o0.on_listening = [&](std::uint16_t p) { listening.set_value(p); };
  auto root = std::async(std::launch::async, [o0] { return SideChannel::connect(o0); });
  REQUIRE(port.wait_for(5s) == std::future_status::ready);
  auto one = SideChannel::connect(options(1, port.get()));
  auto zero = root.get();
  REQUIRE(one);
  REQUIRE(zero);

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
