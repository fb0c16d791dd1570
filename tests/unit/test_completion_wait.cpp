// Completion waits without channels (TN3205: "all queue pair operations are non-blocking and the
// caller must poll"), the one-time fallback notice, optional setup symbols, the Thunderbolt link
// layer and the QP budget, driven through the fake function table.
#include "fake_verbs.hpp"

#include <catch2/catch_test_macros.hpp>

#include <tbverbs/detail/backoff.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace tbverbs;
using namespace std::chrono_literals;
using fake::FakeVerbs;
using Clock = std::chrono::steady_clock;

namespace {

// Counts notices instead of printing them; restores the previous handler.
std::atomic<int> g_notices{0};
Notice g_last_notice{};
std::string g_last_cause;
void count_notice(Notice n, const Error& e) {
  ++g_notices;
  g_last_notice = n;
  g_last_cause = e.message();
}
struct CountNotices {
  NoticeHandler old;
  CountNotices() : old(set_notice_handler(&count_notice)) {
    reset_notices();
    g_notices = 0;
    g_last_cause.clear();
  }
  ~CountNotices() {
    set_notice_handler(old);
    reset_notices();
  }
};

Context open(FakeVerbs& f, const char* device) {
  f.device_names = {device};
  auto ctx = Context::open(f.library(), device);
  REQUIRE(ctx);
  return std::move(*ctx);
}

} // namespace

TEST_CASE("create_cq on Apple makes no channel unless asked: waits poll (TN3205)", "[cq][channel]") {
  CountNotices notices;
  FakeVerbs f;
  f.enable_channels();
  Context ctx = open(f, "rdma_en1");
  REQUIRE(ctx.platform() == Platform::apple);

  auto cq = ctx.create_cq(16);
  REQUIRE(cq);
  CHECK_FALSE(cq->has_channel());
  CHECK(cq->channel_fd() == -1);
  CHECK_FALSE(cq->channel_note()); // nothing was wanted, nothing to note
  CHECK(f.channel_creates == 0);
  CHECK(f.notifies == 0);
  CHECK(g_notices == 0);

  auto polled = ctx.create_cq(16, CqWait::poll);
  REQUIRE(polled);
  CHECK_FALSE(polled->has_channel());
  CHECK(f.channel_creates == 0);

  // Explicitly asked for, where it works: a channel, armed once at creation.
  auto chan = ctx.create_cq(16, CqWait::channel);
  REQUIRE(chan);
  CHECK(chan->has_channel());
  CHECK(chan->channel_fd() == f.pipe_fds[0]);
  CHECK(f.channel_creates == 1);
  CHECK(f.notifies == 1);
  CHECK_FALSE(chan->channel_note());
  CHECK(g_notices == 0);
}

TEST_CASE("create_cq on rdma-core makes a channel by default", "[cq][channel]") {
  CountNotices notices;
  FakeVerbs f;
  f.enable_channels();
  Context ctx = open(f, "mlx5_0");
  REQUIRE(ctx.platform() == Platform::rdma_core);
  auto cq = ctx.create_cq(16);
  REQUIRE(cq);
  CHECK(cq->has_channel());
  CHECK(f.channel_creates == 1);
  CHECK_FALSE(cq->channel_note());
  CHECK(g_notices == 0);
  // The bool overload of existing callers: false polls, true asks for a channel.
  auto no = ctx.create_cq(16, false);
  REQUIRE(no);
  CHECK_FALSE(no->has_channel());
  CHECK(f.channel_creates == 1);
}

