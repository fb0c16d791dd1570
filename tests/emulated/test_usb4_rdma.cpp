// The usb4-rdma profile (issue 21): the Linux Thunderbolt driver of hellas-ai/thunderbolt-ibverbs
// as its kernel/ibdev.c reports and enforces it, natively between Linux hosts (RC and UC) and in
// its Apple-compatible transport toward a Mac (UC, SEND only, 16 MiB). Every value checked here
// is cited line by line in docs/emulator.md, "The usb4-rdma profile".
#include "emu_fixture.hpp"

#include <tbverbs/link_offer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <utility>

using namespace emu_test;

namespace {

PortSpec linux_port(const std::string& host, const std::string& device, const std::string& cidr) {
  PortSpec p{host, device, cidr};
  p.profile = "usb4-rdma";
  return p;
}

// A raw send work request of one SGE (the driver's answer, not tbverbs' checks).
int raw_post(tbverbs::QueuePair& qp, tbverbs::abi::ibv_wr_opcode op, const tbverbs::abi::ibv_sge& sge,
             unsigned flags = tbverbs::abi::IBV_SEND_SIGNALED) {
  tbverbs::abi::ibv_sge s = sge;
  tbverbs::abi::ibv_send_wr wr{};
  wr.wr_id = 7;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = flags;
  auto r = qp.post_send(wr);
  return r ? 0 : r.error().sys_errno;
}

} // namespace

TEST_CASE("usb4-rdma reports what hellas-ai's ibdev.c reports", "[usb4][profile]") {
  EnvGuard gi("TBVERBS_GID_INDEX", "");
  Fabric fabric(linux_port("a", "usb4_rdma0", "10.0.0.1/30"), linux_port("b", "usb4_rdma0", "10.0.0.2/30"), "usb4-rdma");
  Side a = Side::open(fabric, fabric.a());
  CHECK(a.ctx.platform() == tbverbs::Platform::rdma_core); // an rdma-core provider: transport IB, not 100
  const tbverbs::DeviceAttributes d = ok(a.ctx.query_device());
  CHECK(d.max_qp == 256);
  CHECK(d.max_qp_wr == 1024);
  CHECK(d.max_cq == 256);
  CHECK(d.max_cqe == 4096);
  CHECK(d.max_sge == 4);
  CHECK(d.max_mr == 1024); // max_pd 256, max_qp_rd_atom 128, atomic_cap NONE: emulator.ibv_devinfo_usb4_rdma
  const tbverbs::PortAttributes port = ok(a.ctx.query_port(1));
  CHECK(port.active_mtu == tbverbs::Mtu::mtu4096);
  CHECK(port.link_layer == tbverbs::LinkLayer::ethernet);
  CHECK(port.gid_table_length == 8);
  CHECK(port.max_msg_sz == 16u * 1024 * 1024);
  // RoCE v2 only: fe80:: at 0, the cable's IPv4 address at 1, behind the Thunderbolt netdev.
  const tbverbs::GidTable t = ok(a.ctx.gid_table(1));
  CHECK(t.size() == 8);
  CHECK(t.type_at(1) == tbverbs::GidType::roce_v2);
  const tbverbs::GidSelection s = ok(t.select());
  CHECK(s.index() == 1);
  CHECK(s.gid() == *tbverbs::Gid::parse("::ffff:10.0.0.1"));
  CHECK(t.netdev_at(1) == "thunderbolt0");
}

