// Regression tests of issue 8 ("the core API a backend author needs"), one TEST_CASE per finding,
// named "finding N: ...". They run on the fake provider (fake_verbs.hpp); each failed before its fix.
#include "fake_qp.hpp"

#include <tbverbs/data_path.hpp>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <vector>
#include <typeinfo>

using namespace tbverbs;
using fake::FakeVerbs;

// Counts allocations (of this thread) so a test can prove a path allocates nothing.
// The replacements are malloc and free, a matched pair; GCC 12 at -O3 (the release preset) inlines
// them into std::string and std::vector and then sees free() of a pointer from operator new:
// -Wmismatched-new-delete, a false positive for a replaced operator new.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
thread_local long allocations = 0;
}
void* operator new(std::size_t n) {
  ++allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  ++allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using Conn = fake::ConnectedQp;
// A connected QP on the fake: Thunderbolt (rdma_en1, UC) or an rdma-core RC NIC (mlx5_0).
Conn connect(FakeVerbs& f, bool rc, QpCapacities caps = {16, 16, 2, 2, 64}) { return fake::connect_qp(f, rc, caps); }

abi::ibv_wc wc_of(std::uint64_t wr_id, std::uint32_t qp, int status = abi::IBV_WC_SUCCESS) {
  abi::ibv_wc w = fake::completion(wr_id, status);
  w.qp_num = qp;
  return w;
}

std::string read_header(const char* name) {
  std::ifstream in(std::string(TBVERBS_TEST_SOURCE_DIR) + "/../include/tbverbs/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

TEST_CASE("finding 1: a failed completion loses none of the good ones around it", "[issue8][cq]") {
  FakeVerbs f;
  auto c = connect(f, false);
  WorkCompletion wc[8];
  // One CQ shared by two QPs: three good receives of QP 7, QP 9's length error, then more of both.
  f.completions.push_back(wc_of(100, 7));
  f.completions.push_back(wc_of(101, 7));
  f.completions.push_back(wc_of(102, 7));
  f.completions.push_back(wc_of(200, 9, abi::IBV_WC_LOC_LEN_ERR));
  f.completions.push_back(wc_of(103, 7));
  f.completions.push_back(wc_of(201, 9, abi::IBV_WC_WR_FLUSH_ERR));
  f.completions.push_back(wc_of(104, 7));

  auto first = c.cq.poll(wc);
  REQUIRE(first);
  REQUIRE(*first == 3);
  CHECK(wc[0].wr_id() == 100);
  CHECK(wc[2].wr_id() == 102);
  CHECK(c.cq.kept() == 4);

  auto failure = c.cq.poll(wc);
  REQUIRE_FALSE(failure);
  CHECK(failure.error().kind == ErrorKind::wc_error);
  CHECK(failure.error().wc_status == abi::IBV_WC_LOC_LEN_ERR);
  CHECK(failure.error().wr_id == 200);
  CHECK(failure.error().qp_num == 9);
  CHECK(failure.error().message().find("QP 9") != std::string::npos);

  auto after = c.cq.poll(wc);
  REQUIRE(after);
  REQUIRE(*after == 1);
  CHECK(wc[0].wr_id() == 103);
  auto flush = c.cq.poll(wc);
  REQUIRE_FALSE(flush);
  CHECK(flush.error().wc_status == abi::IBV_WC_WR_FLUSH_ERR);
  CHECK(flush.error().wr_id == 201);
  auto last = c.cq.poll(wc);
  REQUIRE(last);
  REQUIRE(*last == 1);
  CHECK(wc[0].wr_id() == 104);
  CHECK(c.cq.kept() == 0);

  // A failure first in a batch is the error at once; the successes behind it follow.
  f.completions.push_back(wc_of(300, 9, abi::IBV_WC_REM_ACCESS_ERR));
  f.completions.push_back(wc_of(105, 7));
  auto e = c.cq.poll(wc); // no success came before it: the failure at once, the rest kept
  CHECK(c.cq.kept() == 1);
  REQUIRE_FALSE(e);
  CHECK(e.error().wr_id == 300);
  auto rest = c.cq.poll(wc);
  REQUIRE(rest);
  CHECK(*rest == 1);
  CHECK(wc[0].wr_id() == 105);
  // Kept completions leave in order even into a span of one.
  f.completions.push_back(wc_of(400, 7, abi::IBV_WC_RETRY_EXC_ERR));
  f.completions.push_back(wc_of(106, 7));
  f.completions.push_back(wc_of(107, 7));
  REQUIRE_FALSE(c.cq.poll(wc));
  WorkCompletion one[1];
  auto a = c.cq.poll(one);
  auto b = c.cq.poll(one);
  REQUIRE((a && b));
  CHECK(one[0].wr_id() == 107);
  CHECK(*a == 1);
}

TEST_CASE("issue 12 item 6: the fused poll hands every success to the consumer, in order, and loses none",
          "[issue8][issue12][cq]") {
  FakeVerbs f;
  auto c = connect(f, false);
  WorkCompletion wc[8];
  std::vector<std::uint64_t> seen;
  auto consume = [&](const WorkCompletion& w) { seen.push_back(w.wr_id()); };
  f.completions.push_back(wc_of(100, 7));
  f.completions.push_back(wc_of(101, 7));
  f.completions.push_back(wc_of(200, 9, abi::IBV_WC_LOC_LEN_ERR));
  f.completions.push_back(wc_of(102, 7));

  auto first = c.cq.poll(wc, consume);
  REQUIRE(first);
  CHECK(*first == 2);
  CHECK(seen == std::vector<std::uint64_t>{100, 101});
  CHECK(c.cq.kept() == 2);
  auto failure = c.cq.poll(wc, consume);
  REQUIRE_FALSE(failure);
  CHECK(failure.error().wr_id == 200);
  CHECK(failure.error().qp_num == 9);
  CHECK(seen.size() == 2); // the failure is never handed to the consumer
  auto rest = c.cq.poll(wc, consume);
  REQUIRE(rest);
  CHECK(*rest == 1);
  CHECK(seen == std::vector<std::uint64_t>{100, 101, 102});
  auto empty = c.cq.poll(wc, consume);
  REQUIRE(empty);
  CHECK(*empty == 0);
}

TEST_CASE("finding 3: a failed chain says how many were posted and which was not", "[issue8][qp]") {
  FakeVerbs f;
  auto c = connect(f, true);
  static char buf[64];
  abi::ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), 8, 1};
  SendChain<4> chain;
  for (std::uint64_t id = 10; id < 14; ++id) REQUIRE(chain.push(SendWr::send(id, sge)));
  f.post_send_rc = ENOMEM;
  f.post_fail_at = 2;
  auto r = c.qp.post(chain);
  REQUIRE_FALSE(r);
  CHECK(r.error().is(ENOMEM));
  CHECK(r.error().posted == 2);
  CHECK(r.error().wr_id == 12);
  CHECK(r.error().qp_num == c.qp.qp_num());
  CHECK(r.error().message().find("after posting 2 work requests") != std::string::npos);
  CHECK(f.posted_sends.size() == 2);

  // The escape hatch hands back the driver's bad_wr itself.
  abi::ibv_send_wr w[2]{};
  w[0].wr_id = 1;
  w[0].next = &w[1];
  w[1].wr_id = 2;
  f.post_fail_at = 1;
  abi::ibv_send_wr* bad = nullptr;
  auto raw = c.qp.post_send(w[0], bad);
  REQUIRE_FALSE(raw);
  CHECK(bad == &w[1]);
  CHECK(raw.error().posted == 1);

  RecvChain<3> recvs;
  for (std::uint64_t id = 50; id < 53; ++id) REQUIRE(recvs.push(RecvWr(id, sge)));
  f.post_recv_rc = -ENOMEM; // Apple's sign (hellas#35)
  f.post_fail_at = 1;
  auto rr = c.qp.post(recvs);
  REQUIRE_FALSE(rr);
  CHECK(rr.error().is(ENOMEM));
  CHECK(rr.error().posted == 1);
  CHECK(rr.error().wr_id == 51);
}

TEST_CASE("finding 4: typed work requests post every operation a backend needs, and refuse the rest",
          "[issue8][qp]") {
  FakeVerbs f;
  // Every remote right granted, so READ and atomics are admitted (issue 18 finding 3: the RC
  // preset grants remote write only, and admits no more).
  auto c = fake::connect_qp(f, true, {16, 16, 2, 2, 64},
                            Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic);
  static char buf[256];
  const auto base = reinterpret_cast<std::uintptr_t>(buf);
  abi::ibv_sge sge{base, 8, 1};
  const RemoteBuffer peer{0x10000, 0x77};

  REQUIRE(c.qp.post(SendWr::send_with_imm(1, sge, 0x01020304).solicited()));
  REQUIRE(c.qp.post(SendWr::rdma_write_with_imm(2, sge, peer, 42).signaled(false)));
  REQUIRE(c.qp.post(SendWr::rdma_read(3, sge, peer).fence()));
  REQUIRE(c.qp.post(SendWr::fetch_and_add(4, sge, peer, 5)));
  REQUIRE(c.qp.post(SendWr::compare_and_swap(5, sge, peer, 6, 7)));
  REQUIRE(c.qp.post(SendWr::send(6, sge).inline_data()));
  const abi::ibv_sge two[2] = {{base, 16, 1}, {base + 64, 32, 1}};
  REQUIRE(c.qp.post(SendWr::send(7, sge).sges(two)));
  REQUIRE(f.posted_sends.size() == 7);
  const auto& p = f.posted_sends;
  CHECK(p[0].opcode == abi::IBV_WR_SEND_WITH_IMM);
  CHECK(p[0].imm_data == detail::to_network32(0x01020304)); // network order on the wire
  CHECK((p[0].send_flags & abi::IBV_SEND_SOLICITED) != 0);
  CHECK(p[1].opcode == abi::IBV_WR_RDMA_WRITE_WITH_IMM);
  CHECK((p[1].send_flags & abi::IBV_SEND_SIGNALED) == 0);
  CHECK(p[1].wr.rdma.remote_addr == 0x10000);
  CHECK(p[1].wr.rdma.rkey == 0x77);
  CHECK(p[2].opcode == abi::IBV_WR_RDMA_READ);
  CHECK((p[2].send_flags & abi::IBV_SEND_FENCE) != 0);
  CHECK(p[3].opcode == abi::IBV_WR_ATOMIC_FETCH_AND_ADD);
  CHECK(p[3].wr.atomic.compare_add == 5);
  CHECK(p[4].wr.atomic.swap == 7);
  CHECK((p[5].send_flags & abi::IBV_SEND_INLINE) != 0);
  CHECK(p[6].num_sge == 2);
  CHECK(f.posted_sges[6][1].length == 32);
  CHECK(f.posted_sges[0][0].addr == base);

  // One doorbell for a chain.
  SendChain<3> chain;
  REQUIRE(chain.push(SendWr::send(8, sge)));
  REQUIRE(chain.push(SendWr::rdma_write(9, sge, peer)));
  REQUIRE(c.qp.post(chain));
  CHECK(f.posted_sends.size() == 9);

  // Inline data above the granted max_inline_data is refused before the driver sees it.
  const abi::ibv_sge big{base, 200, 1};
  auto too_big = c.qp.post(SendWr::send(10, big).inline_data());
  REQUIRE_FALSE(too_big);
  CHECK(too_big.error().kind == ErrorKind::capacity);
  CHECK(too_big.error().diagnosis() != nullptr);
  CHECK(f.posted_sends.size() == 9);

  // Receive completions carry the immediate back in host order.
  abi::ibv_wc w = fake::completion(11);
  w.wc_flags = abi::IBV_WC_WITH_IMM;
  w.imm_data = detail::to_network32(0xabcd);
  f.completions.push_back(w);
  WorkCompletion wc[1];
  REQUIRE(c.cq.poll(wc));
  CHECK(wc[0].has_imm());
  CHECK(wc[0].imm() == 0xabcd);
}

TEST_CASE("finding 4: Thunderbolt and UC refuse what they do not execute", "[issue8][qp]") {
  FakeVerbs f;
  auto tb = connect(f, false);
  static char buf[64];
  abi::ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), 8, 1};
  CHECK(tb.qp.allowed_ops() == SendOps::send);
  for (auto wr : {SendWr::send_with_imm(1, sge, 1), SendWr::rdma_write(2, sge, {}), SendWr::rdma_read(3, sge, {}),
                  SendWr::fetch_and_add(4, sge, {}, 1)}) {
    auto r = tb.qp.post(wr);
    REQUIRE_FALSE(r);
    CHECK(r.error().kind == ErrorKind::unsupported);
    CHECK(r.error().diagnosis() != nullptr);
  }
  CHECK(f.posted_sends.empty());
  REQUIRE(tb.qp.post(SendWr::send(5, sge)));
  // UC on rdma-core: SEND and WRITE (with or without immediate), never READ or atomics.
  constexpr SendOps uc = send_ops_for(QpType::uc, Platform::rdma_core, true);
  STATIC_CHECK(contains(uc, SendOp::rdma_write_with_imm));
  STATIC_CHECK_FALSE(contains(uc, SendOp::rdma_read));
  STATIC_CHECK_FALSE(contains(uc, SendOp::atomic_fetch_and_add));
  STATIC_CHECK(contains(send_ops_for(QpType::rc, Platform::rdma_core, true), SendOp::atomic_cmp_and_swp));
}

