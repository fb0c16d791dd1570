// libFuzzer harness: LinkOffer::parse on untrusted bytes (a peer's offer before any QP exists).
// Whatever it accepts must serialise and parse back to the same value, and agree() with any
// offer must either choose a transport both ends run or say why not.
#include <tbverbs/link_offer.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

namespace {
bool same(const tbverbs::LinkOffer& a, const tbverbs::LinkOffer& b) {
  return a.transports == b.transports && a.ops == b.ops && a.depth_unit == b.depth_unit && a.max_depth == b.max_depth &&
         a.max_message == b.max_message && a.platform == b.platform && a.device.view() == b.device.view();
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  auto o = tbverbs::LinkOffer::parse(bytes);
  if (!o) {
    (void)o.error().message(); // formatting the error must not crash either
    return 0;
  }
  auto again = tbverbs::LinkOffer::parse(o->serialize());
  if (!again || !same(*again, *o)) std::abort();
  tbverbs::LinkOffer apple;
  apple.transports = tbverbs::Transports::uc;
  apple.depth_unit = tbverbs::DepthUnit::frames;
  apple.platform = tbverbs::Platform::apple;
  for (const auto& mine : {apple, *o}) {
    auto a = tbverbs::agree(mine, *o);
    auto b = tbverbs::agree(*o, mine);
    if (a.has_value() != b.has_value()) std::abort(); // the choice is symmetric
    if (a && (a->type != b->type || a->ops != b->ops || a->equal_frames != b->equal_frames ||
              !tbverbs::contains(a->ops, tbverbs::SendOp::send)))
      std::abort();
  }
  return 0;
}