TEST_CASE("usb4-rdma between Linux hosts: RC and UC; UD, deep queues and wide receives refused", "[usb4][profile]") {
  EnvGuard gi("TBVERBS_GID_INDEX", "");
  Fabric fabric(linux_port("a", "usb4_rdma0", "10.0.0.1/30"), linux_port("b", "usb4_rdma0", "10.0.0.2/30"), "usb4-rdma");
  Side a = Side::open(fabric, fabric.a(), tbverbs::Access::local_write | tbverbs::Access::remote_write);
  Side b = Side::open(fabric, fabric.b(), tbverbs::Access::local_write | tbverbs::Access::remote_write);
  { // UD, which tbverbs' recipes never make: the driver's own answer (ibdev.c tbv_create_qp).
    tbverbs::abi::ibv_qp_init_attr init{};
    init.qp_type = tbverbs::abi::IBV_QPT_UD;
    init.send_cq = init.recv_cq = a.cq.native_handle();
    init.cap = {16, 16, 1, 1, 0};
    errno = 0;
    CHECK(a.ctx.info()->api->create_qp(a.pd.native_handle(), &init) == nullptr);
    CHECK(errno == EOPNOTSUPP);
  }
  CHECK(err(tbverbs::QpRecipe::rdma_core_rc(a.select()).capacities({1025, 16, 1, 1, 0}).prepare(a.pd, a.cq)).sys_errno ==
        EINVAL);
  Pair p = connect(a, b, [](const tbverbs::GidSelection& g) { return tbverbs::QpRecipe::rdma_core_rc(g); });
  // RC SEND and RDMA WRITE move data; atomics and inline sends are refused at post (EOPNOTSUPP).
  ok(p.b.recv(1, ok(b.mr.sge(0, 4096))));
  std::memset(a.mr.data(), 0x3c, 8192);
  ok(p.a.send(2, ok(a.mr.sge(0, 4096))));
  CHECK(wait_one(b.cq).byte_len() == 4096);
  CHECK(wait_one(a.cq).wr_id() == 2);
  CHECK(b.mr.data()[4095] == std::byte{0x3c});
  CHECK(raw_post(p.a, tbverbs::abi::IBV_WR_SEND, ok(a.mr.sge(0, 64)),
                 tbverbs::abi::IBV_SEND_SIGNALED | tbverbs::abi::IBV_SEND_INLINE) == EOPNOTSUPP);
  CHECK(raw_post(p.a, tbverbs::abi::IBV_WR_ATOMIC_FETCH_AND_ADD, ok(a.mr.sge(0, 8))) == EOPNOTSUPP);
  // Longer than max_msg_sz (16 MiB): refused at post, EMSGSIZE (tbv_prepare_send_segments), not a completion error.
  tbverbs::abi::ibv_sge huge = ok(a.mr.sge(0, 64));
  huge.length = (16u << 20) + 1;
  CHECK(raw_post(p.a, tbverbs::abi::IBV_WR_SEND, huge) == EMSGSIZE);
  // post_recv takes one SGE whatever max_recv_sge says (ibdev.c tbv_post_recv).
  tbverbs::abi::ibv_sge two[2] = {ok(b.mr.sge(0, 64)), ok(b.mr.sge(64, 64))};
  tbverbs::abi::ibv_recv_wr rwr{};
  rwr.sg_list = two;
  rwr.num_sge = 2;
  CHECK(err(p.b.post_recv(rwr)).sys_errno == EINVAL);
}

TEST_CASE("usb4-rdma toward a Mac: Apple's UC, SEND only, one QP, 16 MiB; early sends wait for a receive",
          "[usb4][profile][mixed]") {
  EnvGuard gi("TBVERBS_GID_INDEX", "");
  PortSpec mac{"mac", "rdma_en1", "10.0.0.1/30"};
  Fabric fabric(mac, linux_port("linux", "usb4_rdma0", "10.0.0.2/30"), "thunderbolt");
  Side m = Side::open(fabric, fabric.a());
  Side l = Side::open(fabric, fabric.b());
  CHECK(ok(l.ctx.query_port(1)).max_msg_sz == 16u * 1024 * 1024);
  // RC is refused on the Linux end (ibdev.c tbv_create_qp: -EOPNOTSUPP in the Apple-compatible mode).
  CHECK(err(tbverbs::QpRecipe::rdma_core_rc(l.select()).prepare(l.pd, l.cq)).sys_errno == EOPNOTSUPP);
  // UC on both ends: what agree() picks for this link.
  auto pm = ok(tbverbs::QpRecipe::thunderbolt(m.select()).prepare(m.pd, m.cq));
  auto pl = ok(tbverbs::QpRecipe::rdma_core_rc(l.select()).qp_type(tbverbs::QpType::uc).allow_rdma_write(false).prepare(l.pd, l.cq));
  // One QP per device toward a Mac.
  CHECK(err(tbverbs::QpRecipe::rdma_core_rc(l.select()).qp_type(tbverbs::QpType::uc).prepare(l.pd, l.cq)).sys_errno == EBUSY);
  const tbverbs::Endpoint em = ok(tbverbs::Endpoint::parse(pm.endpoint().serialize()));
  const tbverbs::Endpoint el = ok(tbverbs::Endpoint::parse(pl.endpoint().serialize()));
  tbverbs::QueuePair qm = ok(std::move(pm).connect(el)); // Thunderbolt facing Ethernet (RoCE v2): one cable
  tbverbs::QueuePair ql = ok(std::move(pl).connect(em));

  SECTION("a Mac's send before the Linux receive is buffered, then delivered (ibdev.c early Apple receives)") {
    std::memset(m.mr.data(), 0x77, 4096);
    ok(qm.send(1, ok(m.mr.sge(0, 4096))));
    ok(ql.recv(2, ok(l.mr.sge(0, 8192)))); // a larger receive is fine on Linux: no frame pairing there
    const tbverbs::WorkCompletion wc = wait_one(l.cq);
    CHECK(wc.wr_id() == 2);
    CHECK(wc.byte_len() == 4096);
    CHECK(l.mr.data()[4095] == std::byte{0x77});
  }
  SECTION("Linux to the Mac: SEND only; the Mac's receive pairs frames") {
    CHECK(raw_post(ql, tbverbs::abi::IBV_WR_RDMA_WRITE, ok(l.mr.sge(0, 4096))) == EOPNOTSUPP);
    CHECK(raw_post(ql, tbverbs::abi::IBV_WR_SEND_WITH_IMM, ok(l.mr.sge(0, 4096))) == EOPNOTSUPP);
    ok(qm.recv(3, ok(m.mr.sge(0, 8192)))); // two frames, for a one-frame send: the Mac's rule fails it
    ok(ql.send(4, ok(l.mr.sge(0, 4096))));
    tbverbs::WorkCompletion wc[1];
    const tbverbs::Error e = err(m.cq.wait(wc, std::chrono::steady_clock::now() + std::chrono::seconds(5)));
    CHECK(e.kind == tbverbs::ErrorKind::wc_error);
    CHECK(e.wc_status == tbverbs::wc::loc_len_err);
    CHECK(wait_one(l.cq).wr_id() == 4); // UC: the sender learns nothing of it
  }
}

