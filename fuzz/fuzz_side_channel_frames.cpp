// libFuzzer harness: the side channel's frame receiver on untrusted bytes, through a real socket
// pair (recv, header checks, payload CRCs, the stranger limits, the inbox cap). The first input
// byte chooses whether the connection is a known rank or a stranger that has not sent its hello.
#include <tbverbs/side_channel.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace sc = tbverbs::detail::sc;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > 60000) return 0; // within one socket buffer: written before it is read
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  sc::Conn c;
  c.fd = sc::UniqueFd(fds[0]);
  c.rank = (data[0] & 1) ? 1 : -1;
  c.who = "fuzz peer";
  const ssize_t w = ::send(fds[1], data + 1, size - 1, 0);
  ::close(fds[1]);
  if (w != static_cast<ssize_t>(size - 1)) return 0;
  constexpr std::uint64_t token = 0x7bc0ffee12345678ull;
  for (int i = 0; i < 64 && !c.dead(); ++i) {
    sc::pump(c, token, 1u << 20, 1u << 20);
    if (c.rank < 0 && !c.inbox.empty()) { // the hello was read: the caller names the rank
      c.rank = 1;
      sc::split_frames(c, token, 1u << 20, 1u << 20);
    }
  }
  // Every delivered frame passed its checks: its payload CRC must match what the header said,
  // which split_frames verified; re-check the invariant the callers rely on.
  for (const sc::Frame& f : c.inbox)
    if (static_cast<std::uint16_t>(f.type) == 0 || static_cast<std::uint16_t>(f.type) >= sc::frame_type_end) std::abort();
  if (c.bad) (void)c.bad->message();
  return 0;
}
