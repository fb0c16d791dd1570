// Tutorial chapter 5 (docs/tutorial/05-ring-by-hand.md): a ring all_sum written by hand over
// tbverbs Links.
//
//   tutorial_05_ring_by_hand --local N [--count C] [--quirk NAME=VALUE]
//                           N ranks (2..16) on N emulated Macs in a ring; --quirk: a reading of
//                           Apple's driver the emulator plays (docs/emulator.md, Quirks)
//   tutorial_05_ring_by_hand [--count C]             one rank, from a launcher's environment
//
// Every rank holds a vector of N chunks of C floats; afterwards every rank holds the element-wise
// sum over all ranks. Each rank talks only to its two neighbours, over one cable each: it
// receives from the left and sends to the right. Two phases of N - 1 steps:
//   reduce-scatter: at step s, send chunk (rank - s) to the right; receive chunk (rank - s - 1)
//                   from the left and add it into ours. After N - 1 steps chunk (rank + 1) holds
//                   the sum of every rank's copy.
//   all-gather:     at step s, send chunk (rank + 1 - s), the finished one, to the right; receive
//                   finished chunk (rank - s) from the left straight into its place.
// A Link (tbverbs/link.hpp) is a queue pair to one neighbour that connect_links() has connected
// and tested in both directions with a full-size message; it retries with a fresh QP if not.
#include "tutorial.hpp"

#include <tbverbs/link.hpp>

#include <array>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

using namespace tbverbs;
using tutorial::fail;