TEST_CASE("ibv_create_comp_channel EOPNOTSUPP: the CQ polls, records why, and says so once per process",
          "[cq][channel]") {
  CountNotices notices;
  FakeVerbs f;
  f.enable_channels();
  f.create_channel_errno = EOPNOTSUPP;
  for (const char* device : {"mlx5_0", "rdma_en1"}) {
    INFO(device);
    Context ctx = open(f, device);
    // The default on rdma-core, an explicit request on Apple.
    const CqWait how = ctx.platform() == Platform::apple ? CqWait::channel : CqWait::automatic;
    for (int i = 0; i < 3; ++i) {
      auto cq = ctx.create_cq(16, how);
      REQUIRE(cq); // never a failure
      CHECK_FALSE(cq->has_channel());
      CHECK(cq->channel_fd() == -1);
      REQUIRE(cq->channel_note());
      const Error& why = *cq->channel_note();
      CHECK(why.step == Step::create_comp_channel);
      CHECK(why.is(EOPNOTSUPP)); // the errno as the verb left it
      CHECK(why.device.view() == device);
      REQUIRE(why.diagnosis() != nullptr);
      CHECK(why.diagnosis()->id == "completion-channel-unsupported");
      // The wait still works: a completion is found, a silent CQ times out.
      f.completions.push_back(fake::completion(7));
      WorkCompletion wc[2];
      auto got = cq->wait(wc, Clock::now() + 2s);
      REQUIRE(got);
      CHECK(*got == 1);
      CHECK(wc[0].wr_id() == 7);
    }
  }
  CHECK(f.notifies == 0); // no channel, nothing to arm
  CHECK(g_notices == 1);  // once per process, not once per CQ
  CHECK(g_last_notice == Notice::completion_channel_fallback);
  CHECK(g_last_cause.find("ibv_create_comp_channel failed with EOPNOTSUPP") != std::string::npos);
  CHECK(notice_given(Notice::completion_channel_fallback));
}

TEST_CASE("ibv_req_notify_cq EOPNOTSUPP: found when the CQ is made, the CQ polls", "[cq][channel]") {
  CountNotices notices;
  FakeVerbs f;
  f.enable_channels();
  f.req_notify_rc = EOPNOTSUPP;
  Context ctx = open(f, "rdma_en1");
  auto cq = ctx.create_cq(16, CqWait::channel);
  REQUIRE(cq);
  CHECK(f.channel_creates == 1);
  CHECK(f.notifies == 1);
  CHECK_FALSE(cq->has_channel());
  REQUIRE(cq->channel_note());
  CHECK(cq->channel_note()->step == Step::req_notify_cq);
  CHECK(cq->channel_note()->is(EOPNOTSUPP));
  CHECK(cq->channel_note()->diagnosis()->id == "completion-channel-unsupported");
  CHECK(g_notices == 1);
  // No second attempt to arm from wait: it polls.
  WorkCompletion wc[1];
  CHECK(cq->wait(wc, Clock::now() + 20ms).error().is(ErrorKind::timeout));
  CHECK(f.notifies == 1);
}

TEST_CASE("a channel that stops arming later falls back inside wait, which goes on", "[cq][channel]") {
  CountNotices notices;
  FakeVerbs f;
  f.enable_channels();
  Context ctx = open(f, "mlx5_0");
  auto cq = ctx.create_cq(16);
  REQUIRE(cq);
  REQUIRE(cq->has_channel());
  f.req_notify_rc = ENOTSUP;
  f.hold_until = Clock::now() + 30ms;
  f.completions.push_back(fake::completion(9));
  WorkCompletion wc[1];
  auto got = cq->wait(wc, Clock::now() + 2s);
  REQUIRE(got);
  CHECK(*got == 1);
  CHECK_FALSE(cq->has_channel());
  REQUIRE(cq->channel_note());
  CHECK(cq->channel_note()->step == Step::req_notify_cq);
  CHECK(cq->channel_note()->is(ENOTSUP));
  CHECK(g_notices == 1);
}

TEST_CASE("create_cq refusing a CQ with a channel: the CQ is made without one", "[cq][channel]") {
  CountNotices notices;
  FakeVerbs f;
  f.enable_channels();
  f.create_cq_channel_errno = EINVAL;
  Context ctx = open(f, "mlx5_0");
  auto cq = ctx.create_cq(16);
  REQUIRE(cq);
  CHECK_FALSE(cq->has_channel());
  REQUIRE(cq->channel_note());
  CHECK(cq->channel_note()->step == Step::create_cq);
  CHECK(cq->channel_note()->is(EINVAL));
  CHECK(std::find(f.calls.begin(), f.calls.end(), "destroy_comp_channel") != f.calls.end());
}