TEST_CASE("issue 18 finding 3: an RC QP admits the one-sided operations its recipe's access grants, no more",
          "[issue18][qp]") {
  // The preset grants local and remote write: SEND and WRITE (with or without immediate) post;
  // a READ or an atomic, which the peer's QP (the same recipe) would refuse at completion and put
  // both QPs in ERR, is refused at post() with nothing sent.
  static char buf[64];
  abi::ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), 8, 1};
  const RemoteBuffer peer{0x10000, 0x77};
  {
  FakeVerbs f; // one FakeVerbs at a time: its functions reach it through a global
  auto c = connect(f, true);
  CHECK(c.qp.rdma_write_allowed());
  CHECK_FALSE(contains(c.qp.allowed_ops(), SendOp::rdma_read));
  CHECK_FALSE(contains(c.qp.allowed_ops(), SendOp::atomic_fetch_and_add));
  REQUIRE(c.qp.post(SendWr::rdma_write_with_imm(1, sge, peer, 7)));
  const std::size_t before = f.posted_sends.size();
  for (auto wr : {SendWr::rdma_read(2, sge, peer), SendWr::fetch_and_add(3, sge, peer, 1),
                  SendWr::compare_and_swap(4, sge, peer, 1, 2)}) {
    auto r = c.qp.post(wr);
    REQUIRE_FALSE(r);
    CHECK(r.error().kind == ErrorKind::unsupported);
    CHECK(r.error().posted == 0);
    CHECK(r.error().message().find("QpRecipe::access") != std::string::npos);
  }
  CHECK(f.posted_sends.size() == before);
  }
  // Granting remote read admits READ, still no atomics.
  FakeVerbs g;
  auto r = fake::connect_qp(g, true, {16, 16, 2, 2, 64}, Access::local_write | Access::remote_write | Access::remote_read);
  CHECK(contains(r.qp.allowed_ops(), SendOp::rdma_read));
  CHECK_FALSE(contains(r.qp.allowed_ops(), SendOp::atomic_cmp_and_swp));
  REQUIRE(r.qp.post(SendWr::rdma_read(5, sge, peer)));
  // The rule itself.
  STATIC_CHECK_FALSE(contains(send_ops_for(QpType::rc, Platform::rdma_core, true, Access::local_write), SendOp::rdma_write));
  STATIC_CHECK(contains(send_ops_for(QpType::rc, Platform::rdma_core, true, Access::local_write), SendOp::send_with_imm));
  STATIC_CHECK(contains(send_ops_for(QpType::rc, Platform::rdma_core, true, Access::remote_atomic), SendOp::atomic_fetch_and_add));
  STATIC_CHECK_FALSE(contains(send_ops_for(QpType::rc, Platform::rdma_core, false, Access::remote_read), SendOp::rdma_read));
}

