// What compile_time.sh times: a file that includes <tbverbs/collective.hpp> and calls one
// all_reduce (issue 35's measure). Compiled header-only, and with TBVERBS_COLLECTIVE_SEPARATE.
#include <tbverbs/collective.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main() {
  auto options = tbverbs::CommunicatorOptions::from_env();
  if (!options) return 1;
  auto comm = tbverbs::Communicator::connect(*options);
  if (!comm) return 1;
  std::vector<float> v(4, 1.0f);
  if (auto r = comm->all_reduce(std::span<float>(v), tbverbs::ReduceOp::sum); !r) {
    std::fprintf(stderr, "%s\n", r.error().message().c_str());
    return 1;
  }
  return 0;
}
