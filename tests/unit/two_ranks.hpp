// Two ranks of one side channel in this process: rank 0 listens on a free loopback port, rank 1
// connects to it. For tests of what runs over the side channel (links, liveness).
#pragma once

#include <tbverbs/side_channel.hpp>

#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <utility>

/// Ranks 0 and 1 of a two-rank side channel with job token `token` (REQUIREs both to connect).
inline std::pair<tbverbs::SideChannel, tbverbs::SideChannel> two_ranks(std::uint64_t token) {
  using namespace std::chrono_literals;
  auto options = [token](int rank, std::uint16_t port) {
    tbverbs::SideChannelOptions o;
    o.rank = rank;
    o.size = 2;
    o.coordinator = "127.0.0.1:" + std::to_string(port);
    o.job_token = token;
    o.timeout = 5s;
    return o;
  };
  std::promise<std::uint16_t> listening;
  auto port = listening.get_future();
  tbverbs::SideChannelOptions o0 = options(0, 0);
  o0.on_listening = [&](std::uint16_t p) { listening.set_value(p); };
  auto root = std::async(std::launch::async, [o0] { return tbverbs::SideChannel::connect(o0); });
  REQUIRE(port.wait_for(5s) == std::future_status::ready);
  auto one = tbverbs::SideChannel::connect(options(1, port.get()));
  auto zero = root.get();
  REQUIRE(one);
  REQUIRE(zero);
  return {std::move(*zero), std::move(*one)};
}