TEST_CASE("finding 6: closed and moved-from handles are safe", "[issue8][handles]") {
  FakeVerbs f;
  f.enable_channels();
  f.device_names = {"mlx5_0"};
  auto ctx = Context::open(f.library(), "mlx5_0");
  REQUIRE(ctx);
  auto cq = ctx->create_cq(16, CqWait::channel);
  REQUIRE(cq);
  REQUIRE(cq->has_channel());
  CHECK(cq->channel_fd() >= 0);
  REQUIRE(cq->close());
  CHECK(cq->channel_fd() == -1); // was a heap use-after-free under ASan
  CHECK_FALSE(cq->has_channel());
  CHECK(cq->native_handle() == nullptr);
  WorkCompletion wc[2];
  auto p = cq->poll(wc);
  REQUIRE_FALSE(p);
  CHECK(p.error().is(EBADF));
  REQUIRE(p.error().diagnosis() != nullptr);
  CHECK(p.error().diagnosis()->id == "handle-closed");
  CHECK_FALSE(cq->wait(wc, std::chrono::steady_clock::now() + std::chrono::seconds(5)));

  auto c = connect(f, true);
  QueuePair moved = std::move(c.qp);
  CHECK(c.qp.native_handle() == nullptr); // dangled before
  static char buf[8];
  abi::ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), 8, 1};
  auto s = c.qp.send(1, sge);
  REQUIRE_FALSE(s);
  CHECK(s.error().is(EBADF));
  CHECK(s.error().diagnosis()->id == "handle-closed");
  CHECK_FALSE(c.qp.recv(2, sge));
  REQUIRE(moved.send(3, sge));
  REQUIRE(moved.close());
  CHECK(moved.native_handle() == nullptr);
  CHECK_FALSE(moved.send(4, sge));
  CHECK_FALSE(moved.modify_to_error());

  CompletionQueue cq2 = std::move(c.cq);
  CHECK(c.cq.native_handle() == nullptr);
  CHECK(c.cq.capacity() == 0);
  CHECK_FALSE(c.cq.poll(wc));
  CHECK(cq2.native_handle() != nullptr);
}

