// libFuzzer harness: the size text of TBVERBS_MAX_MESSAGE ("65536", "64K", "16M"). No input may
// overflow: an accepted value is what the digits say, times the suffix.
#include <tbverbs/message_size.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::size_t v = tbverbs::detail::parse_message_bytes(text);
  if (v == 0) return 0;
  // Recompute with overflow checks: the parser must agree.
  std::string_view digits = text;
  std::size_t mult = 1;
  const char last = digits.back();
  if (last == 'K' || last == 'k') mult = 1024;
  if (last == 'M' || last == 'm') mult = 1024 * 1024;
  if (mult != 1) digits.remove_suffix(1);
  unsigned __int128 want = 0;
  for (char c : digits) want = want * 10 + static_cast<unsigned>(c - '0');
  want *= mult;
  if (want != v) std::abort();
  return 0;
}
