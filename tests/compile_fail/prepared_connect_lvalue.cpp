// Misuse: connecting a PreparedQueuePair that stays usable afterwards. connect() is &&-qualified:
// the prepared QP is consumed, so a stale prepared handle cannot be connected twice.
#include <tbverbs/tbverbs.hpp>

#include <utility>

tbverbs::PreparedQueuePair& prepared(); // declared only: the check never links
const tbverbs::Endpoint& remote();

int main() {
#ifdef TBVERBS_COMPILE_FAIL_CONTROL
  auto qp = std::move(prepared()).connect(remote());
#else
  auto qp = prepared().connect(remote());
#endif
  return qp ? 0 : 1;
}
