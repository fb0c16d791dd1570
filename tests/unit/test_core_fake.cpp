// Core handles, GID selection, recipes and endpoints driven through a fake function table.
#include "fake_verbs.hpp"

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <set>

using namespace tbverbs;
using fake::FakeVerbs;

namespace {

struct Stack {
  Context ctx;
  ProtectionDomain pd;
  CompletionQueue cq;
};

Stack open_stack(const Library& lib) {
  auto ctx = Context::open(lib, "rdma_en1");
  REQUIRE(ctx);
  auto pd = ctx->alloc_pd();
  REQUIRE(pd);
  auto cq = ctx->create_cq(64, false);
  REQUIRE(cq);
  return Stack{std::move(*ctx), std::move(*pd), std::move(*cq)};
}

GidTable table_with_ipv4_at(int index, int length = 16) {
  std::vector<Gid> g(static_cast<std::size_t>(length));
  g[0] = FakeVerbs::link_local();
  g[static_cast<std::size_t>(index)] = FakeVerbs::ipv4(169, 254, 10, static_cast<unsigned>(index));
  return GidTable::from_entries(1, g, Platform::apple, "rdma_en2");
}

} // namespace

TEST_CASE("the three errno conventions are kept apart", "[errors]") {
  FakeVerbs f;
  auto lib = f.library();
  SECTION("pointer-returning verbs report errno") {
    f.alloc_pd_errno = ENOMEM;
    auto ctx = Context::open(lib, "rdma_en1");
    REQUIRE(ctx);
    auto pd = ctx->alloc_pd();
    REQUIRE_FALSE(pd);
    CHECK(pd.error().step == Step::alloc_pd);
    CHECK(pd.error().is(ENOMEM));
    CHECK(pd.error().device.view() == "rdma_en1");
  }
  SECTION("post_* return the number, sign-normalised (Apple's -12)") {
    auto s = open_stack(lib);
    auto prep = QpRecipe::thunderbolt(*table_with_ipv4_at(1).first_ipv4_mapped()).prepare(s.pd, s.cq);
    REQUIRE(prep);
    Endpoint peer = prep->endpoint();
    auto qp = std::move(*prep).connect(peer);
    REQUIRE(qp);
    f.post_recv_rc = -ENOMEM;
    auto r = qp->recv(1, abi::ibv_sge{});
    REQUIRE_FALSE(r);
    CHECK(r.error().step == Step::post_recv);
    CHECK(r.error().sys_errno == ENOMEM);
    f.post_send_rc = EINVAL;
    auto s2 = qp->send(2, abi::ibv_sge{});
    REQUIRE_FALSE(s2);
    CHECK(s2.error().sys_errno == EINVAL);
    CHECK(s2.error().step == Step::post_send);
  }
  SECTION("poll_cq returns a negative number") {
    auto s = open_stack(lib);
    f.poll_rc = -EIO;
    WorkCompletion wc[4];
    auto r = s.cq.poll(wc);
    REQUIRE_FALSE(r);
    CHECK(r.error().step == Step::poll_cq);
    CHECK(r.error().sys_errno == EIO);
  }
}

TEST_CASE("poll hands out successes and reports a failed completion by name", "[cq]") {
  FakeVerbs f;
  auto s = open_stack(f.library());
  WorkCompletion wc[8];
  f.completions.push_back(fake::completion(7));
  f.completions.push_back(fake::completion(8));
  auto ok = s.cq.poll(wc);
  REQUIRE(ok);
  REQUIRE(*ok == 2);
  CHECK(wc[0].wr_id() == 7);
  CHECK(wc[1].byte_len() == 4096);
  CHECK(wc[1].is_recv());

  f.completions.push_back(fake::completion(9));
  f.completions.push_back(fake::completion(10, abi::IBV_WC_RETRY_EXC_ERR, 0xff));
  auto good = s.cq.poll(wc); // the success before the failure comes first (issue 8, finding 1)
  REQUIRE(good);
  REQUIRE(*good == 1);
  CHECK(wc[0].wr_id() == 9);
  auto bad = s.cq.poll(wc);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().kind == ErrorKind::wc_error);
  CHECK(bad.error().wc_status == abi::IBV_WC_RETRY_EXC_ERR);
  CHECK(bad.error().wr_id == 10);
  CHECK(bad.error().message().find("IBV_WC_RETRY_EXC_ERR") != std::string::npos);
}