TEST_CASE("a library without the channel functions: asking for a channel is a note, not a failure", "[cq][channel]") {
  CountNotices notices;
  FakeVerbs f; // no enable_channels()
  CHECK_FALSE(f.library().has_completion_channels());
  Context ctx = open(f, "rdma_en1");
  auto cq = ctx.create_cq(16, CqWait::channel);
  REQUIRE(cq);
  CHECK_FALSE(cq->has_channel());
  REQUIRE(cq->channel_note());
  CHECK(cq->channel_note()->step == Step::create_comp_channel);
  CHECK(cq->channel_note()->kind == ErrorKind::unsupported);
  CHECK(cq->channel_note()->diagnosis()->id == "completion-channel-unsupported");
  CHECK(g_notices == 1);
  // Polling on purpose is silent.
  auto quiet = ctx.create_cq(16, CqWait::poll);
  REQUIRE(quiet);
  CHECK_FALSE(quiet->channel_note());
}

TEST_CASE("wait without a channel polls until the deadline and never sleeps past it", "[cq][wait]") {
  FakeVerbs f;
  Context ctx = open(f, "rdma_en1");
  auto cq = ctx.create_cq(16);
  REQUIRE(cq);
  WorkCompletion wc[4];
  for (auto budget : {0ms, 5ms, 40ms}) {
    INFO("deadline in " << budget.count() << " ms");
    const auto t0 = Clock::now();
    auto r = cq->wait(wc, t0 + budget);
    const auto took = Clock::now() - t0;
    REQUIRE_FALSE(r);
    CHECK(r.error().kind == ErrorKind::timeout);
    CHECK(r.error().step == Step::wait_cq);
    CHECK(r.error().device.view() == "rdma_en1");
    CHECK(took >= budget);
    CHECK(took < budget + 100ms); // sleeps are at most 1 ms and cut to the deadline
  }
  // A completion that arrives later is picked up promptly (a sleep is at most ~1 ms).
  f.hold_until = Clock::now() + 25ms;
  f.completions.push_back(fake::completion(3));
  const auto t0 = Clock::now();
  auto r = cq->wait(wc, t0 + 5s);
  const auto took = Clock::now() - t0;
  REQUIRE(r);
  CHECK(*r == 1);
  CHECK(took >= 25ms);
  CHECK(took < 500ms);
  // It polled often, but did not spin for the whole 25 ms: the backoff yields and sleeps.
  CHECK(f.polls > static_cast<int>(detail::PollBackoff::spin_polls));
}

TEST_CASE("a failed completion ends a polling wait with its error", "[cq][wait]") {
  FakeVerbs f;
  Context ctx = open(f, "rdma_en1");
  auto cq = ctx.create_cq(16);
  REQUIRE(cq);
  f.hold_until = Clock::now() + 5ms;
  f.completions.push_back(fake::completion(4, abi::IBV_WC_WR_FLUSH_ERR));
  WorkCompletion wc[2];
  auto r = cq->wait(wc, Clock::now() + 2s);
  REQUIRE_FALSE(r);
  CHECK(r.error().kind == ErrorKind::wc_error);
  CHECK(r.error().wr_id == 4);
}

TEST_CASE("wait with a working channel sleeps on it and still sees completions", "[cq][wait][channel]") {
  CountNotices notices;
  FakeVerbs f;
  f.enable_channels();
  Context ctx = open(f, "mlx5_0");
  auto cq = ctx.create_cq(16);
  REQUIRE(cq);
  REQUIRE(cq->has_channel());
  f.hold_until = Clock::now() + 30ms; // the fake's fd never fires: the 10 ms slices find it
  f.completions.push_back(fake::completion(5));
  WorkCompletion wc[1];
  auto r = cq->wait(wc, Clock::now() + 2s);
  REQUIRE(r);
  CHECK(*r == 1);
  CHECK(f.notifies >= 2); // armed at creation and again before sleeping
  CHECK(cq->has_channel());
  CHECK(g_notices == 0);
  // Timeout through the channel path too, within the deadline.
  const auto t0 = Clock::now();
  CHECK(cq->wait(wc, t0 + 30ms).error().is(ErrorKind::timeout));
  CHECK(Clock::now() - t0 < 200ms);
}

