// A program as a user writes it from docs/collectives.md, "Run your program": the documented
// snippet, a check of the result, nothing the launcher does not give it. tests/run/run_test.sh
// starts it with `tbverbs-emu run -n N -- your_program [--exit-on-rank R CODE] [--sleep S]`.
#include <tbverbs/collective.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  int exit_rank = -1, exit_code = 0, sleep_s = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--exit-on-rank" && i + 2 < argc) {
      exit_rank = std::atoi(argv[++i]);
      exit_code = std::atoi(argv[++i]);
    } else if (a == "--sleep") {
      sleep_s = std::atoi(argv[++i]);
    }
  }
  auto opts = tbverbs::CommunicatorOptions::from_env(); // rank, size, coordinator, devices, secret
  if (!opts) { std::fprintf(stderr, "%s\n", opts.error().message().c_str()); return 1; }
  auto comm = tbverbs::Communicator::connect(*opts);
  if (!comm) { std::fprintf(stderr, "%s\n", comm.error().message().c_str()); return 1; }
  const int n = comm->size(), me = comm->rank();
  std::vector<float> grads(1 << 16, static_cast<float>(me + 1)), sum(grads.size());
  if (auto r = comm->all_reduce(std::span<const float>(grads), std::span<float>(sum), tbverbs::ReduceOp::sum); !r) {
    std::fprintf(stderr, "%s\n", r.error().message().c_str());
    return 1;
  }
  const float want = static_cast<float>(n * (n + 1) / 2);
  for (const float v : sum)
    if (v != want) { std::printf("rank %d: WRONG: %g, not %g\n", me, v, want); return 1; }
  std::printf("rank %d of %d: all_reduce of %zu floats verified (%g)\n", me, n, sum.size(), want);
  if (me == exit_rank) return exit_code; // a rank that fails while the others go on
  if (sleep_s > 0) ::sleep(static_cast<unsigned>(sleep_s)); // the job's others, busy long after
  return 0;
}