TEST_CASE("wait returns a timeout instead of spinning for ever", "[cq]") {
  FakeVerbs f;
  auto s = open_stack(f.library());
  WorkCompletion wc[1];
  const auto start = std::chrono::steady_clock::now();
  auto r = s.cq.wait(wc, start + std::chrono::milliseconds(50));
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(r);
  CHECK(r.error().kind == ErrorKind::timeout);
  CHECK(took >= std::chrono::milliseconds(50));
  CHECK(took < std::chrono::seconds(5));
  f.completions.push_back(fake::completion(3));
  auto got = s.cq.wait(wc, std::chrono::steady_clock::now() + std::chrono::seconds(1));
  REQUIRE(got);
  CHECK(*got == 1);
}

TEST_CASE("device discovery errors", "[device]") {
  FakeVerbs f;
  SECTION("a wrong name lists the devices that exist and touches nothing else") {
    auto ctx = Context::open(f.library(), "rdma_en9");
    REQUIRE_FALSE(ctx);
    CHECK(ctx.error().kind == ErrorKind::device_not_found);
    const std::string m = ctx.error().message();
    CHECK(m.find("rdma_en1, rdma_en2") != std::string::npos);
    CHECK(ctx.error().platform == Platform::apple);
    CHECK(f.pds.empty());
  }
  SECTION("an empty list is the no-device error with the library's errno") {
    f.device_names.clear();
    f.list_errno = ENOSYS;
    auto list = DeviceList::get(f.library());
    REQUIRE_FALSE(list);
    CHECK(list.error().kind == ErrorKind::no_device);
    CHECK(list.error().is(ENOSYS));
    CHECK(list.error().diagnosis() != nullptr);
  }
  SECTION("TBVERBS_DEVICE picks the device when no name is given") {
    ::setenv("TBVERBS_DEVICE", "rdma_en2", 1);
    auto ctx = Context::open(f.library());
    ::unsetenv("TBVERBS_DEVICE");
    REQUIRE(ctx);
    CHECK(ctx->name() == "rdma_en2");
    CHECK(ctx->platform() == Platform::apple);
  }
}

TEST_CASE("a missing library is a named error", "[loader]") {
  auto lib = Library::load("/nonexistent/libibverbs-missing.so.1");
  REQUIRE_FALSE(lib);
  CHECK(lib.error().kind == ErrorKind::library_not_found);
  CHECK(lib.error().message().find("/nonexistent/libibverbs-missing.so.1") != std::string::npos);
}

