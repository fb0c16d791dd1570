// A consumer of the collectives layer compiled once (tbverbs_add_collective_library): this file
// sees declarations only (TBVERBS_COLLECTIVE_SEPARATE comes with the library), the definitions
// come from the library. Without a launcher's variables, from_env() must say what is missing.
#include <tbverbs/collective.hpp>

#include <cstdlib>
#include <iostream>

#ifndef TBVERBS_COLLECTIVE_SEPARATE
#error "tbverbs_add_collective_library must give its users TBVERBS_COLLECTIVE_SEPARATE"
#endif

int main() {
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "MLX_RANK", "JACCL_RANK"})
    ::unsetenv(v);
  auto options = tbverbs::CommunicatorOptions::from_env();
  if (options) {
    std::cout << "from_env() found a rank with no launcher variables set\n";
    return 1;
  }
  auto comm = tbverbs::Communicator::connect(tbverbs::CommunicatorOptions{}); // rank -1: refused
  if (comm) {
    std::cout << "connect() accepted options without a rank\n";
    return 1;
  }
  std::cout << "tbverbs collective consumer: " << options.error().message() << "; " << comm.error().message() << '\n';
  return options.error().is(tbverbs::ErrorKind::invalid_argument) && comm.error().is(tbverbs::ErrorKind::invalid_argument) ? 0 : 1;
}
