// tbverbs API tour: one message each way between two processes (rank 0 and rank 1).
// Build: c++ -std=c++20 -I include tour.cpp -o tour -ldl      Run: ./tour RANK HOST:PORT [DEVICE]
#include <tbverbs/side_channel.hpp>
#include <tbverbs/tbverbs.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

using namespace tbverbs;

// Every step returns a Result: a value, or an Error whose message names the verb, the errno by
// its <cerrno> name, the device, port and GID index, and a cause and remedy.
static int fail_with(const Error& e) {
  std::cerr << "tour: " << e << "\n";
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 3 || (std::string(argv[1]) != "0" && std::string(argv[1]) != "1")) {
    std::cerr << "usage: tour 0|1 HOST:PORT [DEVICE]  (rank 0 listens at HOST:PORT, rank 1 connects)\n";
    return 2;
  }
  const int rank = argv[1][0] - '0';

  // load -> device -> context: dlopen'ed at run time (TBVERBS_LIBRARY overrides the path).
  auto lib = Library::load();                   // librdma.dylib on macOS, libibverbs.so.1 on Linux
  if (!lib) return fail_with(lib.error());      // not installed: which OS or package is needed
  auto ctx = Context::open(*lib, argc > 3 ? argv[3] : ""); // "": TBVERBS_DEVICE, else the first device
  if (!ctx) return fail_with(ctx.error());      // none: "no RDMA device" + remedy; a wrong name lists the devices

  // port -> GID table -> selection: the selection carries its index.
  auto table = ctx->gid_table(1);               // a fresh snapshot of the port's whole table
  if (!table) return fail_with(table.error());
  auto gid = table->select();                   // TBVERBS_GID_INDEX, else the first ::ffff: entry
  if (!gid) return fail_with(gid.error());      // only fe80:: -> no_ipv4_gid: no IPv4 address + the fix

  // resources: move-only handles; children keep their parents alive, so teardown order is right.
  auto pd = ctx->alloc_pd();
  if (!pd) return fail_with(pd.error());
  auto buf = AlignedBuffer::allocate(2 * 4096); // page-aligned: one 4 KiB frame to send, one to receive
  if (!buf) return fail_with(buf.error());
  auto mr = pd->reg_mr(*buf);                   // least privilege: local write only
  if (!mr) return fail_with(mr.error());
  auto cq = ctx->create_cq(16);                 // Apple: wait() polls; rdma-core: sleeps on a channel
  if (!cq) return fail_with(cq.error());

  // recipe -> prepared QP -> endpoint exchange -> connected QP.
  auto recipe = QpRecipe::for_platform(ctx->platform(), *gid); // Thunderbolt: UC, MTU 1024, GRH
  auto prepared = recipe.prepare(*pd, *cq);     // has endpoint(), has no post_send()
  if (!prepared) return fail_with(prepared.error());
  std::cout << "rank " << rank << ": " << prepared->endpoint() << "\n";

  // Any channel carries the 48-byte wire form; tbverbs' side channel is TCP through rank 0.
  SideChannelOptions options;
  options.rank = rank;
  options.size = 2;
  options.coordinator = argv[2];
  auto channel = SideChannel::connect(options); // every wait has a deadline (30 s by default)
  if (!channel) return fail_with(channel.error());
  auto wire = prepared->endpoint().serialize(); // magic, version, byte order, CRC-32
  auto wires = channel->all_gather(wire);
  if (!wires) return fail_with(wires.error());
  auto remote = Endpoint::parse((*wires)[1 - rank]); // truncated/foreign/corrupt/newer -> bad_frame
  if (!remote) return fail_with(remote.error());
  auto qp = std::move(*prepared).connect(*remote); // RTR sgid_index == the advertised GID's index
  if (!qp) return fail_with(qp.error());

  // post / poll: receive first, then tell the peer ("receives posted"), then send.
  auto inbox = mr->sge(4096, 64);
  auto outbox = mr->sge(0, 64);
  if (!inbox) return fail_with(inbox.error());
  if (!outbox) return fail_with(outbox.error());
  std::snprintf(reinterpret_cast<char*>(buf->data()), 64, "hello from rank %d", rank);
  if (auto r = qp->recv(1, *inbox); !r) return fail_with(r.error());
  if (auto r = channel->barrier(); !r) return fail_with(r.error());
  if (auto r = qp->send(2, *outbox); !r) return fail_with(r.error());
  WorkCompletion wc[4];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (std::size_t done = 0; done < 2;) {       // the send's completion and the receive's
    auto n = cq->wait(wc, deadline);            // a failed completion is an Error naming its status
    if (!n) return fail_with(n.error());        // a silent peer is a timeout, never a hang
    done += *n;
  }
  std::cout << "rank " << rank << ": received \"" << reinterpret_cast<const char*>(buf->data() + 4096) << "\"\n";
  if (auto r = channel->barrier(); !r) return fail_with(r.error()); // both received: tear down
  return 0;
}
