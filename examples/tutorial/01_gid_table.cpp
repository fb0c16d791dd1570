// Tutorial chapter 1 (docs/tutorial/01-gid-table.md): open an RDMA device and read its GID table.
//
//   tutorial_01_gid_table [DEVICE]
//
// An RDMA device (on a Mac, one `rdma_enN` per Thunderbolt port) has ports, and every port has a
// GID table: the addresses it can be reached at, each at an index. A queue pair names its own
// address twice: once by INDEX, in the RTR step that connects it (`sgid_index`), and once by
// VALUE, in the endpoint it sends to the peer. If the two disagree the connection fails in ways
// that are hard to read; tbverbs takes both from one `GidSelection`, so they cannot.
//
// Which verbs library runs is decided at run time: TBVERBS_LIBRARY names it (the tutorial uses
// the emulator's, build/dev/emulator/lib/libtbverbs_emu.so); without it, libibverbs.so.1 on Linux
// and librdma.dylib on macOS.
#include "tutorial.hpp"

#include <iostream>
#include <string>

using namespace tbverbs;
using tutorial::fail;

int main(int argc, char** argv) {
  // 1. Load the verbs library (dlopen: nothing was linked at build time).
  auto lib = Library::load();
  if (!lib) return fail("loading the verbs library", lib.error());
  std::cout << "library: " << lib->path() << "\n";

  // 2. Open a device: the one named on the command line, else TBVERBS_DEVICE, else the first one.
  auto ctx = Context::open(*lib, argc > 1 ? argv[1] : "");
  if (!ctx) return fail("opening the device", ctx.error());
  auto port = ctx->query_port(1); // RDMA ports are numbered from 1
  if (!port) return fail("reading port 1", port.error());
  std::cout << "device " << ctx->name() << ", port 1: " << port->state << ", link layer " << port->link_layer
            << ", GID table of " << port->gid_table_length << " entries\n";

  // 3. Read the whole GID table: a snapshot that keeps every entry's index.
  auto table = ctx->gid_table(1);
  if (!table) return fail("reading the GID table", table.error());
  for (std::size_t i = 0; i < table->size(); ++i) {
    const Gid g = table->at(static_cast<int>(i));
    if (g.is_zero()) continue; // an empty slot: most of the 1024 entries on Thunderbolt
    std::cout << "  GID[" << i << "] " << g;
    if (g.is_link_local()) std::cout << "  link-local (fe80::): not routable over the cable\n";
    else if (g.is_ipv4_mapped()) std::cout << "  IPv4-mapped: the interface's address " << ipv4_to_string(g.ipv4()) << "\n";
    else std::cout << "\n";
  }

  // 4. Select the entry to use. select() takes TBVERBS_GID_INDEX when it is set (and checks it),
  //    else the first IPv4-mapped entry, which is what Thunderbolt and RoCE v2 need. It is not
  //    always at index 1 (on some Macs it is 2): that is why the table is scanned.
  auto gid = table->select();
  if (!gid) return fail("selecting a GID", gid.error());
  std::cout << "selected: " << *gid << " (" << gid->reason() << ")\n";

  // 5. A queue pair built from that selection. The recipe is the set of choices both ends must
  //    agree on (UC on Thunderbolt, RC on rdma-core); a prepared QP exists but is not connected.
  auto pd = ctx->alloc_pd();
  if (!pd) return fail("allocating a protection domain", pd.error());
  auto cq = ctx->create_cq(16);
  if (!cq) return fail("creating a completion queue", cq.error());
  auto recipe = QpRecipe::for_platform(ctx->platform(), *gid);
  auto prepared = recipe.prepare(*pd, *cq);
  if (!prepared) return fail("creating the queue pair", prepared.error());
  const Endpoint mine = prepared->endpoint(); // what we would send to the peer
  std::cout << "endpoint (sent to the peer): " << mine << "\n";

  // 6. The RTR step, as connect() would run it (toward our own endpoint, standing in for a peer).
  auto rtr = recipe.rtr_transition(mine);
  if (!rtr) return fail("building the RTR step", rtr.error());
  const int sgid_index = rtr->attr.ah_attr.grh.sgid_index;
  std::cout << "RTR sgid_index " << sgid_index << " -> GID[" << sgid_index << "] " << table->at(sgid_index) << "\n";

  // 7. Check what the chapter claims: the index RTR uses holds the GID the endpoint advertises.
  if (sgid_index != gid->index() || !(table->at(sgid_index) == mine.gid)) {
    std::cerr << "FAILED: RTR's sgid_index " << sgid_index << " does not hold the advertised GID " << mine.gid << "\n";
    return 1;
  }
  std::cout << "one selection, one value: the advertised GID is the entry RTR names\n";
  return 0; // every handle is released here, children before parents
}
