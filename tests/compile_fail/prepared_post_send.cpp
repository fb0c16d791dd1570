// Misuse: posting on a queue pair that is not connected. PreparedQueuePair has no post functions;
// only connect() (on an rvalue) yields a QueuePair, which has them.
#include <tbverbs/tbverbs.hpp>

#include <utility>

tbverbs::PreparedQueuePair& prepared(); // declared only: the check never links
const tbverbs::Endpoint& remote();

int main() {
  tbverbs::abi::ibv_send_wr wr{};
#ifdef TBVERBS_COMPILE_FAIL_CONTROL
  auto qp = std::move(prepared()).connect(remote());
  if (!qp) return 1;
  auto posted = qp->post_send(wr);
#else
  auto posted = prepared().post_send(wr);
#endif
  return posted ? 0 : 1;
}
