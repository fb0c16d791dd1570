// libFuzzer harness: parse_host_port on untrusted text (coordinator addresses from the
// environment). Whatever it accepts must print and parse back to the same address.
#include <tbverbs/host_port.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto hp = tbverbs::parse_host_port(text);
  if (!hp) {
    (void)hp.error().message();
    return 0;
  }
  auto again = tbverbs::parse_host_port(hp->to_string());
  if (!again || again->host != hp->host || again->port != hp->port) std::abort();
  return 0;
}
