// Misuse (issue 8, finding 4): a work request that points at a temporary SGE would dangle by the
// time it is posted, as a std::string_view of a temporary string does. SendWr and RecvWr refuse
// rvalue SGEs at compile time; the control names the SGE first.
#include <tbverbs/work_request.hpp>

tbverbs::abi::ibv_sge make_sge(); // declared only: the check never links

int main() {
#ifdef TBVERBS_COMPILE_FAIL_CONTROL
  const tbverbs::abi::ibv_sge sge = make_sge();
  auto wr = tbverbs::SendWr::send(1, sge);
  tbverbs::RecvWr rwr(2, sge);
#else
  auto wr = tbverbs::SendWr::send(1, make_sge());
  tbverbs::RecvWr rwr(2, make_sge());
#endif
  return static_cast<int>(wr.wr_id() + rwr.wr_id());
}