static int run_rank(const tutorial::Job& job, std::size_t count) {
  const int rank = job.rank, n = job.size, left = (rank + n - 1) % n, right = (rank + 1) % n;
  const std::size_t chunk_bytes = count * sizeof(float);
  auto channel = SideChannel::connect(job.side_channel());
  if (!channel) return fail("side channel", channel.error());

  // Memory: the N chunks, then N - 1 slots the reduce-scatter receives into before adding.
  auto buffer = AlignedBuffer::allocate((2 * static_cast<std::size_t>(n) - 1) * chunk_bytes);
  if (!buffer) return fail("allocating", buffer.error());
  float* data = reinterpret_cast<float*>(buffer->data());
  auto chunk = [&](int k) { return static_cast<std::size_t>((k % n + n) % n) * count; }; // first element
  auto slot = [&](int s) { return static_cast<std::size_t>(n + s) * count; };
  for (std::size_t i = 0; i < static_cast<std::size_t>(n) * count; ++i) data[i] = float(rank + 1 + int(i % 5));

  // One device per neighbour (side 0: the left cable, side 1: the right one), the buffer
  // registered on each, and a LinkSpec that says who is at the other end.
  auto lib = Library::load();
  if (!lib) return fail("loading the verbs library", lib.error());
  std::array<std::optional<Context>, 2> ctx;
  std::array<std::optional<ProtectionDomain>, 2> pd;
  std::array<std::optional<MemoryRegion>, 2> mr;
  std::array<LinkSpec, 2> specs;
  const std::uint32_t frames = static_cast<std::uint32_t>(2 * (n - 1) * ((chunk_bytes + 4095) / 4096));
  for (int s = 0; s < 2; ++s) {
    auto c = Context::open(*lib, s == 0 ? job.left_device : job.right_device);
    if (!c) return fail("opening the device", c.error());
    ctx[s].emplace(std::move(*c));
    auto table = ctx[s]->gid_table(1);
    if (!table) return fail("reading the GID table", table.error());
    auto gid = table->select();
    if (!gid) return fail("selecting a GID", gid.error());
    auto p = ctx[s]->alloc_pd();
    if (!p) return fail("allocating a protection domain", p.error());
    pd[s].emplace(std::move(*p));
    auto m = pd[s]->reg_mr(*buffer);
    if (!m) return fail("registering memory", m.error());
    mr[s].emplace(std::move(*m));
    specs[s].peer = s == 0 ? left : right;
    specs[s].id = static_cast<std::uint32_t>(s == 0 ? left : rank); // a cable is named by its left end
    specs[s].context = &*ctx[s];
    specs[s].pd = &*pd[s];
    specs[s].recipe.emplace(QpRecipe::for_platform(ctx[s]->platform(), *gid));
    specs[s].recipe->capacities({frames, frames, 1, 1, 0}); // every receive is posted up front
  }
  LinkMailbox mailbox(*channel); // link set-up messages travel over the side channel
  LinkOptions lo;
  lo.warmup_bytes = (chunk_bytes + 4095) / 4096 * 4096;
  auto links = connect_links(mailbox, specs, lo);
  if (!links) return fail("connecting the links", links.error());
  Link& from_left = (*links)[0];
  Link& to_right = (*links)[1];
  if (chunk_bytes > to_right.max_message_bytes() || chunk_bytes > from_left.max_message_bytes()) {
    std::cerr << "FAILED: a chunk (" << chunk_bytes << " bytes) is one message, and these links carry at most "
              << to_right.max_message_bytes() << " (the warm-up saw nothing larger arrive): use a smaller --count\n";
    return 1;
  }

  // Every receive of both phases, in the order the messages will come (a queue pair keeps order).
  for (int s = 0; s < 2 * (n - 1); ++s) {
    auto sge = mr[0]->sge((s < n - 1 ? slot(s) : chunk(rank - (s - (n - 1)))) * sizeof(float), chunk_bytes);
    if (!sge) return fail("making an SGE", sge.error());
    if (auto r = from_left.qp().recv(static_cast<std::uint64_t>(s), *sge); !r) return fail("posting a receive", r.error());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  if (auto r = receives_posted(mailbox, *links, 1, deadline); !r) return fail("receives posted", r.error());

  const auto t0 = std::chrono::steady_clock::now();
  int sent = 0, sends_done = 0, received = 0;
  auto send_chunk = [&](int k) -> Result<void> { // message number `sent` carries chunk k
    auto sge = mr[1]->sge(chunk(k) * sizeof(float), chunk_bytes);
    if (!sge) return fail(sge.error());
    return to_right.qp().send(static_cast<std::uint64_t>(sent++), *sge);
  };
  if (auto r = send_chunk(rank); !r) return fail("sending reduce-scatter step 0", r.error());
  Link* both[2] = {&from_left, &to_right};
  WorkCompletion wc[16];
  while (received < 2 * (n - 1) || sends_done < 2 * (n - 1)) {
    std::size_t which = 0;
    auto got = wait_any(both, wc, which, deadline); // whichever link has completions
    if (!got) return fail("waiting for completions", got.error());
    if (*got == 0) return fail("the all_sum", Error::make(Step::wait_cq, ErrorKind::timeout, "no completion in 30 s"));
    for (std::size_t i = 0; i < *got; ++i) {
      if (!wc[i].is_recv()) { // a send is done: its buffer may be reused
        ++sends_done;
        continue;
      }
      const int s = received++; // message s from the left has landed
      Result<void> r;
      if (s < n - 1) { // reduce-scatter step s: add it into chunk (rank - s - 1), pass that on
        for (std::size_t e = 0; e < count; ++e) data[chunk(rank - s - 1) + e] += data[slot(s) + e];
        r = send_chunk(rank - s - 1); // at the last step that is chunk rank + 1: all-gather step 0
      } else if (s - (n - 1) < n - 2) { // all-gather step j: chunk (rank - j) is final, pass it on
        r = send_chunk(rank - (s - (n - 1)));
      }
      if (!r) return fail("sending step " + std::to_string(sent), r.error());
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  // Every element must be the sum over ranks r of (r + 1 + i % 5).
  for (std::size_t i = 0; i < static_cast<std::size_t>(n) * count; ++i) {
    const float want = float(n * (n + 1) / 2 + n * int(i % 5));
    if (data[i] != want) return std::cerr << "FAILED: element " << i << " is " << data[i] << ", not " << want << "\n", 1;
  }
  std::cout << "rank " << rank << ": all_sum of " << n << " x " << count << " floats verified in " << int(us)
            << " us: data[0] = " << data[0] << ", data[" << n * count - 1 << "] = " << data[n * count - 1]
            << " (" << sent << " messages sent, " << received << " received)\n";
  if (auto r = channel->barrier(); !r) return fail("final barrier", r.error()); // all done: tear down
  return 0;
}

int main(int argc, char** argv) {
  int local = 0;
  std::vector<std::string> quirks; // --local: readings of Apple's driver the emulator plays
  std::size_t count = 1024; // 1024 floats: one 4 KiB frame per message
  bool bad = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--local" && i + 1 < argc) local = std::atoi(argv[++i]);
    else if (a == "--quirk" && i + 1 < argc) quirks.push_back(argv[++i]);
    else if (a == "--count" && i + 1 < argc) count = std::strtoul(argv[++i], nullptr, 10);
    else bad = true;
  }
  if (bad || (local != 0 && (local < 2 || local > 16)) || count == 0 || count > (1u << 20)) {
    std::cerr << "usage: tutorial_05_ring_by_hand [--local N (2..16) [--quirk NAME=VALUE]] [--count C (1..1048576 floats per chunk)]\n";
    return 2;
  }
  if (local != 0) return tutorial::run_local(local, {"--count", std::to_string(count)}, "thunderbolt", quirks);
  auto job = tutorial::Job::from_env();
  return job ? run_rank(*job, count) : 2;
}
