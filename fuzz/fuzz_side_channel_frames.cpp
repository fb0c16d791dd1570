// libFuzzer harness: the side channel's frame receiver on untrusted bytes, through a real socket
// pair (recv, header checks, payload CRCs, the stranger limits, the inbox cap, who may send what).
// The first input byte chooses whether the connection is a known rank or a stranger that has not
// sent its hello, the sender's and the receiver's ranks (rank 0 or another) and whether the
// receiver's rendezvous is over.
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
  const int sender = (data[0] & 2) ? 0 : 2;
  c.rank = (data[0] & 1) ? sender : -1;
  c.who = "fuzz peer";
  const sc::FrameRules rules{(data[0] & 4) ? 0 : 1, (data[0] & 8) != 0};
  const ssize_t w = ::send(fds[1], data + 1, size - 1, 0);
  ::close(fds[1]);
  if (w != static_cast<ssize_t>(size - 1)) return 0;
  constexpr std::uint64_t token = 0x7bc0ffee12345678ull;
  for (int i = 0; i < 64 && !c.dead(); ++i) {
    sc::pump(c, token, 1u << 20, 1u << 20, rules);
    if (c.rank < 0 && !c.inbox.empty()) { // the hello was read: the caller names the rank
      c.rank = sender;
      sc::split_frames(c, token, 1u << 20, 1u << 20, rules);
    }
  }
  // Every delivered frame passed its checks: its payload CRC must match what the header said,
  // which split_frames verified; re-check the invariant the callers rely on.
  // Every frame a known rank delivered is one it may send: refused ones dropped the connection.
  for (std::size_t k = 0; k < c.inbox.size(); ++k) {
    const sc::Frame& f = c.inbox[k];
    if (static_cast<std::uint16_t>(f.type) == 0 || static_cast<std::uint16_t>(f.type) >= sc::frame_type_end) std::abort();
    const bool strangers_first = k == 0 && !(data[0] & 1); // read by the caller, which wants a hello
    if (!strangers_first && sc::refused(rules, f.type, sender)) std::abort();
  }
  if (c.bad) (void)c.bad->message();
  return 0;
}