TEST_CASE("finding 9: every handle documents what may be shared and moved across threads", "[issue8][docs]") {
  for (const char* h : {"completion_queue.hpp", "queue_pair.hpp", "context.hpp", "protection_domain.hpp",
                        "memory_region.hpp", "work_request.hpp"}) {
    INFO(h);
    const std::string text = read_header(h);
    REQUIRE_FALSE(text.empty());
    CHECK(text.find("Threads") != std::string::npos);
  }
  const std::string qp = read_header("queue_pair.hpp");
  CHECK(qp.find("as the verbs themselves") == std::string::npos); // the wrong claim is gone
  CHECK(qp.find("thread-safe by design on rdma-core") != std::string::npos);
}

TEST_CASE("finding 11: poll's failure path formats into the fixed buffer and allocates nothing", "[issue8][cq]") {
  FakeVerbs f;
  auto c = connect(f, false);
  f.completions.push_back(wc_of(1, 7));
  f.completions.push_back(wc_of(2, 7, abi::IBV_WC_LOC_PROT_ERR));
  f.completions.push_back(wc_of(3, 7));
  WorkCompletion wc[4];
  const long before = allocations;
  auto a = c.cq.poll(wc);
  auto b = c.cq.poll(wc);
  auto d = c.cq.poll(wc);
  auto w = c.cq.wait(wc, std::chrono::steady_clock::now() + std::chrono::seconds(1)); // nothing left: times out
  const long after = allocations;
  CHECK_FALSE(w);
  CHECK(after == before);
  REQUIRE(a);
  REQUIRE_FALSE(b);
  REQUIRE(d);
  CHECK(b.error().qp_num == 7);
  STATIC_CHECK(noexcept(c.cq.poll(wc)));
  // A failed post formats without allocating too.
  f.post_send_rc = EINVAL;
  abi::ibv_sge sge{0, 0, 0};
  const long before_post = allocations;
  auto s = c.qp.send(1, sge);
  CHECK(allocations == before_post);
  CHECK_FALSE(s);
}