TEST_CASE("LinkOffer: the wire form round-trips and refuses what no valid peer sends", "[usb4][negotiation]") {
  tbverbs::LinkOffer o;
  o.transports = tbverbs::Transports::rc_uc;
  o.ops = tbverbs::SendOps::reliable_connected;
  o.depth_unit = tbverbs::DepthUnit::work_requests;
  o.max_depth = 1024;
  o.max_message = 16u << 20;
  o.platform = tbverbs::Platform::rdma_core;
  o.device.assign("usb4_rdma1");
  const auto w = o.serialize();
  const tbverbs::LinkOffer back = ok(tbverbs::LinkOffer::parse(w));
  CHECK(back.transports == o.transports);
  CHECK(back.ops == o.ops);
  CHECK(back.max_depth == 1024);
  CHECK(back.max_message == o.max_message);
  CHECK(back.platform == tbverbs::Platform::rdma_core);
  CHECK(back.device.view() == "usb4_rdma1");
  for (std::size_t i = 0; i < w.size(); ++i) { // every flipped byte is caught (the CRC covers the rest)
    auto bad = w;
    bad[i] ^= std::byte{0x41};
    CHECK(err(tbverbs::LinkOffer::parse(bad)).kind == tbverbs::ErrorKind::bad_frame);
  }
  CHECK(err(tbverbs::LinkOffer::parse(std::span<const std::byte>(w).first(63))).kind == tbverbs::ErrorKind::bad_frame);
  // Issue 38: a device name is a name; one with a control character (valid CRC) is refused.
  o.device.assign("usb4\x1b[2J");
  const tbverbs::Error forged = err(tbverbs::LinkOffer::parse(o.serialize()));
  CHECK(forged.kind == tbverbs::ErrorKind::bad_frame);
  CHECK(std::string(forged.detail.view()).find('\x1b') == std::string::npos);
}

TEST_CASE("agree(): RC between Linux hosts, Apple's UC toward a Mac, the same choice from both ends", "[usb4][negotiation]") {
  tbverbs::LinkOffer mac, linux_host, uc_only;
  mac.transports = tbverbs::Transports::uc;
  mac.ops = tbverbs::SendOps::send;
  mac.depth_unit = tbverbs::DepthUnit::frames;
  mac.max_message = 16773120;
  mac.platform = tbverbs::Platform::apple;
  mac.device.assign("rdma_en2");
  linux_host.transports = tbverbs::Transports::rc_uc;
  linux_host.ops = tbverbs::SendOps::reliable_connected;
  linux_host.max_message = 16u << 20;
  linux_host.platform = tbverbs::Platform::rdma_core;
  linux_host.device.assign("usb4_rdma0");
  uc_only = linux_host;
  uc_only.transports = tbverbs::Transports::uc;
  uc_only.ops = tbverbs::SendOps::unreliable_connected;

  const auto ll = ok(tbverbs::agree(linux_host, linux_host));
  CHECK(ll.type == tbverbs::QpType::rc);
  CHECK(tbverbs::contains(ll.ops, tbverbs::SendOp::rdma_read));
  CHECK_FALSE(ll.equal_frames);
  for (const auto& [x, y] : {std::pair{mac, linux_host}, std::pair{linux_host, mac}}) {
    const auto a = ok(tbverbs::agree(x, y));
    CHECK(a.type == tbverbs::QpType::uc);
    CHECK(a.ops == tbverbs::SendOps::send);
    CHECK(a.equal_frames);
    CHECK(a.max_message == 16773120);
    CHECK(a.why.find("rdma_en2 (Apple's Thunderbolt driver) runs UC only") != std::string::npos);
  }
  const auto lu = ok(tbverbs::agree(linux_host, uc_only));
  CHECK(lu.type == tbverbs::QpType::uc);
  CHECK(tbverbs::contains(lu.ops, tbverbs::SendOp::rdma_write));
  CHECK_FALSE(tbverbs::contains(lu.ops, tbverbs::SendOp::rdma_read)); // UC has no READ
  tbverbs::LinkOffer rc_only = linux_host;
  rc_only.transports = tbverbs::Transports::rc;
  const tbverbs::Error e = err(tbverbs::agree(rc_only, mac));
  CHECK(e.kind == tbverbs::ErrorKind::unsupported);
  CHECK(std::string(e.detail.view()).find("RC only") != std::string::npos);
}
