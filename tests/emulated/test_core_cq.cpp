// Core library: completion waits on the emulated fabric with completion channels off (the
// Thunderbolt profile's default, TN3205's "the caller must poll") and on (quirk
// completion_channels=on), channel verbs refused by fault injection, and wait_any over links.
#include "emu_fixture.hpp"

#include <tbverbs/link.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <future>
#include <string>
#include <thread>

using namespace emu_test;
using namespace std::chrono_literals;
using Catch::Matchers::ContainsSubstring;
using Clock = std::chrono::steady_clock;

namespace {

PortSpec host_a(const char* dev = "rdma_en1") { return {"hostA", dev, "10.99.0.1/30"}; }
PortSpec host_b(const char* dev = "rdma_en1") { return {"hostB", dev, "10.99.0.2/30"}; }

/// Silences the library's one-time stderr notice and forgets earlier ones, for the test's span.
struct QuietNotices {
  tbverbs::NoticeHandler old = tbverbs::set_notice_handler(nullptr);
  QuietNotices() { tbverbs::reset_notices(); }
  ~QuietNotices() {
    tbverbs::set_notice_handler(old);
    tbverbs::reset_notices();
  }
};

/// Sends one 64-byte message from `b` to a QP of `a` whose CQ is `cq`, and waits for it there.
void message_arrives_on(Side& a, Side& b, tbverbs::CompletionQueue& cq) {
  tbverbs::PreparedQueuePair pa = ok(tbverbs::QpRecipe::thunderbolt(a.select()).prepare(a.pd, cq));
  tbverbs::PreparedQueuePair pb = ok(tbverbs::QpRecipe::thunderbolt(b.select()).prepare(b.pd, b.cq));
  const tbverbs::Endpoint ea = pa.endpoint(), eb = pb.endpoint();
  tbverbs::QueuePair qa = ok(std::move(pa).connect(eb));
  tbverbs::QueuePair qb = ok(std::move(pb).connect(ea));
  ok(qa.recv(11, ok(a.mr.sge(0, 64))));
  ok(qb.send(12, ok(b.mr.sge(0, 64))));
  const tbverbs::WorkCompletion wc = wait_one(cq);
  CHECK(wc.wr_id() == 11);
  CHECK(wc.byte_len() == 64);
}

} // namespace

TEST_CASE("core/cq: channels off (the Thunderbolt default): CQs poll, one that asks for a channel notes "
          "EOPNOTSUPP, and data flows",
          "[core][cq][channel]") {
  QuietNotices quiet;
  EnvGuard quirk("TBVERBS_EMU_QUIRKS", "completion_channels=off");
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  CHECK_FALSE(a.cq.has_channel()); // Apple: no channel unless asked
  CHECK_FALSE(a.cq.channel_note());

  tbverbs::CompletionQueue asked = ok(a.ctx.create_cq(64, tbverbs::CqWait::channel));
  CHECK_FALSE(asked.has_channel());
  CHECK(asked.channel_fd() == -1);
  REQUIRE(asked.channel_note());
  const tbverbs::Error& why = *asked.channel_note();
  CHECK(why.step == tbverbs::Step::create_comp_channel);
  CHECK(why.is(EOPNOTSUPP));
  CHECK(why.device.view() == "rdma_en1");
  REQUIRE(why.diagnosis() != nullptr);
  CHECK(why.diagnosis()->id == "completion-channel-unsupported");
  CHECK_THAT(why.message(), ContainsSubstring("the caller must poll"));
  CHECK(tbverbs::notice_given(tbverbs::Notice::completion_channel_fallback));

  message_arrives_on(a, b, asked);
  // A wait with nothing to come ends at its deadline, not before and not long after.
  tbverbs::WorkCompletion wc[2];
  const auto t0 = Clock::now();
  CHECK(err(asked.wait(wc, t0 + 50ms)).kind == tbverbs::ErrorKind::timeout);
  CHECK(Clock::now() - t0 >= 50ms);
  CHECK(Clock::now() - t0 < 1s);
}

TEST_CASE("core/cq: channels on (quirk): a CQ that asks for one sleeps on it, the default still polls on Apple",
          "[core][cq][channel]") {
  QuietNotices quiet;
  EnvGuard quirk("TBVERBS_EMU_QUIRKS", "completion_channels=on");
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  CHECK_FALSE(a.cq.has_channel());
  tbverbs::CompletionQueue asked = ok(a.ctx.create_cq(64, tbverbs::CqWait::channel));
  CHECK(asked.has_channel());
  CHECK(asked.channel_fd() >= 0);
  CHECK_FALSE(asked.channel_note());
  message_arrives_on(a, b, asked);
  CHECK(asked.has_channel());
  tbverbs::WorkCompletion wc[2];
  const auto t0 = Clock::now();
  CHECK(err(asked.wait(wc, t0 + 50ms)).kind == tbverbs::ErrorKind::timeout);
  CHECK(Clock::now() - t0 < 1s);
  CHECK_FALSE(tbverbs::notice_given(tbverbs::Notice::completion_channel_fallback));
}