TEST_CASE("PollBackoff: spin, then yield, then sleeps of at most 1 ms, never past the deadline", "[cq][backoff]") {
  using detail::PollBackoff;
  SECTION("a deadline already passed ends the spin at the first clock reading") {
    PollBackoff b(Clock::now() - 1ms);
    std::uint32_t n = 0;
    while (b.pause()) ++n;
    CHECK(n == PollBackoff::clock_every - 1);
  }
  SECTION("the spin and yield phases do not sleep") {
    PollBackoff b(Clock::now() + 10s);
    const auto t0 = Clock::now();
    for (std::uint32_t i = 0; i < PollBackoff::spin_polls + PollBackoff::yield_polls; ++i) REQUIRE(b.pause());
    CHECK(Clock::now() - t0 < 200ms);
  }
  SECTION("a sleep is an eighth of the time waited, within first_sleep and max_sleep") {
    using us = std::chrono::microseconds;
    CHECK(PollBackoff::next_sleep(us{0}) == PollBackoff::first_sleep);
    CHECK(PollBackoff::next_sleep(us{100}) == PollBackoff::first_sleep);
    CHECK(PollBackoff::next_sleep(us{800}) == us{100}); // a 500 us wait is noticed ~60 us late, not 300
    CHECK(PollBackoff::next_sleep(us{4000}) == us{500});
    CHECK(PollBackoff::next_sleep(us{8000}) == PollBackoff::max_sleep);
    CHECK(PollBackoff::next_sleep(10s) == PollBackoff::max_sleep);
  }
  SECTION("sleeps grow to max_sleep and are cut to the deadline") {
    PollBackoff b(Clock::now() + 10s);
    for (std::uint32_t i = 0; i < PollBackoff::spin_polls + PollBackoff::yield_polls; ++i) REQUIRE(b.pause());
    const auto t0 = Clock::now();
    int pauses = 0;
    while (Clock::now() - t0 < 30ms) { // 16 us growing by an eighth per sleep, then 1 ms each
      REQUIRE(b.pause());
      ++pauses;
    }
    // Sleeping (not spinning): far fewer pauses than 30 ms of 16 us sleeps; and growing to 1 ms:
    // after 30 ms of waiting, one pause takes at least about max_sleep.
    CHECK(pauses < 300);
    const auto s0 = Clock::now();
    REQUIRE(b.pause());
    CHECK(Clock::now() - s0 >= PollBackoff::max_sleep - 100us);
    CHECK(Clock::now() - s0 < PollBackoff::max_sleep + 200ms);
    // A deadline 3 ms away is reached, not overslept by a whole sleep.
    PollBackoff near(Clock::now() + 3ms);
    for (std::uint32_t i = 0; i < PollBackoff::spin_polls + PollBackoff::yield_polls; ++i)
      if (!near.pause()) break;
    while (near.pause()) {
    }
    CHECK(Clock::now() >= near.deadline());
    CHECK(Clock::now() - near.deadline() < 50ms);
  }
  SECTION("reset starts over at the spin") {
    PollBackoff b(Clock::now() + 10s);
    for (std::uint32_t i = 0; i < PollBackoff::spin_polls + PollBackoff::yield_polls + 3; ++i) REQUIRE(b.pause());
    b.reset();
    const auto t0 = Clock::now();
    for (std::uint32_t i = 0; i < PollBackoff::spin_polls; ++i) REQUIRE(b.pause());
    CHECK(Clock::now() - t0 < 100ms);
  }
}

TEST_CASE("notices: one per process, a handler can replace or silence the stderr line", "[notice]") {
  CountNotices notices;
  const Error e = Error::from_errno(Step::create_comp_channel, EOPNOTSUPP);
  detail::notice_once(Notice::completion_channel_fallback, e);
  detail::notice_once(Notice::completion_channel_fallback, e);
  CHECK(g_notices == 1);
  reset_notices();
  set_notice_handler(nullptr); // silenced: still recorded as given
  detail::notice_once(Notice::completion_channel_fallback, e);
  CHECK(g_notices == 1);
  CHECK(notice_given(Notice::completion_channel_fallback));
  CHECK(set_notice_handler(&count_notice) == nullptr);
  CHECK(notice_fallback(Notice::completion_channel_fallback).find("poll") != std::string_view::npos);
}

