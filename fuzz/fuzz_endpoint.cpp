// libFuzzer harness: Endpoint::parse on untrusted bytes (a peer's endpoint frame). Whatever it
// accepts must serialise and parse back to the same value.
#include <tbverbs/endpoint.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  auto e = tbverbs::Endpoint::parse(bytes);
  if (!e) {
    (void)e.error().message(); // formatting the error must not crash either
    return 0;
  }
  // Same value again (not necessarily the same bytes: a GID type newer than this build is read
  // as unknown).
  const auto wire = e->serialize();
  if (wire.size() != size) std::abort();
  auto again = tbverbs::Endpoint::parse(wire);
  if (!again || !(*again == *e)) std::abort();
  return 0;
}