TEST_CASE("GID selectors", "[gid]") {
  SECTION("only fe80:: entries: the error says the interface has no IPv4 address") {
    auto t = GidTable::from_entries(1, {FakeVerbs::link_local(), Gid(), Gid()}, Platform::apple, "rdma_en2");
    auto s = t.first_ipv4_mapped();
    REQUIRE_FALSE(s);
    CHECK(s.error().kind == ErrorKind::no_ipv4_gid);
    CHECK(s.error().message().find("no IPv4 address") != std::string::npos);
    CHECK(s.error().diagnosis() != nullptr);
  }
  SECTION("an empty table") {
    auto t = GidTable::from_entries(1, std::vector<Gid>(1024), Platform::apple);
    auto s = t.first_ipv4_mapped();
    REQUIRE_FALSE(s);
    CHECK(s.error().message().find("empty") != std::string::npos);
  }
  SECTION("a hole before the IPv4-mapped entry keeps indices") {
    std::vector<Gid> g(8);
    g[0] = FakeVerbs::link_local();
    g[5] = FakeVerbs::ipv4(10, 99, 0, 1);
    auto s = GidTable::from_entries(1, g).first_ipv4_mapped();
    REQUIRE(s);
    CHECK(s->index() == 5);
  }
  SECTION("a 1024-entry table with the entry near the end") {
    std::vector<Gid> g(1024);
    g[0] = FakeVerbs::link_local();
    g[1000] = FakeVerbs::ipv4(192, 168, 10, 2);
    auto t = GidTable::from_entries(1, g);
    CHECK(t.size() == 1024);
    auto s = t.first_ipv4_mapped();
    REQUIRE(s);
    CHECK(s->index() == 1000);
    CHECK(s->gid().ipv4() == ((192u << 24) | (168u << 16) | (10u << 8) | 2u));
  }
  SECTION("matching the bootstrap IPv4 address picks that cable's entry") {
    std::vector<Gid> g{FakeVerbs::link_local(), FakeVerbs::ipv4(10, 0, 0, 1), FakeVerbs::ipv4(10, 0, 1, 1)};
    auto t = GidTable::from_entries(1, g);
    auto s = t.matching_ipv4(*parse_ipv4("10.0.1.1"));
    REQUIRE(s);
    CHECK(s->index() == 2);
    auto none = t.matching_ipv4(*parse_ipv4("10.0.2.1"));
    REQUIRE_FALSE(none);
    CHECK(none.error().kind == ErrorKind::gid_not_found);
  }
  SECTION("an operator index is validated") {
    auto t = table_with_ipv4_at(2, 4);
    CHECK(t.at_index(2));
    CHECK(t.at_index(9).error().kind == ErrorKind::gid_index_invalid);
    CHECK(t.at_index(3).error().kind == ErrorKind::gid_index_invalid); // empty entry
    CHECK(t.at_index(0).error().kind == ErrorKind::gid_index_invalid); // link-local on Apple
    ::setenv("TBVERBS_GID_INDEX", "2", 1);
    auto env = t.select();
    ::setenv("TBVERBS_GID_INDEX", "two", 1);
    auto junk = t.select();
    ::unsetenv("TBVERBS_GID_INDEX");
    REQUIRE(env);
    CHECK(env->index() == 2);
    CHECK(env->reason() == "operator override");
    REQUIRE_FALSE(junk);
    CHECK(junk.error().kind == ErrorKind::gid_index_invalid);
  }
}

TEST_CASE("Gid values", "[gid]") {
  auto g = Gid::parse("::ffff:169.254.10.1");
  REQUIRE(g);
  CHECK(g->is_ipv4_mapped());
  CHECK_FALSE(g->is_link_local());
  CHECK(ipv4_to_string(g->ipv4()) == "169.254.10.1");
  CHECK(g->to_string() == "::ffff:169.254.10.1");
  CHECK(Gid::parse("fe80::1234")->is_link_local());
  CHECK(Gid().is_zero());
  CHECK_FALSE(Gid::parse("not a gid"));
}

TEST_CASE("the RTR sgid_index and the advertised GID come from one selection", "[recipe]") {
  for (int index : {1, 2, 7}) {
    CAPTURE(index);
    auto table = table_with_ipv4_at(index);
    auto sel = table.first_ipv4_mapped();
    REQUIRE(sel);
    auto recipe = QpRecipe::thunderbolt(*sel);
    Endpoint remote = recipe.local_endpoint(0x99, 0x1234);
    remote.gid = FakeVerbs::ipv4(169, 254, 10, 99);
    const auto built = recipe.rtr_transition(remote);
    REQUIRE(built);
    const QpTransition& rtr = *built;
    const Endpoint mine = recipe.local_endpoint(0x42, 7);
    CHECK(rtr.attr.ah_attr.grh.sgid_index == index);
    CHECK(mine.gid == table.at(rtr.attr.ah_attr.grh.sgid_index));
    CHECK(rtr.attr.ah_attr.is_global == 1);
    CHECK(rtr.attr.ah_attr.grh.hop_limit == 1);
    CHECK(rtr.attr.path_mtu == abi::IBV_MTU_1024);
    CHECK(rtr.attr.dest_qp_num == 0x99);
    CHECK(rtr.attr.rq_psn == 0x1234);
    CHECK(Gid(std::to_array(rtr.attr.ah_attr.grh.dgid.raw)) == remote.gid);
  }
}

