// libFuzzer harness: the size text of TBVERBS_MAX_MESSAGE ("65536", "64K", "16M", "1G", "4KB": the
// syntax of detail::parse_size). No input may overflow: an accepted value is what the digits say,
// times the suffix, and at most 1 TiB.
#include <tbverbs/message_size.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::size_t v = tbverbs::detail::parse_message_bytes(text);
  if (v == 0) return 0;
  // Recompute with 128-bit arithmetic: the parser must agree.
  std::string_view digits = text;
  if (digits.back() == 'B' || digits.back() == 'b') digits.remove_suffix(1);
  unsigned mult = 1;
  switch (digits.back()) {
  case 'K': case 'k': mult = 1u << 10; break;
  case 'M': case 'm': mult = 1u << 20; break;
  case 'G': case 'g': mult = 1u << 30; break;
  default: break;
  }
  if (mult != 1) digits.remove_suffix(1);
  unsigned __int128 want = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') std::abort(); // accepted something that is not digits
    want = want * 10 + static_cast<unsigned>(c - '0');
    if (want > (unsigned __int128)1 << 64) std::abort();
  }
  want *= mult;
  if (want != v || want > (unsigned __int128)1 << 40) std::abort();
  return 0;
}
