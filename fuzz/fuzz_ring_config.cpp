// libFuzzer harness: what ring_all_sum reads from its user before anything else (device files,
// size strings, rank numbers; examples/ring_all_sum/device_file.hpp). The first byte picks the
// rank, the rest is the text. Accepted device files give every rank a ring (both neighbours'
// cables non-empty, at most 32 each); accepted sizes stay within the ring's bound.
#include "../examples/ring_all_sum/device_file.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int rank = data[0] % 70;  // a few beyond 64, to reach the range checks
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string problem;
  auto c = ring::parse_device_file(text, rank, problem);
  if (c) {
    if (c->ranks < 2 || c->ranks > 64 || rank >= c->ranks) std::abort();
    if (c->left.empty() || c->right.empty() || c->left.size() > 32 || c->right.size() > 32) std::abort();
  } else if (problem.empty()) {
    std::abort();  // a refusal always says why
  }
  if (auto s = ring::parse_size(std::string(text)); s && (*s > ring::kMaxBytes)) std::abort();
  (void)ring::parse_rank(std::string(text));
  return 0;
}