TEST_CASE("presets", "[recipe]") {
  auto sel = *table_with_ipv4_at(1).first_ipv4_mapped();
  auto tb = QpRecipe::thunderbolt(sel);
  CHECK(tb.type() == QpType::uc);
  CHECK(tb.path_mtu() == Mtu::mtu1024);
  CHECK_FALSE(tb.rdma_write_allowed());
  CHECK(tb.init_attributes().qp_type == abi::IBV_QPT_UC);
  CHECK((tb.rts_transition(5).mask & abi::IBV_QP_RNR_RETRY) == 0);
  auto rc = QpRecipe::rdma_core_rc(sel);
  CHECK(rc.type() == QpType::rc);
  CHECK(rc.rdma_write_allowed());
  const auto rts = rc.rts_transition(0x1ffffff);
  CHECK(rts.attr.rnr_retry == 7);
  CHECK(rts.attr.sq_psn == 0xffffff);
  CHECK((rc.rtr_transition(rc.local_endpoint(1, 2))->mask & abi::IBV_QP_MIN_RNR_TIMER) != 0);
}

TEST_CASE("prepare and connect drive the driver with the selection's index", "[recipe]") {
  FakeVerbs f;
  f.gids = {FakeVerbs::link_local(), Gid(), FakeVerbs::ipv4(169, 254, 3, 1)};
  f.granted_send_wr = 100;
  auto s = open_stack(f.library());
  auto table = s.ctx.gid_table(1);
  REQUIRE(table);
  auto sel = table->first_ipv4_mapped();
  REQUIRE(sel);
  REQUIRE(sel->index() == 2);
  auto prep = QpRecipe::thunderbolt(*sel).capacities({512, 512, 1, 1, 0}).prepare(s.pd, s.cq);
  REQUIRE(prep);
  CHECK(prep->capacities().max_send_wr == 100); // what the driver granted, not what was asked
  CHECK(prep->endpoint().gid == f.gids[2]);
  CHECK(prep->endpoint().psn <= 0xffffff);
  Endpoint remote = prep->endpoint();
  remote.gid = FakeVerbs::ipv4(169, 254, 3, 2);
  auto qp = std::move(*prep).connect(remote);
  REQUIRE(qp);
  REQUIRE(f.modify_attrs.size() == 3); // INIT, RTR, RTS
  CHECK(f.modify_attrs[1].qp_state == abi::IBV_QPS_RTR);
  CHECK(f.modify_attrs[1].ah_attr.grh.sgid_index == 2);
  CHECK(f.modify_attrs[2].qp_state == abi::IBV_QPS_RTS);
  CHECK(f.modify_attrs[2].sq_psn == remote.psn);
}

TEST_CASE("RTR failures carry errno, context and the diagnosis", "[recipe]") {
  FakeVerbs f;
  f.modify_qp_rc[abi::IBV_QPS_RTR] = EINVAL;
  auto s = open_stack(f.library());
  auto sel = s.ctx.gid_table(1)->first_ipv4_mapped();
  REQUIRE(sel);
  auto prep = QpRecipe::thunderbolt(*sel).prepare(s.pd, s.cq);
  REQUIRE(prep);
  Endpoint remote = prep->endpoint();
  auto qp = std::move(*prep).connect(remote);
  REQUIRE_FALSE(qp);
  CHECK(qp.error().step == Step::modify_qp_rtr);
  CHECK(qp.error().is(EINVAL));
  CHECK(qp.error().gid_index == 1);
  CHECK(qp.error().port == 1);
  CHECK(qp.error().diagnosis() != nullptr);
}

