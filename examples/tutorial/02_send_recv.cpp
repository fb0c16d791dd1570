// Tutorial chapter 2 (docs/tutorial/02-send-recv.md): one message with SEND and RECV.
//
//   tutorial_02_send_recv --local [--profile thunderbolt|rdma-core-rc] [--receive-bytes N]
//                                   both ranks on two emulated Macs joined by one cable
//                                   (or two Linux hosts with RDMA NICs: rdma-core-rc)
//   tutorial_02_send_recv [--receive-bytes N]   one rank, from a launcher's environment
//
// --receive-bytes: the size of rank 0's receive (default 4096, one 4 KiB frame).
//
// Rank 1 sends one message to rank 0. Nothing moves until a program hands the device a WORK
// REQUEST ("receive into these bytes", "send these bytes") by POSTING it to a queue pair; the
// device then works on its own, and reports each finished request as a COMPLETION in a
// completion queue, which the program POLLS. A receive must be posted before the matching send
// arrives: the receiver posts first, then tells the sender so over the side channel.
#include "tutorial.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

using namespace tbverbs;
using tutorial::fail;

static int run_rank(const tutorial::Job& job, std::size_t receive_bytes) {
  const int rank = job.rank, peer = 1 - rank;
  const std::string me = "rank " + std::to_string(rank) + ": ";

  // The side channel first: it is how the two ranks find each other.
  auto channel = SideChannel::connect(job.side_channel());
  if (!channel) return fail("side channel", channel.error());

  // Chapter 1's steps: library, device, GID, and the objects a queue pair needs. Rank 0's cable
  // to the right and rank 1's cable to the left are the same cable.
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

  // Memory the device may touch must be REGISTERED: pinned, and known to the device by a key.
  // A whole number of 4 KiB pages: Thunderbolt counts everything in 4 KiB frames.
  auto buf = AlignedBuffer::allocate(receive_bytes);
  if (!buf) return fail("allocating", buf.error());
  auto mr = pd->reg_mr(*buf, Access::local_write); // local_write: the device may write into it
  if (!mr) return fail("registering memory", mr.error());
  auto cq = ctx->create_cq(4); // room for every completion we can have outstanding
  if (!cq) return fail("creating a completion queue", cq.error());

  // The queue pair: prepare, swap endpoints over the side channel, connect.
  auto prepared = QpRecipe::for_platform(ctx->platform(), *gid).prepare(*pd, *cq);
  if (!prepared) return fail("creating the queue pair", prepared.error());
  std::cout << me << "device " << ctx->name() << ", my endpoint: " << prepared->endpoint() << "\n";
  auto wires = channel->all_gather(prepared->endpoint().serialize());
  if (!wires) return fail("exchanging endpoints", wires.error());
  auto remote = Endpoint::parse((*wires)[static_cast<std::size_t>(peer)]);
  if (!remote) return fail("reading the peer's endpoint", remote.error());
  auto qp = std::move(*prepared).connect(*remote);
  if (!qp) return fail("connecting", qp.error());
  std::cout << me << "connected to rank " << peer << "'s QP, GID " << remote->gid << "\n";

  // A scatter-gather entry (SGE) names registered bytes: address, length, the region's key.
  auto sge = mr->sge(0, receive_bytes);
  if (!sge) return fail("making an SGE", sge.error());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  WorkCompletion wc[4];

  if (rank == 0) { // the receiver
    if (auto r = qp->recv(/*wr_id=*/1, *sge); !r) return fail("posting the receive", r.error());
    std::cout << me << "posted a receive: wr_id 1, " << receive_bytes << " bytes\n";
    if (auto r = channel->barrier(); !r) return fail("barrier (receives posted)", r.error());
    auto n = cq->wait(wc, deadline); // a failed completion comes back as an Error, not as data
    if (!n) return fail("waiting for the message", n.error());
    if (*n != 1 || !wc[0].is_recv() || wc[0].wr_id() != 1) {
      std::cerr << "FAILED: expected the completion of receive 1\n";
      return 1;
    }
    const std::string text(reinterpret_cast<const char*>(buf->data()), wc[0].byte_len());
    std::cout << me << "completion: wr_id " << wc[0].wr_id() << ", receive, " << wc[0].byte_len() << " bytes: \""
              << text.c_str() << "\"\n";
    if (text.c_str() != std::string("hello from rank 1")) {
      std::cerr << "FAILED: the message is not the one rank 1 sent\n";
      return 1;
    }
  } else { // the sender
    const char hello[] = "hello from rank 1";
    std::memcpy(buf->data(), hello, sizeof hello);
    auto out = mr->sge(0, sizeof hello); // send only the text and its '\0'
    if (!out) return fail("making an SGE", out.error());
    if (auto r = channel->barrier(); !r) return fail("barrier (receives posted)", r.error());
    if (auto r = qp->send(/*wr_id=*/2, *out); !r) return fail("posting the send", r.error());
    std::cout << me << "posted a send: wr_id 2, " << sizeof hello << " bytes\n";
    auto n = cq->wait(wc, deadline);
    if (!n) return fail("waiting for the send", n.error());
    if (*n != 1 || wc[0].is_recv() || wc[0].wr_id() != 2) {
      std::cerr << "FAILED: expected the completion of send 2\n";
      return 1;
    }
    std::cout << me << "completion: wr_id 2, send: the device is done with the buffer\n";
  }
  // Both done before either tears down (a QP destroyed early looks like a lost peer).
  if (auto r = channel->barrier(); !r) return fail("final barrier", r.error());
  return 0;
}

int main(int argc, char** argv) {
  bool local = false, bad = false;
  std::string profile = "thunderbolt";
  std::size_t receive_bytes = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--local") local = true;
    else if (a == "--profile" && i + 1 < argc) profile = argv[++i];
    else if (a == "--receive-bytes" && i + 1 < argc) receive_bytes = std::strtoul(argv[++i], nullptr, 10);
    else bad = true;
  }
  if (bad || (profile != "thunderbolt" && profile != "rdma-core-rc") || receive_bytes < 18 || receive_bytes > (1u << 24)) {
    std::cerr << "usage: tutorial_02_send_recv [--local [--profile thunderbolt|rdma-core-rc]] [--receive-bytes 18..16777216]\n";
    return 2;
  }
  if (local) return tutorial::run_local(2, {"--receive-bytes", std::to_string(receive_bytes)}, profile);
  auto job = tutorial::Job::from_env();
  return job ? run_rank(*job, receive_bytes) : 2;
}
