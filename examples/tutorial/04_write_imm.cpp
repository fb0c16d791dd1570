// Tutorial chapter 4 (docs/tutorial/04-write-imm.md): RDMA WRITE with immediate, on an RC queue pair.
//
//   tutorial_04_write_imm --local [--profile rdma-core-rc|thunderbolt]   (default rdma-core-rc)
//   tutorial_04_write_imm [--bytes N]                                    one rank, from a launcher
//
// With SEND the receiver says where each message goes, one posted receive per message. With RDMA
// WRITE the SENDER says where: it writes straight into a buffer the receiver registered for
// remote writing and advertised (its address and remote key, "rkey"). The receiver's program is
// not told: a plain WRITE leaves no completion on its side. WRITE WITH IMMEDIATE adds one: it
// consumes one posted receive (with no buffer) and completes it with 32 bits of "immediate"
// data, after the written bytes are in place; NCCL uses it as its "your data is here" signal.
//
// rdma-core NICs run it on reliable (RC) queue pairs. Apple's Thunderbolt driver offers SEND and
// RECV only (it accepts an RDMA WRITE and moves nothing), so there tbverbs refuses the post.
#include "tutorial.hpp"

#include <tbverbs/link.hpp> // wait_with_liveness: a wait that notices a peer that is gone

#include <chrono>
#include <cstring>
#include <iostream>
#include <string>

using namespace tbverbs;
using tutorial::fail;

static std::byte pattern(std::size_t i) { return std::byte((i * 7 + 3) & 0xff); }

