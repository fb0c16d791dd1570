// Tutorial chapter 3 (docs/tutorial/03-what-goes-wrong.md): three classic mistakes, each shown
// with what the emulated device does and what tbverbs reports.
//
//   tutorial_03_what_goes_wrong --local early-send [--quirk empty_rq=wait|drop|kill] [--profile rdma-core-rc]
//   tutorial_03_what_goes_wrong --local wrong-gid
//   tutorial_03_what_goes_wrong --local deregistered [--profile rdma-core-rc]
//
//   early-send    rank 1 sends before rank 0 has posted a receive, then once more the right way
//   wrong-gid     a GID index that names the wrong entry, then an address that changes between
//                 choosing the GID and connecting
//   deregistered  rank 1 sends from memory it has just deregistered
//
// Each rank prints what it saw; a rank exits 0 when that is what the emulator documents for the
// profile and quirk in use (docs/emulator.md), 1 otherwise.
#include "tutorial.hpp"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

using namespace tbverbs;
using tutorial::fail;

namespace {
struct Options {
  std::string scenario, quirk = "empty_rq=wait", profile = "thunderbolt";
};

// Chapter 2's set-up, kept in one struct: every handle the scenarios use.
struct Pair {
  std::optional<SideChannel> channel;
  std::optional<Library> lib;
  std::optional<Context> ctx;
  std::optional<GidTable> table;
  std::optional<ProtectionDomain> pd;
  std::optional<AlignedBuffer> buf;
  std::optional<MemoryRegion> mr;
  std::optional<CompletionQueue> cq;
  std::optional<PreparedQueuePair> prepared;
  std::optional<Endpoint> remote;
  std::optional<QueuePair> qp;
};

// `into` = the value of `expr`, or return fail(step, its error): the set-up below is twelve steps.
#define TRY(step, expr, into)                  \
  do {                                         \
    auto r_ = (expr);                          \
    if (!r_) return fail(step, r_.error());    \
    (into).emplace(std::move(*r_));            \
  } while (0)

// Up to the endpoint exchange; connecting is left to the scenario (wrong-gid fails there).
int prepare(const tutorial::Job& job, Pair& p) {
  TRY("side channel", SideChannel::connect(job.side_channel()), p.channel);
  TRY("loading the verbs library", Library::load(), p.lib);
  TRY("opening the device", Context::open(*p.lib, job.rank == 0 ? job.right_device : job.left_device), p.ctx);
  TRY("reading the GID table", p.ctx->gid_table(1), p.table);
  auto gid = p.table->select();
  if (!gid) return fail("selecting a GID", gid.error());
  TRY("allocating a protection domain", p.ctx->alloc_pd(), p.pd);
  TRY("allocating", AlignedBuffer::allocate(2 * 4096), p.buf); // two 4 KiB frames: two messages
  TRY("registering memory", p.pd->reg_mr(*p.buf, Access::local_write), p.mr);
  TRY("creating a completion queue", p.ctx->create_cq(8), p.cq);
  TRY("creating the queue pair", QpRecipe::for_platform(p.ctx->platform(), *gid).prepare(*p.pd, *p.cq), p.prepared);
  auto wires = p.channel->all_gather(p.prepared->endpoint().serialize());
  if (!wires) return fail("exchanging endpoints", wires.error());
  TRY("reading the peer's endpoint", Endpoint::parse((*wires)[static_cast<std::size_t>(1 - job.rank)]), p.remote);
  return 0;
}

// Receive frame `slot` (offset slot * 4096) as work request `slot`; send `text` from frame `slot`.
Result<void> recv_into(Pair& p, int slot) {
  auto sge = p.mr->sge(static_cast<std::size_t>(slot) * 4096, 4096);
  if (!sge) return fail(sge.error());
  return p.qp->recv(static_cast<std::uint64_t>(slot), *sge);
}
Result<void> send_text(Pair& p, int slot, const std::string& text) {
  std::memcpy(p.buf->data() + slot * 4096, text.c_str(), text.size() + 1);
  auto sge = p.mr->sge(static_cast<std::size_t>(slot) * 4096, text.size() + 1);
  if (!sge) return fail(sge.error());
  return p.qp->send(static_cast<std::uint64_t>(slot), *sge);
}
// Waits up to `ms` for one completion; prints it, or tbverbs' error. True when one came.
bool wait_one(Pair& p, int ms, const std::string& me) {
  WorkCompletion wc[1];
  auto n = p.cq->wait(wc, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms));
  if (!n) {
    std::cout << me << "no completion: " << n.error().message() << "\n";
    return false;
  }
  if (wc[0].is_recv())
    std::cout << me << "received \"" << reinterpret_cast<const char*>(p.buf->data() + wc[0].wr_id() * 4096)
              << "\" in receive " << wc[0].wr_id() << "\n";
  else
    std::cout << me << "send " << wc[0].wr_id() << " completed successfully\n";
  return true;
}

