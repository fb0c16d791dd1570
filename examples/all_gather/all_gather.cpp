// examples/all_gather: a new collective written over tbverbs Links, in one file. A ring
// all_gather: rank r contributes block r (`--bytes` bytes); after n - 1 steps every rank holds all n
// blocks, block b at offset b * bytes. At step s a rank sends to its right neighbour the block it
// received at step s - 1 (its own at step 0), and receives block (r - s - 1) mod n from its left
// neighbour straight into its final place: no scratch, no copies.
//
//   all_gather --local N [--bytes B]   N ranks of itself on the emulated fabric (tbverbs-emu run)
//   all_gather [--bytes B]             one rank from a launcher's environment: JACCL_RANK (or RANK, ...),
//                                      JACCL_COORDINATOR (or MASTER_ADDR/PORT), JACCL_IBV_DEVICES
// The collectives layer (tbverbs/collective.hpp) has a tuned all_gather; this shows how one is made.
#include <tbverbs/collective/device_file.hpp>
#include <tbverbs/collective/launcher.hpp>
#include <tbverbs/link.hpp>
#include <tbverbs/side_channel.hpp>
#include <tbverbs/sizes.hpp>
#include <tbverbs/tbverbs.hpp>

#include "../ring_all_sum/launcher.hpp" // --local N

#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

using namespace tbverbs;

