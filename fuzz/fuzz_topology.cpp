// libFuzzer harness: Topology::parse_ports on untrusted bytes (a peer's topology message, the
// all_gather of topology discovery, topology.hpp). What it accepts must hold only values the
// sender could have had (a GID index in the table's range, a netmask of at most 32 bits, a usable
// port with a GID index), serialise back to the same bytes, and give a Topology whose reports
// format without crashing. Issue 19, finding 3: a GID index field of 0x80000000 overflowed.
#include <tbverbs/topology.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  auto ports = tbverbs::Topology::parse_ports(bytes, 1);
  if (!ports) {
    if (!ports.error().is(tbverbs::ErrorKind::bad_frame)) std::abort();
    (void)ports.error().message();
    return 0;
  }
  for (const auto& p : *ports) {
    if (p.gid_index < -1 || p.gid_index > tbverbs::Topology::max_wire_gid_index) std::abort();
    if (p.prefix < 0 || p.prefix > 32) std::abort();
    if (p.usable && p.gid_index < 0) std::abort();
    (void)p.subnet();
  }
  const auto wire = tbverbs::Topology::serialize_ports(*ports);
  if (wire.size() != size || !std::equal(wire.begin(), wire.end(), bytes.begin())) std::abort();
  // Two ranks that both sent this: the graph and its problems must build and print.
  auto t = tbverbs::Topology::from_ports({*ports, *ports});
  (void)t.describe();
  (void)t.problems();
  if (auto r = t.ring(); !r) (void)r.error().message();
  return 0;
}
