// The emulator in a process that loaded rdma-core's libibverbs first (torch 2.x does, through UCX;
// so do MPI and pyverbs): rdma-core's symbols are then global, and an emulator entry point that
// called another by its exported name (ibv_reg_mr -> ibv_reg_mr_iova2) reached rdma-core's with an
// emulator PD and crashed. The emulator binds its own calls to itself (-Bsymbolic-functions).
//
//   after_rdma_core RDMA_CORE_LIBIBVERBS    (TBVERBS_LIBRARY, TBVERBS_EMU_FABRIC, TBVERBS_EMU_HOST set)
// Exit 0: rdma-core was loaded first and globally, the emulator's device opened, memory registered
// through ibv_reg_mr and a queue pair made; 77 (skipped) where rdma-core's library is not there.
#include <tbverbs/tbverbs.hpp>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  using namespace tbverbs;
  if (argc != 2) {
    std::fprintf(stderr, "usage: after_rdma_core RDMA_CORE_LIBIBVERBS\n");
    return 2;
  }
  void* rdma_core = ::dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (rdma_core == nullptr) {
    std::printf("SKIPPED: rdma-core's libibverbs cannot be loaded here (%s)\n", ::dlerror());
    return 77;
  }
  const char* emu_path = std::getenv("TBVERBS_LIBRARY");
  auto fail = [](const char* what, const Error& e) {
    std::printf("FAIL: %s: %s\n", what, e.message().c_str());
    return 1;
  };
  auto lib = Library::load(emu_path != nullptr ? emu_path : "");
  if (!lib) return fail("loading the emulator", lib.error());
  void* emu = ::dlopen(emu_path, RTLD_NOW | RTLD_NOLOAD);
  if (emu == nullptr || ::dlsym(emu, "ibv_reg_mr_iova2") == ::dlsym(rdma_core, "ibv_reg_mr_iova2")) {
    std::printf("FAIL: the emulator and rdma-core are not two libraries in this process\n");
    return 1;
  }
  auto ctx = Context::open(*lib, "");
  if (!ctx) return fail("opening the device", ctx.error());
  auto table = ctx->gid_table(1);
  if (!table) return fail("reading the GID table", table.error());
  auto gid = table->select();
  if (!gid) return fail("selecting a GID", gid.error());
  auto pd = ctx->alloc_pd();
  if (!pd) return fail("allocating a protection domain", pd.error());
  auto buf = AlignedBuffer::allocate(1 << 20);
  if (!buf) return fail("allocating", buf.error());
  auto mr = pd->reg_mr(*buf, Access::local_write); // ibv_reg_mr, which calls ibv_reg_mr_iova2
  if (!mr) return fail("registering memory", mr.error());
  auto cq = ctx->create_cq(4);
  if (!cq) return fail("creating a completion queue", cq.error());
  auto prepared = QpRecipe::for_platform(ctx->platform(), *gid).prepare(*pd, *cq);
  if (!prepared) return fail("creating the queue pair", prepared.error());
  std::printf("OK: %s registered 1 MiB and made a queue pair with rdma-core loaded first (%s)\n",
              std::string(ctx->name()).c_str(), argv[1]);
  ::dlclose(emu);
  return 0;
}