TEST_CASE("finding 12: create_cq refuses more than max_cqe and takes CqOptions", "[issue8][cq]") {
  FakeVerbs f; // max_cqe 4096
  auto ctx = Context::open(f.library(), "rdma_en1");
  REQUIRE(ctx);
  auto big = ctx->create_cq(5000);
  REQUIRE_FALSE(big);
  CHECK(big.error().kind == ErrorKind::capacity);
  CHECK(big.error().step == Step::create_cq);
  CHECK(std::string(big.error().detail.view()).find("max_cqe is 4096") != std::string::npos);
  CHECK_FALSE(ctx->create_cq(0));
  CHECK_FALSE(ctx->create_cq(CqOptions{16, CqWait::poll, -1}));
  auto ok = ctx->create_cq(CqOptions{4096, CqWait::poll, 0});
  REQUIRE(ok);
  CHECK(ok->capacity() == 4096);
  // The inline namespace names the verbs declarations too, so two TUs that disagree cannot link.
  const std::string ns = typeid(Error).name();
  CHECK(ns.find(TBVERBS_ABI_FROM_PLATFORM ? "platform_abi" : "own_abi") != std::string::npos);
}

TEST_CASE("finding 13: sge() names its own step, and a cut detail is marked", "[issue8][errors]") {
  FakeVerbs f;
  auto ctx = Context::open(f.library(), "rdma_en1");
  auto pd = ctx->alloc_pd();
  static std::byte buf[4096];
  auto mr = pd->reg_mr(buf);
  REQUIRE(mr);
  auto s = mr->sge(4000, 200);
  REQUIRE_FALSE(s);
  CHECK(s.error().step == Step::make_sge); // was Step::post_send, also for receive buffers
  const std::string long_text(400, 'x');
  Error e = Error::make(Step::configure, ErrorKind::invalid_argument, long_text);
  CHECK(e.detail.view().size() == 255);
  CHECK(e.detail.view().substr(252) == "...");
  Error shortened = Error::make(Step::configure, ErrorKind::invalid_argument, "abc");
  CHECK(shortened.detail.view() == "abc");
  // post_* document backpressure and the catalogue explains it.
  const std::string qp = read_header("queue_pair.hpp");
  CHECK(qp.find("ENOMEM: the queue is full") != std::string::npos);
  CHECK(qp.find("EINVAL: more SGEs") != std::string::npos);
  const std::string ctxh = read_header("context.hpp");
  CHECK(ctxh.find("Errors: ibv_alloc_pd") != std::string::npos);
  CHECK(ctxh.find("Errors (never a channel's)") != std::string::npos);
}