static int run_rank(const tutorial::Job& job, std::size_t bytes) {
  const int rank = job.rank, peer = 1 - rank;
  const std::string me = "rank " + std::to_string(rank) + ": ";
  constexpr std::uint32_t imm = 0x600d; // the 32 bits the writer attaches: here, a tag

  auto channel = SideChannel::connect(job.side_channel());
  if (!channel) return fail("side channel", channel.error());
  auto lib = Library::load();
  if (!lib) return fail("loading the verbs library", lib.error());
  auto ctx = Context::open(*lib, rank == 0 ? job.right_device : job.left_device);
  if (!ctx) return fail("opening the device", ctx.error());
  auto table = ctx->gid_table(1);
  if (!table) return fail("reading the GID table", table.error());
  auto gid = table->select();
  if (!gid) return fail("selecting a GID", gid.error());
  auto pd = ctx->alloc_pd();
  if (!pd) return fail("allocating a protection domain", pd.error());
  auto buf = AlignedBuffer::allocate(bytes);
  if (!buf) return fail("allocating", buf.error());
  // Rank 0 is written to: remote_write lets the peer's device write into it. Rank 1 only reads
  // its own buffer to send it: no right at all beyond local read (least privilege).
  auto mr = pd->reg_mr(*buf, rank == 0 ? Access::local_write | Access::remote_write : Access::none);
  if (!mr) return fail("registering memory", mr.error());
  auto cq = ctx->create_cq(4);
  if (!cq) return fail("creating a completion queue", cq.error());

  // for_platform: RC with remote write granted on rdma-core (QpRecipe::rdma_core_rc), UC on Apple.
  auto prepared = QpRecipe::for_platform(ctx->platform(), *gid).prepare(*pd, *cq);
  if (!prepared) return fail("creating the queue pair", prepared.error());
  std::cout << me << "device " << ctx->name() << ", my endpoint: " << prepared->endpoint() << "\n";
  auto wires = channel->all_gather(prepared->endpoint().serialize());
  if (!wires) return fail("exchanging endpoints", wires.error());
  auto remote = Endpoint::parse((*wires)[static_cast<std::size_t>(peer)]);
  if (!remote) return fail("reading the peer's endpoint", remote.error());
  auto qp = std::move(*prepared).connect(*remote);
  if (!qp) return fail("connecting", qp.error());

  // The advertisement: where rank 1 may write. Both ranks run on one machine here, so the struct
  // goes as it is; tbverbs::MemoryAdvertisement has a byte-order-safe, checksummed wire form.
  RemoteBuffer target{reinterpret_cast<std::uintptr_t>(buf->data()), mr->rkey()};
  auto ads = channel->all_gather(std::as_bytes(std::span(&target, 1)));
  if (!ads) return fail("exchanging the buffer's address", ads.error());
  std::memcpy(&target, (*ads)[0].data(), sizeof target); // rank 0's
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  WorkCompletion wc[2];

  if (rank == 0) {
    // One receive with no buffer: the credit the WRITE WITH IMMEDIATE consumes.
    if (auto r = qp->post(RecvWr(/*wr_id=*/7)); !r) return fail("posting the receive", r.error());
    std::cout << me << "advertised " << bytes << " bytes at 0x" << std::hex << target.addr << " rkey 0x" << target.rkey
              << std::dec << ", posted receive 7 (no buffer)\n";
    if (auto r = channel->barrier(); !r) return fail("barrier (receive posted)", r.error());
    auto n = wait_with_liveness(*cq, wc, *channel, peer, deadline, Step::wait_cq, "the write's completion");
    if (!n) return fail("waiting for the write", n.error());
    if (!wc[0].is_recv() || !wc[0].has_imm() || wc[0].imm() != imm || wc[0].byte_len() != bytes) {
      std::cerr << "FAILED: expected receive 7 completed with immediate 0x600d and " << bytes << " bytes\n";
      return 1;
    }
    std::cout << me << "completion: wr_id " << wc[0].wr_id() << ", immediate 0x" << std::hex << wc[0].imm() << std::dec
              << ", " << wc[0].byte_len() << " bytes written into my buffer\n";
    for (std::size_t i = 0; i < bytes; ++i)
      if (buf->data()[i] != pattern(i)) return std::cerr << "FAILED: byte " << i << " is wrong\n", 1;
    std::cout << me << "all " << bytes << " bytes verified\n";
  } else {
    for (std::size_t i = 0; i < bytes; ++i) buf->data()[i] = pattern(i);
    auto sge = mr->sge(0, bytes);
    if (!sge) return fail("making an SGE", sge.error());
    if (auto r = channel->barrier(); !r) return fail("barrier (receive posted)", r.error());
    // Refused before the driver where the QP cannot write (Apple's driver: SEND only).
    if (auto r = qp->post(SendWr::rdma_write_with_imm(/*wr_id=*/1, *sge, target, imm)); !r)
      return fail("posting the RDMA WRITE", r.error());
    std::cout << me << "posted RDMA WRITE with immediate 0x600d: " << bytes << " bytes to 0x" << std::hex << target.addr
              << std::dec << "\n";
    auto n = wait_with_liveness(*cq, wc, *channel, peer, deadline, Step::wait_cq, "the write's completion");
    if (!n) return fail("waiting for the write", n.error());
    std::cout << me << "completion: wr_id " << wc[0].wr_id() << ", the write is done\n";
  }
  if (auto r = channel->barrier(); !r) return fail("final barrier", r.error());
  return 0;
}

int main(int argc, char** argv) {
  bool local = false;
  std::string profile = "rdma-core-rc";
  std::size_t bytes = 16384;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--local") local = true;
    else if (a == "--profile" && i + 1 < argc) profile = argv[++i];
    else if (a == "--bytes" && i + 1 < argc) bytes = std::strtoul(argv[++i], nullptr, 10);
    else bytes = 0;
  }
  if (bytes == 0 || bytes > (1u << 24) || (profile != "rdma-core-rc" && profile != "thunderbolt")) {
    std::cerr << "usage: tutorial_04_write_imm [--local] [--profile rdma-core-rc|thunderbolt] [--bytes 1..16777216]\n";
    return 2;
  }
  if (local) return tutorial::run_local(2, {"--bytes", std::to_string(bytes)}, profile);
  auto job = tutorial::Job::from_env();
  return job ? run_rank(*job, bytes) : 2;
}