int early_send(const tutorial::Job& job, Pair& p, const Options& o, const std::string& me) {
  // What a message sent to an empty receive queue becomes (docs/emulator.md, Quirks): held until
  // a receive is posted (wait: Apple's TN3205), lost (drop), lost with the direction dead (kill:
  // ds4's report). RC on rdma-core retries after "receiver not ready" until the receive exists.
  const bool thunderbolt = o.profile == "thunderbolt";
  const bool first_arrives = !thunderbolt || o.quirk == "empty_rq=wait";
  const bool second_arrives = !thunderbolt || o.quirk != "empty_rq=kill";
  bool ok = true;
  if (job.rank == 1) {
    if (auto r = p.channel->barrier(); !r) return fail("barrier", r.error());
    if (auto r = send_text(p, 0, "early message"); !r) return fail("posting the early send", r.error());
    std::cout << me << "round 1: sent \"early message\" before rank 0 posted any receive\n";
    if (auto r = p.channel->barrier(); !r) return fail("barrier (sent)", r.error());
    ok = wait_one(p, 6000, me) && ok; // the sender's view: success whatever became of the message
    if (auto r = p.channel->barrier(); !r) return fail("barrier (round 2: receive posted)", r.error());
    if (auto r = send_text(p, 1, "second message"); !r) return fail("posting the second send", r.error());
    std::cout << me << "round 2: sent \"second message\" after rank 0 said its receive was posted\n";
    ok = wait_one(p, 6000, me) && ok;
  } else {
    if (auto r = p.channel->barrier(); !r) return fail("barrier", r.error());
    if (auto r = p.channel->barrier(); !r) return fail("barrier (sent)", r.error());
    if (auto r = recv_into(p, 0); !r) return fail("posting receive 0", r.error());
    std::cout << me << "round 1: posted receive 0 after the send\n";
    // A message that should arrive gets 5 s (a busy machine), one that should not 1 s.
    ok = wait_one(p, first_arrives ? 5000 : 1000, me) == first_arrives;
    if (auto r = recv_into(p, 1); !r) return fail("posting receive 1", r.error());
    std::cout << me << "round 2: posted receive 1, then told rank 1\n";
    if (auto r = p.channel->barrier(); !r) return fail("barrier (round 2: receive posted)", r.error());
    ok = wait_one(p, second_arrives ? 5000 : 1000, me) == second_arrives && ok;
    std::cout << me << (ok ? "as documented" : "FAILED: not what the emulator documents") << " for " << o.profile
              << (thunderbolt ? " with " + o.quirk : std::string()) << ": round 1 "
              << (first_arrives ? "delivered" : "lost") << ", round 2 " << (second_arrives ? "delivered" : "lost") << "\n";
  }
  if (auto r = p.channel->barrier(); !r) return fail("final barrier", r.error());
  return ok ? 0 : 1;
}

int wrong_gid(const tutorial::Job& job, Pair& p, const std::string& me) {
  bool ok = true;
  if (job.rank == 0) {
    // (a) An index that names the wrong entry: GID[0] is fe80::, as a program that takes "the
    //     first entry" (`-g 0` in many verbs examples) would. tbverbs checks the override.
    ::setenv("TBVERBS_GID_INDEX", "0", 1);
    auto forced = p.table->select();
    ::unsetenv("TBVERBS_GID_INDEX");
    if (forced) return std::cerr << "FAILED: GID index 0 was accepted\n", 1;
    std::cout << me << "(a) TBVERBS_GID_INDEX=0 refused: " << forced.error().message() << "\n";
    // (b) The address goes away after the GID was chosen (an interface reconfigured): the
    //     emulator's `tbverbs-emu clear-ipv4 HOST DEVICE`, here through its C API.
    auto clear = p.lib->symbol<int(const char*, const char*, const char*, int)>("tbemu_clear_ipv4", "TBVERBS_EMU_1.0");
    if (!clear) return fail("finding the emulator's control API", clear.error());
    if (int rc = (*clear)(nullptr, std::getenv("TBVERBS_EMU_HOST"), std::string(p.ctx->name()).c_str(), 1); rc != 0)
      return std::cerr << "FAILED: tbemu_clear_ipv4: " << std::strerror(rc) << "\n", 1;
    std::cout << me << "(b) removed the IPv4 address of " << p.ctx->name() << " after selecting its GID\n";
  }
  if (auto r = p.channel->barrier(); !r) return fail("barrier (address removed)", r.error());
  // Both connect now. Rank 0's selection is stale; rank 1 aims at a GID that no longer exists.
  auto qp = std::move(*p.prepared).connect(*p.remote);
  if (qp) {
    std::cout << me << "FAILED: connected although rank 0's address is gone\n";
    ok = false;
  } else {
    std::cout << me << "(b) connect refused: " << qp.error().message() << "\n";
    ok = job.rank == 0 ? qp.error().is(ErrorKind::gid_stale) : qp.error().is(ETIMEDOUT);
  }
  if (auto r = p.channel->barrier(); !r) return fail("final barrier", r.error());
  return ok ? 0 : 1;
}

