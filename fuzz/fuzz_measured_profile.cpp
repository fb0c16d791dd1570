// libFuzzer harness: MeasuredProfile::parse on untrusted text (a TBVERBS_PROFILE file, written by
// tbverbs-probe on another host or edited by hand, measured_profile.hpp). A refusal names the
// line; what it accepts must format() into a file that parses back to the same values.
#include <tbverbs/measured_profile.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto p = tbverbs::MeasuredProfile::parse(text, "fuzz");
  if (!p) {
    if (!p.error().is(tbverbs::ErrorKind::invalid_argument)) std::abort();
    if (std::string(p.error().detail.view()).rfind("fuzz:", 0) != 0) std::abort();  // names the line
    (void)p.error().message();
    return 0;
  }
  if (p->max_message_bytes && *p->max_message_bytes == 0) std::abort();
  if (p->max_mrs && (*p->max_mrs < 0 || *p->max_mrs > 1000000)) std::abort();
  if (p->max_qps && (*p->max_qps < 0 || *p->max_qps > 1000000)) std::abort();
  auto again = tbverbs::MeasuredProfile::parse(p->format("fuzz"), "again");
  if (!again) std::abort();
  if (again->device != p->device || again->macos != p->macos || again->max_message_bytes != p->max_message_bytes ||
      again->empty_rq != p->empty_rq || again->completion_channels != p->completion_channels ||
      again->max_mr_bytes != p->max_mr_bytes || again->max_mrs != p->max_mrs || again->max_qps != p->max_qps)
    std::abort();
  return 0;
}