TEST_CASE("finding 2: a GID index above 255 is refused, not truncated at RTR", "[issue8][recipe]") {
  FakeVerbs f;
  f.gids.assign(1024, FakeVerbs::link_local());
  f.gids[300] = FakeVerbs::ipv4(169, 254, 0, 3); // the only IPv4 entry: index 300 (44 as uint8_t)
  f.gids[44] = FakeVerbs::ipv4(169, 254, 0, 44);
  auto ctx = Context::open(f.library(), "rdma_en1");
  auto pd = ctx->alloc_pd();
  auto cq = ctx->create_cq(16, CqWait::poll);
  auto table = ctx->gid_table(1);
  REQUIRE(table);
  auto sel = table->at_index(300);
  REQUIRE(sel);
  auto prep = QpRecipe::thunderbolt(*sel).prepare(*pd, *cq);
  REQUIRE_FALSE(prep);
  CHECK(prep.error().kind == ErrorKind::gid_index_invalid);
  CHECK(prep.error().gid_index == 300);
  CHECK(std::string(prep.error().detail.view()).find("8 bits") != std::string::npos);
  CHECK(f.qps.empty()); // refused before anything was created
  auto low = table->at_index(44);
  REQUIRE(low);
  REQUIRE(QpRecipe::thunderbolt(*low).prepare(*pd, *cq));
}