TEST_CASE("core/cq: injected channel failures (create_comp_channel, req_notify_cq) fall back to polling",
          "[core][cq][channel]") {
  QuietNotices quiet;
  EnvGuard quirk("TBVERBS_EMU_QUIRKS", "completion_channels=on");
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  SECTION("ibv_create_comp_channel ENOMEM") {
    fabric.fail_call(fabric.a().host, "ibv_create_comp_channel", ENOMEM, 10);
    tbverbs::CompletionQueue cq = ok(a.ctx.create_cq(64, tbverbs::CqWait::channel));
    CHECK_FALSE(cq.has_channel());
    REQUIRE(cq.channel_note());
    CHECK(cq.channel_note()->step == tbverbs::Step::create_comp_channel);
    CHECK(cq.channel_note()->is(ENOMEM));
    message_arrives_on(a, b, cq);
  }
  SECTION("ibv_req_notify_cq EOPNOTSUPP") {
    fabric.fail_call(fabric.a().host, "ibv_req_notify_cq", EOPNOTSUPP, 10);
    tbverbs::CompletionQueue cq = ok(a.ctx.create_cq(64, tbverbs::CqWait::channel));
    CHECK_FALSE(cq.has_channel());
    REQUIRE(cq.channel_note());
    CHECK(cq.channel_note()->step == tbverbs::Step::req_notify_cq);
    CHECK(cq.channel_note()->is(EOPNOTSUPP));
    CHECK(cq.channel_note()->diagnosis()->id == "completion-channel-unsupported");
    message_arrives_on(a, b, cq);
  }
  CHECK(tbverbs::notice_given(tbverbs::Notice::completion_channel_fallback));
}

