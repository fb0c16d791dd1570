// Resource budgets (budget.hpp): a job's needs on one device against its caps, before anything
// is created; every shortfall listed.
#include <tbverbs/budget.hpp>

#include <catch2/catch_test_macros.hpp>

#include <string>

using namespace tbverbs;

namespace {
DeviceLimits thunderbolt() {
  DeviceAttributes a; // public `ibv_devinfo -v` of macOS 26.x (docs/field-reports.md section 4b)
  a.max_qp = 11;
  a.max_cq = 11;
  a.max_mr = 100;
  a.max_mr_size = 16'384'000;
  a.max_qp_wr = 4095;
  return DeviceLimits::from(a, 11, Platform::apple, "rdma_en2");
}
} // namespace

TEST_CASE("Thunderbolt limits: 10 usable QPs whatever max_qp says, depths in frames", "[budget]") {
  const DeviceLimits l = thunderbolt();
  CHECK(l.qps == 10);
  CHECK(l.cqs == 11);
  CHECK(l.pds == 11);
  CHECK(l.mrs == 100);
  CHECK(l.frames);
  CHECK(l.max_depth == 4095);
}

TEST_CASE("a ring rank's job fits a Thunderbolt device", "[budget]") {
  JobShape s;
  s.links = 2;
  s.message_bytes = 256 * 1024;
  s.window = 7;
  s.buffers = {64u << 20, 64u << 20, 2 * 14 * 256 * 1024 + 4096};
  auto n = JobNeeds::of(s, thunderbolt());
  REQUIRE(n);
  CHECK(n->qps == 2);
  CHECK(n->cqs == 2);
  CHECK(n->pds == 1);
  CHECK(n->depth == 64 * 14 + 64);
  CHECK(n->mrs == 2 + 5 + 5 + 1); // warm-ups, then 64 MiB in regions of at most max_mr_size
  CHECK(shortfalls(*n, thunderbolt()).empty());
  CHECK(check_budget(*n, thunderbolt()));
  CHECK(budget_summary(*n, thunderbolt()).find("2 of 10 QPs, 2 of 11 CQs, 1 of 11 PDs, 13 of 100 MRs") == 0);
}

TEST_CASE("a job that does not fit lists every shortfall", "[budget]") {
  JobShape s;
  s.links = 12;            // a mesh of 13 Macs on one device
  s.message_bytes = 1u << 20;
  s.window = 8;            // 256 frames x 17 > 4095
  s.buffers = {1u << 30, 1u << 30};  // 2 x 70 regions + 12 warm-ups > 100
  auto n = JobNeeds::of(s, thunderbolt());
  REQUIRE(n);
  const auto sf = shortfalls(*n, thunderbolt());
  REQUIRE(sf.size() == 4);
  CHECK(sf[0].what == "QPs");
  CHECK(sf[0].need == 12);
  CHECK(sf[0].allows == 10);
  CHECK(sf[1].what == "CQs");
  CHECK(sf[2].what == "MRs");
  CHECK(sf[3].what == "frames per queue");
  CHECK(sf[3].to_string().find("at most 4095") != std::string::npos);
  auto r = check_budget(*n, thunderbolt());
  REQUIRE_FALSE(r);
  CHECK(r.error().is(ErrorKind::capacity));
  const std::string d(r.error().detail.view());
  CHECK(d.find("QPs: needs 12, allows 10") != std::string::npos);
  CHECK(d.find("CQs: needs 12, allows 11") != std::string::npos);
  CHECK(d.find("MRs: needs") != std::string::npos);
  CHECK(d.find("frames per queue: needs 4352, allows 4095") != std::string::npos);
}

TEST_CASE("what this process already holds counts against the caps", "[budget]") {
  DeviceLimits l = thunderbolt();
  l.qps_in_use = 9;
  l.mrs_in_use = 99;
  JobNeeds n;
  n.qps = 2;
  n.mrs = 2;
  const auto sf = shortfalls(n, l);
  REQUIRE(sf.size() == 2);
  CHECK(sf[0].allows == 1);
  CHECK(sf[1].allows == 1);
}

TEST_CASE("unknown limits are never short; rdma-core counts work requests", "[budget]") {
  DeviceAttributes a;
  a.max_qp = 256;
  a.max_qp_wr = 4096;
  const DeviceLimits l = DeviceLimits::from(a, 0, Platform::rdma_core, "mlx5_0");
  CHECK_FALSE(l.frames);
  JobShape s;
  s.links = 4;
  s.message_bytes = 1u << 20;
  s.window = 8;
  auto n = JobNeeds::of(s, l);
  REQUIRE(n);
  CHECK(n->depth == 17); // WRs, not frames
  CHECK(shortfalls(*n, l).empty());
}

TEST_CASE("a link's CQ must hold both queues' depths: more than max_cqe is a shortfall, not a failed create_cq", "[budget]") {
  // A window of 16 messages of 256 KiB on Thunderbolt: 64 x 33 = 2112 frames per queue fit 4095,
  // but the link's CQ would need 2 x 2112 + 16 = 4240 entries.
  DeviceLimits l = thunderbolt();
  l.cq_entries = 4096;
  JobShape s;
  s.links = 2;
  s.message_bytes = 256 * 1024;
  s.window = 16;
  auto n = JobNeeds::of(s, l);
  REQUIRE(n);
  CHECK(n->depth == 2112);
  CHECK(n->cq_entries == link_cq_entries(2112, 2112));
  CHECK(n->cq_entries == 4240);
  const auto sf = shortfalls(*n, l);
  REQUIRE(sf.size() == 1);
  CHECK(sf[0].what == "CQ entries");
  CHECK(sf[0].allows == 4096);
  auto r = check_budget(*n, l);
  REQUIRE_FALSE(r);
  CHECK(std::string(r.error().detail.view()).find("CQ entries: needs 4240, allows 4096") != std::string::npos);
  s.window = 15; // 64 x 31 = 1984 frames: 3984 entries fit
  auto fits = JobNeeds::of(s, l);
  REQUIRE(fits);
  CHECK(shortfalls(*fits, l).empty());
  CHECK(budget_summary(*fits, l).find("3984 of 4096 CQ entries") != std::string::npos);
}