// ---- setup symbols ----------------------------------------------------------------------------

TEST_CASE("required symbols are exactly what JACCL and ds4 resolve; the others are optional", "[loader]") {
  // What the public Apple consumers resolve (poll/post go through the context's ops table).
  const std::set<std::string> apple_consumers = {
      "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
      "ibv_close_device",    "ibv_query_device",     "ibv_query_port",      "ibv_query_gid",
      "ibv_alloc_pd",        "ibv_dealloc_pd",       "ibv_reg_mr",          "ibv_dereg_mr",
      "ibv_create_cq",       "ibv_destroy_cq",       "ibv_create_qp",       "ibv_destroy_qp",
      "ibv_modify_qp",       "ibv_query_qp"};
  std::set<std::string> required, optional;
  for (const auto& e : detail::symbol_table()) (e.required ? required : optional).insert(e.name);
  CHECK(required == apple_consumers);
  CHECK(optional.count("ibv_get_device_guid") == 1);
  CHECK(optional.count("ibv_create_comp_channel") == 1);
  CHECK(optional.count("ibv_get_async_event") == 1);
  CHECK(optional.count("ibv_ack_async_event") == 1);
  CHECK(optional.count("ibv_req_notify_cq") == 0); // the ops table's, not a symbol
}

TEST_CASE("a library without ibv_get_device_guid: devices list and open, guid() is empty", "[loader]") {
  {
    FakeVerbs f;
    f.api.get_device_guid = nullptr;
    auto lib = f.library();
    CHECK_FALSE(lib.has_device_guid());
    auto list = DeviceList::get(lib);
    REQUIRE(list);
    for (const Device& d : *list) CHECK_FALSE(d.guid().has_value());
    auto ctx = Context::open(lib, "rdma_en2");
    REQUIRE(ctx);
  }
  // With the function, the GUID is there (the fake's is 0). One FakeVerbs at a time.
  FakeVerbs g;
  auto list2 = DeviceList::get(g.library());
  REQUIRE(list2);
  CHECK(list2->devices().front().guid() == std::optional<std::uint64_t>(0));
}

// ---- link layer and QP budget ----------------------------------------------------------------

TEST_CASE("link layer 100 is Thunderbolt (TN3205, mlx PR #4191)", "[types]") {
  static_assert(static_cast<int>(LinkLayer::thunderbolt) == 100);
  CHECK(link_layer_name(LinkLayer::thunderbolt) == "Thunderbolt");
  CHECK(link_layer_name(LinkLayer::ethernet) == "Ethernet");
  CHECK(link_layer_name(LinkLayer::infiniband) == "InfiniBand");
  CHECK(link_layer_name(LinkLayer::unspecified) == "unspecified");
  CHECK(link_layer_name(static_cast<LinkLayer>(7)) == "unknown");
  FakeVerbs f;
  f.link_layer = 100;
  Context ctx = open(f, "rdma_en1");
  auto port = ctx.query_port(1);
  REQUIRE(port);
  CHECK(port->link_layer == LinkLayer::thunderbolt);
}

TEST_CASE("usable_qps: 10 on Apple whatever max_qp says, max_qp elsewhere", "[types][qp]") {
  DeviceAttributes a;
  for (int reported : {11, 10, 0, 1024}) {
    a.max_qp = reported;
    INFO("max_qp " << reported);
    CHECK(usable_qps(a, Platform::apple) == 10);
  }
  a.max_qp = 4; // a driver that reports fewer is believed
  CHECK(usable_qps(a, Platform::apple) == 4);
  a.max_qp = 11;
  CHECK(usable_qps(a, Platform::rdma_core) == 11);
  CHECK(usable_qps(a, Platform::any) == 11);
  a.max_qp = 0;
  CHECK(usable_qps(a, Platform::rdma_core) == 0);
  // From a device that reports what Macs report.
  FakeVerbs f;
  f.max_qp = 11;
  Context ctx = open(f, "rdma_en1");
  auto attrs = ctx.query_device();
  REQUIRE(attrs);
  CHECK(attrs->max_qp == 11);
  CHECK(usable_qps(*attrs, ctx.platform()) == apple_usable_qps);
}