TEST_CASE("finding 5: QP state control: flush to ERR, query, reset and re-connect, retry a failed connect",
          "[issue8][qp]") {
  FakeVerbs f;
  f.query_qp_works = true;
  auto c = connect(f, true);
  auto st = c.qp.query_state();
  REQUIRE(st);
  CHECK(*st == QpState::rts);
  REQUIRE(c.qp.modify_to_error());
  CHECK(f.modify_attrs.back().qp_state == abi::IBV_QPS_ERR);
  CHECK(*c.qp.query_state() == QpState::error);
  const std::uint32_t qpn = c.qp.qp_num();

  auto again = std::move(c.qp).reset();
  REQUIRE(again);
  CHECK(c.qp.native_handle() == nullptr);
  CHECK(again->endpoint().qp_num == qpn); // the same QP, no destroy and re-create
  CHECK(f.modify_attrs[f.modify_attrs.size() - 2].qp_state == abi::IBV_QPS_RESET);
  CHECK(f.modify_attrs.back().qp_state == abi::IBV_QPS_INIT);
  CHECK(std::count(f.calls.begin(), f.calls.end(), "destroy_qp") == 0);
  Endpoint self = again->endpoint();
  auto back = std::move(*again).connect(self);
  REQUIRE(back);
  CHECK(*back->query_state() == QpState::rts);

  // A failed RTS leaves the prepared QP in INIT, so connect() can be retried on the same object.
  auto sel = c.ctx.gid_table(1)->first_ipv4_mapped();
  auto prep = QpRecipe::rdma_core_rc(*sel).prepare(c.pd, c.cq);
  REQUIRE(prep);
  f.modify_qp_rc[abi::IBV_QPS_RTS] = EINVAL;
  Endpoint peer = prep->endpoint();
  auto failed = std::move(*prep).connect(peer);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().step == Step::modify_qp_rts);
  CHECK(f.qp_state == abi::IBV_QPS_INIT);
  REQUIRE(prep->native_handle() != nullptr);
  f.modify_qp_rc[abi::IBV_QPS_RTS] = 0;
  auto retried = std::move(*prep).connect(peer);
  REQUIRE(retried);
}

namespace {
void set_rate_limit(Step step, QpTransition& t, void* user) {
  if (step != Step::modify_qp_rts) return;
  t.attr.rate_limit = *static_cast<unsigned*>(user);
  t.mask |= abi::IBV_QP_RATE_LIMIT;
}
} // namespace