TEST_CASE("core/cq: wait_any over connected links gets a late message and ends at its deadline, with channels "
          "off and on",
          "[core][cq][link]") {
  QuietNotices quiet;
  struct Case {
    const char* profile;
    const char* device;
    const char* quirks;
    bool channels; // whether connect_links' default CQs sleep on a channel
  };
  for (const Case c : {Case{"thunderbolt", "rdma_en1", "completion_channels=off", false},
                       Case{"thunderbolt", "rdma_en1", "completion_channels=on", false},
                       Case{"rdma-core-rc", "emu0", "", true}}) {
    INFO("profile " << c.profile << " quirks '" << c.quirks << "'");
    EnvGuard quirk("TBVERBS_EMU_QUIRKS", c.quirks);
    Fabric fabric(host_a(c.device), host_b(c.device), c.profile);
    // Both ranks' devices are opened here (the host is read when devices are listed); each rank
    // then runs in its own thread.
    fabric.use(fabric.a().host);
    const tbverbs::Library lib = emulator();
    tbverbs::Context ctx_a = ok(tbverbs::Context::open(lib, c.device));
    fabric.use(fabric.b().host);
    tbverbs::Context ctx_b = ok(tbverbs::Context::open(lib, c.device));
    tbverbs::ProtectionDomain pd_a = ok(ctx_a.alloc_pd()), pd_b = ok(ctx_b.alloc_pd());
    tbverbs::AlignedBuffer buf_a = ok(tbverbs::AlignedBuffer::allocate(4096));
    tbverbs::AlignedBuffer buf_b = ok(tbverbs::AlignedBuffer::allocate(4096));
    tbverbs::MemoryRegion mr_a = ok(pd_a.reg_mr(buf_a)), mr_b = ok(pd_b.reg_mr(buf_b));
    const tbverbs::GidSelection gid_a = ok(ok(ctx_a.gid_table(1)).select());
    const tbverbs::GidSelection gid_b = ok(ok(ctx_b.gid_table(1)).select());

    std::promise<std::uint16_t> port_promise;
    auto port = port_promise.get_future();
    auto options = [](int rank) {
      tbverbs::SideChannelOptions o;
      o.rank = rank;
      o.size = 2;
      o.job_token = 0x5eedc0ffee;
      o.timeout = 20s;
      return o;
    };
    std::string failure[2];
    std::atomic<bool> ready{false};
    auto rank = [&](int r) {
      tbverbs::SideChannelOptions o = options(r);
      if (r == 0) {
        o.coordinator = "127.0.0.1:0";
        o.on_listening = [&](std::uint16_t p) { port_promise.set_value(p); };
      } else {
        o.coordinator = "127.0.0.1:" + std::to_string(port.get());
      }
      auto sc = tbverbs::SideChannel::connect(o);
      if (!sc) return failure[r] = sc.error().message(), void();
      tbverbs::LinkMailbox mailbox(*sc);
      const tbverbs::Context& ctx = r == 0 ? ctx_a : ctx_b;
      tbverbs::LinkSpec spec;
      spec.peer = 1 - r;
      spec.id = 0;
      spec.context = &ctx;
      spec.pd = r == 0 ? &pd_a : &pd_b;
      spec.recipe = tbverbs::QpRecipe::for_platform(ctx.platform(), r == 0 ? gid_a : gid_b);
      tbverbs::LinkOptions lo;
      lo.warmup_bytes = 4096;
      auto links = tbverbs::connect_links(mailbox, std::span(&spec, 1), lo);
      if (!links) return failure[r] = links.error().message(), void();
      tbverbs::Link& link = links->front();
      if (link.cq().has_channel() != c.channels) failure[r] = "unexpected CQ wait mode";
      const tbverbs::MemoryRegion& mr = r == 0 ? mr_a : mr_b;
      tbverbs::WorkCompletion wc[4];
      tbverbs::Link* one[1] = {&link};
      std::size_t which = 99;
      const auto dl = Clock::now() + 10s;
      if (r == 0) {
        // Nothing to come yet: wait_any returns 0 at its deadline, not long after.
        const auto t0 = Clock::now();
        auto none = tbverbs::wait_any(one, wc, which, t0 + 30ms);
        const auto took = Clock::now() - t0;
        if (!none || *none != 0 || took < 30ms || took > 1s) failure[r] = "an idle wait_any did not end at its deadline";
        if (auto p = link.qp().recv(1, *mr.sge(0, 64)); !p) return failure[r] = p.error().message(), void();
        // The barrier over the same pointers wait_any takes (issue 18, finding 6: one span type serves both).
        if (auto b = tbverbs::receives_posted(mailbox, one, 1, dl); !b) return failure[r] = b.error().message(), void();
        // The peer sends about 30 ms from now: wait_any has to poll (or sleep) until then.
        auto got = tbverbs::wait_any(one, wc, which, Clock::now() + 5s);
        if (!got) return failure[r] = got.error().message(), void();
        if (*got != 1 || which != 0 || wc[0].wr_id() != 1 || wc[0].byte_len() != 64)
          failure[r] = "wait_any returned the wrong completion";
      } else {
        if (auto b = tbverbs::receives_posted(mailbox, *links, 1, dl); !b) return failure[r] = b.error().message(), void();
        std::this_thread::sleep_for(30ms);
        if (auto s = link.qp().send(2, *mr.sge(0, 64)); !s) return failure[r] = s.error().message(), void();
        // And wait_any over the links as connect_links returned them, the span receives_posted takes.
        auto got = tbverbs::wait_any(*links, wc, which, Clock::now() + 5s);
        if (!got || *got != 1 || wc[0].wr_id() != 2) failure[r] = "the send did not complete";
      }
      // Both stay until both are done, so no QP goes away under a message in flight.
      if (auto b = sc->barrier(); !b) failure[r] += b.error().message();
      ready = true;
    };
    auto t1 = std::async(std::launch::async, rank, 1);
    rank(0);
    t1.get();
    CHECK(failure[0] == "");
    CHECK(failure[1] == "");
    CHECK(ready);
  }
}

TEST_CASE("core/cq: CompletionQueue::wait_any names the CQ that got the completion, and returns 0 at the deadline",
          "[core][cq][wait_any]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  fabric.use(fabric.a().host);
  tbverbs::CompletionQueue idle = ok(a.ctx.create_cq(16));
  Pair p = connect(a, b, [](const tbverbs::GidSelection& g) { return tbverbs::QpRecipe::thunderbolt(g); });
  tbverbs::CompletionQueue* cqs[] = {&idle, &a.cq};
  tbverbs::WorkCompletion wc[4];
  std::size_t which = 99;

  const auto t0 = Clock::now();
  CHECK(ok(tbverbs::CompletionQueue::wait_any(cqs, wc, which, t0 + 50ms)) == 0);
  CHECK(Clock::now() - t0 >= 50ms);

  ok(p.a.recv(71, ok(a.mr.sge(0, 64))));
  ok(p.b.send(72, ok(b.mr.sge(0, 64))));
  REQUIRE(ok(tbverbs::CompletionQueue::wait_any(cqs, wc, which, Clock::now() + 5s)) == 1);
  CHECK(which == 1);
  CHECK(wc[0].wr_id() == 71);

  const tbverbs::Error none = err(tbverbs::CompletionQueue::wait_any({}, wc, which, Clock::now()));
  CHECK(none.kind == tbverbs::ErrorKind::invalid_argument);
}