TEST_CASE("connect refuses a peer that cannot work", "[recipe]") {
  FakeVerbs f;
  auto s = open_stack(f.library());
  auto sel = *s.ctx.gid_table(1)->first_ipv4_mapped();
  SECTION("unset GID") {
    auto prep = QpRecipe::thunderbolt(sel).prepare(s.pd, s.cq);
    REQUIRE(prep);
    Endpoint remote = prep->endpoint();
    remote.gid = Gid();
    auto qp = std::move(*prep).connect(remote);
    REQUIRE_FALSE(qp);
    CHECK(qp.error().kind == ErrorKind::incompatible_peer);
  }
  SECTION("other QP type") {
    auto prep = QpRecipe::thunderbolt(sel).prepare(s.pd, s.cq);
    REQUIRE(prep);
    Endpoint remote = prep->endpoint();
    remote.qp_type = QpType::rc;
    CHECK(std::move(*prep).connect(remote).error().kind == ErrorKind::incompatible_peer);
  }
  SECTION("a GID entry that changed since selection is stale") {
    auto prep = QpRecipe::thunderbolt(sel).prepare(s.pd, s.cq);
    REQUIRE(prep);
    Endpoint remote = prep->endpoint();
    f.gids[1] = FakeVerbs::ipv4(10, 9, 9, 9); // the address changed under us
    auto qp = std::move(*prep).connect(remote);
    REQUIRE_FALSE(qp);
    CHECK(qp.error().kind == ErrorKind::gid_stale);
    CHECK(qp.error().message().find("10.9.9.9") != std::string::npos);
  }
}

TEST_CASE("PSNs are 24-bit and differ per QP", "[recipe]") {
  FakeVerbs f;
  auto s = open_stack(f.library());
  auto sel = *s.ctx.gid_table(1)->first_ipv4_mapped();
  std::set<std::uint32_t> seen;
  std::vector<PreparedQueuePair> keep;
  for (int i = 0; i < 8; ++i) {
    auto prep = QpRecipe::thunderbolt(sel).prepare(s.pd, s.cq);
    REQUIRE(prep);
    CHECK(prep->endpoint().psn <= 0xffffff);
    seen.insert(prep->endpoint().psn);
    keep.push_back(std::move(*prep));
  }
  CHECK(seen.size() == 8);
}

TEST_CASE("children die before parents whatever order handles are dropped in", "[handles]") {
  FakeVerbs f;
  std::optional<Stack> s(open_stack(f.library()));
  auto buf = AlignedBuffer::allocate(100);
  REQUIRE(buf);
  CHECK(buf->size() % AlignedBuffer::page_size() == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(buf->data()) % AlignedBuffer::page_size() == 0);
  std::optional<MemoryRegion> mr(*s->pd.reg_mr(*buf));
  CHECK(s->ctx.info()->memory_regions.load() == 1);
  auto busy = s->pd.close();
  REQUIRE_FALSE(busy);
  CHECK(busy.error().is(EBUSY));
  CHECK(std::find(f.calls.begin(), f.calls.end(), "dealloc_pd") == f.calls.end());
  s.reset(); // drop context, PD and CQ handles first: nothing may be destroyed under the MR
  CHECK(std::find(f.calls.begin(), f.calls.end(), "dealloc_pd") == f.calls.end());
  CHECK(std::find(f.calls.begin(), f.calls.end(), "destroy_cq") != f.calls.end());
  mr.reset();
  REQUIRE(f.calls.size() >= 4);
  const auto pos = [&](const char* n) { return std::find(f.calls.begin(), f.calls.end(), n) - f.calls.begin(); };
  CHECK(pos("dereg_mr") < pos("dealloc_pd"));
  CHECK(pos("dealloc_pd") < pos("close_device"));
}

