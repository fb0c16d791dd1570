// libFuzzer harness: Gid::parse on untrusted text (TBVERBS_GID_INDEX-style operator input, logs).
// Whatever it accepts must print and parse back to the same GID.
#include <tbverbs/gid.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto g = tbverbs::Gid::parse(text);
  if (!g) return 0;
  auto again = tbverbs::Gid::parse(g->to_string());
  if (!again || !(*again == *g)) std::abort();
  return 0;
}
