// Registrations follow memory, not addresses (docs/collectives.md, "Memory"). Every rank runs a
// training-style loop that frees its 64 MiB buffer and maps a new one at the same address each
// step, in each way a program may hold memory:
//   handles      register_memory before each all_reduce, the handle dropped before the free;
//   kept_handle  one register_memory handle kept while its memory is freed and mapped again
//                (the program's mistake: the old registration must never serve the new memory);
//   registered   TBVERBS_MEMORY=registered semantics (Memory::registered), no handle at all;
//   staged       Memory::staged;
// and checks every element of every result. On hardware (and on the emulator, which pins pages as
// ibv_reg_mr does) a registration used for other memory loses the data: the results would be
// wrong. Also: a MemoryRegistration that outlives its communicator is harmless.
//
//   registration_check --local N      starts N ranks of itself on an emulated ring
// Exit 0 when every result matched; each problem is a line with FAIL.
#include <tbverbs/collective.hpp>

#include "check_main.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using tbverbs::Communicator;
using tbverbs::collective::Memory;

using check::failed;
constexpr std::size_t elements = (std::size_t{64} << 20) / sizeof(float);

// 64 MiB of anonymous memory, mapped where the previous one was (the address glibc's malloc hands
// out again after a free of a large block), or anywhere when that is taken.
struct Mapping {
  float* data = nullptr;
  static void* last;
  Mapping() {
    void* p = ::mmap(last, elements * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    data = static_cast<float*>(p);
    last = p;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ::munmap(data, elements * sizeof(float)); }
  std::span<float> span() const { return {data, elements}; }
};
void* Mapping::last = nullptr;

tbverbs::Result<Communicator> connect(Memory memory) {
  auto opts = tbverbs::CommunicatorOptions::from_env();
  if (!opts) return tbverbs::fail(opts.error());
  opts->memory = memory;
  opts->algorithm = tbverbs::collective::Algorithm::ring; // user memory is sent from and received into
  return Communicator::connect(*opts);
}

// One step: fill, all_reduce in place, check every element. `step` changes the values, so a
// result left from an earlier step does not pass.
void step(Communicator& c, Mapping& m, int s, const std::string& mode) {
  const int n = c.size();
  for (std::size_t i = 0; i < elements; ++i) m.data[i] = static_cast<float>((c.rank() + 1) * (s + 1) + static_cast<int>(i % 7));
  if (auto r = c.all_reduce(m.span()); !r) {
    failed(mode + " step " + std::to_string(s) + ": " + r.error().message());
    return;
  }
  const float base = static_cast<float>((s + 1) * n * (n + 1) / 2);
  for (std::size_t i = 0; i < elements; ++i)
    if (m.data[i] != base + static_cast<float>(n * static_cast<int>(i % 7))) {
      failed(mode + " step " + std::to_string(s) + ": element " + std::to_string(i) + " is " + std::to_string(m.data[i]) +
             ", expected " + std::to_string(base + static_cast<float>(n * static_cast<int>(i % 7))) +
             " (a registration served other memory?)");
      return;
    }
}

void loop(const std::string& mode, Memory memory, bool handles, bool kept_handle) {
  auto comm = connect(memory);
  if (!comm) {
    failed(mode + ": connect: " + comm.error().message());
    return;
  }
  Communicator& c = *comm;
  check::rank = c.rank();
  std::optional<tbverbs::MemoryRegistration> kept;
  int same_address = 0;
  void* previous = nullptr;
  for (int s = 0; s < 4; ++s) {
    Mapping m;
    same_address += m.data == previous ? 1 : 0;
    previous = m.data;
    std::optional<tbverbs::MemoryRegistration> reg;
    if (handles || (kept_handle && !kept)) {
      auto r = c.register_memory(std::span<const float>(m.span()));
      if (!r) {
        failed(mode + ": register_memory: " + r.error().message());
        return;
      }
      (kept_handle ? kept : reg).emplace(std::move(*r));
    }
    step(c, m, s, mode);
    if (handles && c.user_regions(0) == 0) failed(mode + ": the handle's registration is not there");
  } // each step's handle goes, then its memory: the registration must go with the handle
  if (handles && c.user_regions(0) != 0) failed(mode + ": " + std::to_string(c.user_regions(0)) + " regions left after every handle went");
  std::printf("rank %d: %s: 4 steps verified (%d of 3 buffers at the previous one's address, %llu registrations)\n", c.rank(),
              mode.c_str(), same_address, static_cast<unsigned long long>(c.registrations()));
  if (same_address == 0) std::printf("rank %d: %s: note: no buffer came back at the same address\n", c.rank(), mode.c_str());
  if (auto r = c.close(); !r) failed(mode + ": close: " + r.error().message());
}

// A handle that outlives its communicator (and a moved-from one) goes without touching it.
void outlive() {
  auto comm = connect(Memory::automatic);
  if (!comm) {
    failed("outlive: connect: " + comm.error().message());
    return;
  }
  std::vector<float> v(4096, 1.0f);
  auto reg = comm->register_memory(std::span<const float>(v));
  if (!reg) {
    failed("outlive: register_memory: " + reg.error().message());
    return;
  }
  tbverbs::MemoryRegistration moved = std::move(*reg);
  if (auto r = comm->close(); !r) failed("outlive: close: " + r.error().message());
  comm = tbverbs::fail(tbverbs::Error::make(tbverbs::Step::collective, tbverbs::ErrorKind::invalid_argument, "gone"));
  // `moved` and `*reg` go after the communicator: nothing to do, nothing touched.
}

int run_rank() {
  loop("handles", Memory::automatic, true, false);
  loop("kept_handle", Memory::automatic, false, true);
  loop("registered", Memory::registered, false, false);
  loop("staged", Memory::staged, false, false);
  outlive();
  if (check::failures == 0) std::printf("rank %d: every registration served its own memory\n", check::rank);
  return check::failures == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  return check::main(argc, argv, false, [](const std::string&) { return run_rank(); });
}