TEST_CASE("memory-region slices are bounds-checked", "[handles]") {
  FakeVerbs f;
  auto s = open_stack(f.library());
  auto buf = *AlignedBuffer::allocate(8192);
  auto mr = s.pd.reg_mr(buf);
  REQUIRE(mr);
  auto ok = mr->sge(4096, 4096);
  REQUIRE(ok);
  CHECK(ok->lkey == mr->lkey());
  CHECK(ok->addr == reinterpret_cast<std::uintptr_t>(buf.data()) + 4096);
  CHECK_FALSE(mr->sge(4097, 4096));
  CHECK_FALSE(mr->sge(8193, 0));
  f.reg_mr_errno = ENOMEM;
  auto no = s.pd.reg_mr(buf);
  REQUIRE_FALSE(no);
  CHECK(no.error().is(ENOMEM));
  CHECK(no.error().message().find("1 regions already registered") != std::string::npos);
}

TEST_CASE("rdma_write is refused where the profile does not execute it", "[recipe]") {
  FakeVerbs f;
  auto s = open_stack(f.library());
  auto sel = *s.ctx.gid_table(1)->first_ipv4_mapped();
  auto prep = QpRecipe::thunderbolt(sel).prepare(s.pd, s.cq);
  REQUIRE(prep);
  auto qp = std::move(*prep).connect(prep->endpoint());
  REQUIRE(qp);
  auto w = qp->rdma_write(1, abi::ibv_sge{}, 0x1000, 5);
  REQUIRE_FALSE(w);
  CHECK(w.error().kind == ErrorKind::unsupported);
}

TEST_CASE("endpoint wire form", "[endpoint]") {
  Endpoint e;
  e.qp_num = 0xabcdef;
  e.psn = 0x123456;
  e.lid = 7;
  e.mtu = Mtu::mtu4096;
  e.qp_type = QpType::rc;
  e.caps = EndpointCaps::rdma_write;
  e.gid = FakeVerbs::ipv4(10, 1, 2, 3);
  auto w = e.serialize();
  auto back = Endpoint::parse(w);
  REQUIRE(back);
  CHECK(*back == e);

  auto kind_of = [](std::span<const std::byte> b) { return Endpoint::parse(b).error().message(); };
  CHECK(kind_of(std::span(w).first(20)).find("truncated") != std::string::npos);
  auto foreign = w;
  foreign[0] = std::byte{'X'};
  CHECK(kind_of(foreign).find("foreign") != std::string::npos);
  auto corrupt = w;
  corrupt[30] ^= std::byte{1};
  CHECK(kind_of(corrupt).find("checksum") != std::string::npos);
  auto newer = w;
  newer[5] = std::byte{9};
  CHECK(kind_of(newer).find("newer") != std::string::npos);
  auto swapped = w;
  std::swap(swapped[6], swapped[7]);
  CHECK(kind_of(swapped).find("byte order") != std::string::npos);
  CHECK(Endpoint::parse(corrupt).error().kind == ErrorKind::bad_frame);
}

TEST_CASE("a CQ without a channel says so instead of blocking", "[cq]") {
  FakeVerbs f; // the fake library has no completion channels: create_cq falls back to none
  auto ctx = Context::open(f.library(), "rdma_en1");
  REQUIRE(ctx);
  auto cq = ctx->create_cq(16, true);
  REQUIRE(cq);
  CHECK_FALSE(cq->has_channel());
  CHECK(cq->channel_fd() == -1);
  auto armed = cq->arm();
  REQUIRE_FALSE(armed);
  CHECK(armed.error().kind == ErrorKind::unsupported);
  CHECK(cq->consume_event().error().kind == ErrorKind::unsupported);
}