TEST_CASE("finding 7: transport settings and a transition hook reach modify_qp", "[issue8][recipe]") {
  FakeVerbs f;
  f.device_names = {"mlx5_0"};
  auto ctx = Context::open(f.library(), "mlx5_0");
  auto pd = ctx->alloc_pd();
  auto cq = ctx->create_cq(16, CqWait::poll);
  auto sel = ctx->gid_table(1)->first_ipv4_mapped();
  QpTransport t;
  t.traffic_class = 106; // DSCP 26 << 2 | ECT(0)
  t.service_level = 3;
  t.flow_label = 0x12345;
  t.pkey_index = 2;
  t.timeout = 18;
  t.retry_cnt = 5;
  t.rnr_retry = 6;
  t.min_rnr_timer = 20;
  t.max_rd_atomic = 16;
  t.max_dest_rd_atomic = 8;
  unsigned rate = 1000;
  auto recipe = QpRecipe::rdma_core_rc(*sel).transport(t).on_transition(&set_rate_limit, &rate);
  const QpTransition init = recipe.init_transition();
  CHECK(init.attr.pkey_index == 2);
  auto prep = recipe.prepare(*pd, *cq);
  REQUIRE(prep);
  Endpoint self = prep->endpoint();
  auto qp = std::move(*prep).connect(self);
  REQUIRE(qp);
  REQUIRE(f.modify_attrs.size() == 3);
  const auto& rtr = f.modify_attrs[1];
  CHECK(rtr.ah_attr.grh.traffic_class == 106);
  CHECK(rtr.ah_attr.sl == 3);
  CHECK(rtr.ah_attr.grh.flow_label == 0x12345);
  CHECK(rtr.min_rnr_timer == 20);
  CHECK(rtr.max_dest_rd_atomic == 8);
  const auto& rts = f.modify_attrs[2];
  CHECK(rts.timeout == 18);
  CHECK(rts.retry_cnt == 5);
  CHECK(rts.rnr_retry == 6);
  CHECK(rts.max_rd_atomic == 16);
  CHECK(rts.rate_limit == 1000);
  CHECK((f.modify_masks[2] & abi::IBV_QP_RATE_LIMIT) != 0);
  // The defaults are the presets' old values.
  const QpTransport d;
  CHECK((d.timeout == 14 && d.retry_cnt == 7 && d.rnr_retry == 7 && d.min_rnr_timer == 12 && d.max_rd_atomic == 1));
}

TEST_CASE("finding 8: QpType::ud is refused before anything is created", "[issue8][recipe]") {
  FakeVerbs f;
  auto ctx = Context::open(f.library(), "rdma_en1");
  auto pd = ctx->alloc_pd();
  auto cq = ctx->create_cq(16, CqWait::poll);
  auto sel = ctx->gid_table(1)->first_ipv4_mapped();
  auto prep = QpRecipe::thunderbolt(*sel).qp_type(QpType::ud).prepare(*pd, *cq);
  REQUIRE_FALSE(prep);
  CHECK(prep.error().kind == ErrorKind::unsupported);
  CHECK(prep.error().step == Step::create_qp);
  CHECK(f.qps.empty());
}

TEST_CASE("finding 10: Library::symbol looks up what tbverbs does not wrap", "[issue8][loader]") {
  FakeVerbs f;
  auto none = f.library().symbol<int(abi::ibv_qp*)>("ibv_destroy_qp");
  REQUIRE_FALSE(none);
  CHECK(none.error().kind == ErrorKind::unsupported);
  auto lib = Library::load("libibverbs.so.1");
  if (!lib) SKIP("no libibverbs.so.1 here: " << lib.error().message());
  auto reg = lib->symbol<abi::ibv_mr*(abi::ibv_pd*, void*, std::size_t, std::uint64_t, int)>("ibv_reg_mr_iova2",
                                                                                           "IBVERBS_1.8");
  REQUIRE(reg);
  CHECK(*reg != nullptr);
  auto as_pointer = lib->symbol<int (*)(abi::ibv_qp*)>("ibv_destroy_qp");
  REQUIRE(as_pointer);
  auto missing = lib->symbol<void()>("ibv_no_such_function");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().kind == ErrorKind::symbol_missing);
  CHECK(std::string(missing.error().detail.view()).find("ibv_no_such_function") != std::string::npos);
}