int deregistered(const tutorial::Job& job, Pair& p, const std::string& me) {
  bool ok = true;
  if (job.rank == 0) {
    if (auto r = recv_into(p, 0); !r) return fail("posting the receive", r.error());
    if (auto r = p.channel->barrier(); !r) return fail("barrier (receive posted)", r.error());
    ok = !wait_one(p, 1000, me); // nothing may arrive
  } else {
    std::memcpy(p.buf->data(), "freed", 6);
    auto sge = p.mr->sge(0, 6); // an SGE is a plain copy of address, length and key...
    if (!sge) return fail("making an SGE", sge.error());
    if (auto r = p.mr->close(); !r) return fail("deregistering", r.error()); // ...that outlives its region
    std::cout << me << "deregistered the buffer, kept its SGE (lkey 0x" << std::hex << sge->lkey << std::dec << ")\n";
    if (auto r = p.channel->barrier(); !r) return fail("barrier (receive posted)", r.error());
    if (auto r = p.qp->send(0, *sge); !r) return fail("posting the send", r.error());
    std::cout << me << "posted the send: accepted (keys are checked when the device works on it)\n";
    WorkCompletion wc[1];
    auto n = p.cq->wait(wc, std::chrono::steady_clock::now() + std::chrono::seconds(3));
    if (n) return std::cerr << "FAILED: the send from deregistered memory succeeded\n", 1;
    std::cout << me << "the send failed: " << n.error().message() << "\n";
    ok = n.error().is(ErrorKind::wc_error) && wc_status_name(n.error().wc_status) == "IBV_WC_LOC_PROT_ERR";
  }
  if (auto r = p.channel->barrier(); !r) return fail("final barrier", r.error());
  return ok ? 0 : 1;
}

int run_rank(const tutorial::Job& job, const Options& o) {
  const std::string me = "rank " + std::to_string(job.rank) + ": ";
  Pair p;
  if (int rc = prepare(job, p); rc != 0) return rc;
  if (o.scenario == "wrong-gid") return wrong_gid(job, p, me);
  TRY("connecting", std::move(*p.prepared).connect(*p.remote), p.qp);
  return o.scenario == "early-send" ? early_send(job, p, o, me) : deregistered(job, p, me);
}
} // namespace

int main(int argc, char** argv) {
  Options o;
  bool local = false, bad = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--local") local = true;
    else if (a == "--quirk" && i + 1 < argc) o.quirk = argv[++i];
    else if (a == "--profile" && i + 1 < argc) o.profile = argv[++i];
    else if (o.scenario.empty()) o.scenario = a;
    else bad = true;
  }
  if (o.scenario != "early-send" && o.scenario != "wrong-gid" && o.scenario != "deregistered") bad = true;
  if (o.quirk != "empty_rq=wait" && o.quirk != "empty_rq=drop" && o.quirk != "empty_rq=kill") bad = true;
  if (o.profile != "thunderbolt" && o.profile != "rdma-core-rc") bad = true;
  if (o.scenario == "wrong-gid" && o.profile != "thunderbolt") bad = true; // its faults are Thunderbolt's
  if (bad) {
    std::cerr << "usage: tutorial_03_what_goes_wrong [--local] early-send|wrong-gid|deregistered\n"
                 "         [--quirk empty_rq=wait|drop|kill] [--profile thunderbolt|rdma-core-rc (not wrong-gid)]\n";
    return 2;
  }
  if (local) // the quirks are Apple's driver's: the rdma-core profile has none
    return tutorial::run_local(2, {o.scenario, "--quirk", o.quirk, "--profile", o.profile}, o.profile,
                               o.profile == "thunderbolt" ? std::vector<std::string>{o.quirk} : std::vector<std::string>{});
  auto job = tutorial::Job::from_env();
  return job ? run_rank(*job, o) : 2;
}