namespace {
int fail_with(int rank, const std::string& step, const Error& e) {
  std::cerr << "rank " << rank << ": " << step << ": " << e << "\n";
  return 1;
}
std::byte pattern(std::size_t block, std::size_t i) { return std::byte((block * 131 + i) & 0xff); }

int run_rank(std::size_t bytes) {
  // 1. Who we are, where rank 0 is, which device faces which neighbour.
  std::string problem;
  auto job = launcher_job(problem);
  const char* devices = std::getenv("JACCL_IBV_DEVICES");
  if (!job || !job->rank || job->coordinator.empty() || devices == nullptr) {
    std::cerr << "all_gather: " << (job ? "set a rank, a coordinator and JACCL_IBV_DEVICES" : problem) << "\n";
    return 2;
  }
  const int rank = *job->rank;
  std::ifstream file(devices);
  std::stringstream text;
  text << file.rdbuf();
  auto cables = parse_device_file(text.str(), rank, problem);
  if (!cables || cables->left.empty() || cables->right.empty()) {
    std::cerr << "all_gather: " << devices << ": " << (cables ? "no cable to a neighbour" : problem) << "\n";
    return 2;
  }
  const int n = cables->ranks, left = (rank + n - 1) % n, right = (rank + 1) % n;

  // 2. The side channel: rendezvous, barriers, "receives posted", a dead peer noticed.
  SideChannelOptions sco;
  sco.rank = rank;
  sco.size = n;
  sco.coordinator = job->coordinator;
  const char* job_id = std::getenv("TBVERBS_JOB_ID");
  auto token = job_token_from_env("tbverbs all_gather " + job->coordinator + (job_id ? job_id : "")); // TBVERBS_JOB_SECRET
  if (!token) return fail_with(rank, "the job's secret", token.error());
  sco.job_token = token->token;
  sco.secret_token = token->secret;
  auto sc = SideChannel::connect(sco);
  if (!sc) return fail_with(rank, "side-channel rendezvous", sc.error());

  // 3. Per side (0 left, 1 right): device, GID, PD, the whole buffer registered, a link spec.
  auto lib = Library::load();
  if (!lib) return fail_with(rank, "loading verbs", lib.error());
  auto buffer = AlignedBuffer::allocate(static_cast<std::size_t>(n) * bytes);
  if (!buffer) return fail_with(rank, "allocating", buffer.error());
  std::array<std::optional<Context>, 2> ctx;
  std::array<std::optional<ProtectionDomain>, 2> pd;
  std::array<std::optional<MemoryRegion>, 2> mr;
  std::array<LinkSpec, 2> specs;
  // Depth in 4 KiB frames: every receive of the all_gather is posted up front.
  const auto frames = static_cast<std::uint32_t>((bytes + 4095) / 4096 * static_cast<std::size_t>(n));
  for (int s = 0; s < 2; ++s) {
    const std::string& name = s == 0 ? cables->left[0] : cables->right[0];
    auto c = Context::open(*lib, name);
    if (!c) return fail_with(rank, "opening " + name, c.error());
    ctx[s].emplace(std::move(*c));
    auto table = ctx[s]->gid_table(1); // a fresh snapshot: the IPv4-mapped entry may be new
    if (!table) return fail_with(rank, "GID table of " + name, table.error());
    auto gid = table->select();
    if (!gid) return fail_with(rank, "GID of " + name, gid.error());
    auto p = ctx[s]->alloc_pd();
    if (!p) return fail_with(rank, "PD on " + name, p.error());
    pd[s].emplace(std::move(*p));
    auto m = pd[s]->reg_mr(*buffer); // above max_mr_size (16 MB on Thunderbolt): a MemoryRegionSet
    if (!m) return fail_with(rank, "registering on " + name, m.error());
    mr[s].emplace(std::move(*m));
    specs[s].peer = s == 0 ? left : right;
    specs[s].id = static_cast<std::uint32_t>(s == 0 ? left : rank); // a cable: its left end's rank
    specs[s].context = &*ctx[s];
    specs[s].pd = &*pd[s];
    specs[s].recipe.emplace(QpRecipe::for_platform(ctx[s]->platform(), *gid));
    specs[s].recipe->capacities({frames, frames, 1, 1, 0});
  }

  // 4. Links: connected, and warmed up both ways with a message of the block's size.
  LinkMailbox mailbox(*sc);
  LinkOptions lo;
  lo.warmup_bytes = (bytes + 4095) / 4096 * 4096;
  auto links = connect_links(mailbox, specs, lo);
  if (!links) return fail_with(rank, "connecting the links", links.error());
  Link& from_left = (*links)[0];
  Link& to_right = (*links)[1];
  if (bytes > to_right.max_message_bytes() || bytes > from_left.max_message_bytes()) {
    std::cerr << "rank " << rank << ": a block is one message here: at most " << to_right.max_message_bytes()
              << " bytes on these links\n";
    return 2;
  }

  // 5. The all_gather. Own block in place; every receive posted before anyone sends (a send that
  //    meets an empty receive queue is lost or fatal on Apple's driver, docs/field-reports.md).
  auto block = [&](int b) { return static_cast<std::size_t>((b % n + n) % n); };
  for (std::size_t i = 0; i < bytes; ++i) buffer->data()[block(rank) * bytes + i] = pattern(block(rank), i);
  for (int s = 0; s < n - 1; ++s) {
    auto sge = mr[0]->sge(block(rank - s - 1) * bytes, bytes);
    if (!sge) return fail_with(rank, "receive SGE", sge.error());
    if (auto r = from_left.qp().recv(static_cast<std::uint64_t>(s), *sge); !r) return fail_with(rank, "posting a receive", r.error());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  if (auto r = receives_posted(mailbox, *links, 1, deadline); !r) return fail_with(rank, "receives posted", r.error());
  const auto t0 = std::chrono::steady_clock::now();
  int sent = 0, sends_done = 0, received = 0;
  auto send_next = [&]() -> Result<void> { // step `sent`: the block received at the step before
    auto sge = mr[1]->sge(block(rank - sent) * bytes, bytes);
    if (!sge) return fail(sge.error());
    if (auto r = to_right.qp().send(static_cast<std::uint64_t>(sent), *sge); !r) return fail(r.error());
    ++sent;
    return {};
  };
  if (auto r = send_next(); !r) return fail_with(rank, "sending step 0", r.error());
  Link* both[2] = {&from_left, &to_right};
  WorkCompletion wc[16];
  while (received < n - 1 || sends_done < n - 1) {
    std::size_t which = 0;
    auto got = wait_any(both, wc, which, deadline); // polls (Apple) or sleeps on channels (rdma-core)
    if (!got) return fail_with(rank, "waiting for completions", got.error());
    if (*got == 0) return fail_with(rank, "the all_gather", Error::make(Step::wait_cq, ErrorKind::timeout, "no completion in 30 s"));
    for (std::size_t i = 0; i < *got; ++i) {
      if (!wc[i].is_recv()) {
        ++sends_done;
        continue;
      }
      if (wc[i].wr_id() != static_cast<std::uint64_t>(received) || wc[i].byte_len() != bytes) {
        std::cerr << "rank " << rank << ": step " << received << ": got message " << wc[i].wr_id() << " of "
                  << wc[i].byte_len() << " bytes\n";
        return 1;
      }
      ++received; // block (rank - received) is here: it is what the next step sends
      if (sent < n - 1)
        if (auto r = send_next(); !r) return fail_with(rank, "sending step " + std::to_string(sent), r.error());
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  // 6. Every block must be its rank's pattern.
  for (int b = 0; b < n; ++b)
    for (std::size_t i = 0; i < bytes; ++i)
      if (buffer->data()[static_cast<std::size_t>(b) * bytes + i] != pattern(static_cast<std::size_t>(b), i)) {
        std::cerr << "rank " << rank << ": block " << b << " wrong at byte " << i << "\n";
        return 1;
      }
  std::printf("rank %d: all_gather of %d x %zu bytes verified in %.0f us\n", rank, n, bytes, us);
  if (auto r = sc->barrier(); !r) return fail_with(rank, "final barrier", r.error()); // all done: tear down
  return 0;
}
} // namespace

int main(int argc, char** argv) {
  std::size_t bytes = 64 * 1024;
  int local = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() { return i + 1 < argc ? parse_size(argv[++i], std::uint64_t{1} << 30) : std::nullopt; };
    if (a == "--bytes") bytes = static_cast<std::size_t>(value().value_or(0));
    else if (a == "--local") local = static_cast<int>(value().value_or(0));
    else bytes = 0;
    if (bytes == 0 || local < 0 || local > 64) {
      std::cerr << "usage: all_gather [--local N (2 to 64)] [--bytes B (1 to 1G)]\n";
      return 2;
    }
  }
  if (local == 0) return run_rank(bytes);
  ring::LocalOptions lo;
  lo.ranks = local;
  lo.args = {"--bytes", std::to_string(bytes)};
  return ring::run_local(lo);
}
