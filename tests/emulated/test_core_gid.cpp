// Core library over the emulated Thunderbolt profile: GID tables, selection, the operator
// override, and selections that go stale when an address changes.
#include "emu_fixture.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cerrno>
#include <cstring>
#include <string>

using namespace emu_test;
using Catch::Matchers::ContainsSubstring;

namespace {
PortSpec host_a(std::optional<std::string> ip = "10.99.0.1/30") { return {"hostA", "rdma_en1", std::move(ip)}; }
PortSpec host_b(std::optional<std::string> ip = "10.99.0.2/30") { return {"hostB", "rdma_en1", std::move(ip)}; }
} // namespace

TEST_CASE("core/gid: Thunderbolt table has 1024 entries, fe80 at 0, ::ffff at 1 once the port has an IPv4 address",
          "[core][gid]") {
  Fabric fabric(host_a(std::nullopt), host_b());
  fabric.use("hostA");
  const auto lib = emulator();
  auto ctx = ok(tbverbs::Context::open(lib, "rdma_en1"));
  CHECK(ctx.platform() == tbverbs::Platform::apple);

  const auto port = ok(ctx.query_port(1));
  CHECK(port.gid_table_length == 1024);
  CHECK(port.state == tbverbs::PortState::active);

  // No address yet: only the link-local entry.
  {
    const auto table = ok(ctx.gid_table(1));
    REQUIRE(table.size() == 1024);
    CHECK(table.at(0).is_link_local());
    CHECK(table.at(1).is_zero());
    int populated = 0;
    for (const auto& g : table.entries()) populated += g.is_zero() ? 0 : 1;
    CHECK(populated == 1);
  }

  // The interface gets 169.254.10.1: ::ffff:169.254.10.1 appears at index 1.
  fabric.set_ipv4(fabric.a(), "169.254.10.1/16");
  const auto table = ok(ctx.gid_table(1));
  REQUIRE(table.size() == 1024);
  CHECK(table.at(0).is_link_local());
  CHECK(table.at(1).is_ipv4_mapped());
  CHECK(table.at(1).to_string() == "::ffff:169.254.10.1");
  CHECK(table.at(1).ipv4() == ok(tbverbs::parse_ipv4("169.254.10.1")));
  CHECK(table.at(2).is_zero());

  const auto sel = ok(table.select());
  CHECK(sel.index() == 1);
  CHECK(sel.port() == 1);
  CHECK(sel.gid() == table.at(1));
  CHECK(sel.reason() == "first IPv4-mapped entry");
  ok(sel.revalidate());

  // The entry matching the bootstrap address is the same one; another address has none.
  CHECK(ok(table.matching_ipv4(ok(tbverbs::parse_ipv4("169.254.10.1")))).index() == 1);
  const auto none = err(table.matching_ipv4(ok(tbverbs::parse_ipv4("10.1.2.3"))));
  CHECK(none.kind == tbverbs::ErrorKind::gid_not_found);
  CHECK_THAT(none.message(), ContainsSubstring("10.1.2.3"));
}

TEST_CASE("core/gid: without an IPv4 address select() fails with no_ipv4_gid and names the remedy", "[core][gid]") {
  Fabric fabric(host_a(std::nullopt), host_b());
  fabric.use("hostA");
  auto ctx = ok(tbverbs::Context::open(emulator(), "rdma_en1"));
  const auto table = ok(ctx.gid_table(1));
  const tbverbs::Error e = err(table.select());
  CHECK(e.kind == tbverbs::ErrorKind::no_ipv4_gid);
  CHECK(e.step == tbverbs::Step::select_gid);
  CHECK(e.platform == tbverbs::Platform::apple);
  CHECK(e.device.view() == "rdma_en1");
  CHECK(e.port == 1);
  const std::string m = e.message();
  CHECK_THAT(m, ContainsSubstring("only fe80:: entries"));
  CHECK_THAT(m, ContainsSubstring("no IPv4 address"));
  REQUIRE(e.diagnosis() != nullptr);
  CHECK_THAT(std::string(e.diagnosis()->remedy), ContainsSubstring("ifconfig enN inet"));
  CHECK_THAT(m, ContainsSubstring("remedy: "));
  CHECK_THAT(m, ContainsSubstring("networksetup -setmanual"));
}

TEST_CASE("core/gid: TBVERBS_GID_INDEX is validated: out of range, empty entry, link-local on Apple", "[core][gid]") {
  Fabric fabric(host_a(), host_b());
  fabric.use("hostA");
  auto ctx = ok(tbverbs::Context::open(emulator(), "rdma_en1"));
  const auto table = ok(ctx.gid_table(1));

  struct Case {
    const char* value;
    const char* says;
  };
  const Case bad[] = {
      {"1024", "outside the table (length 1024)"},
      {"-1", "outside the table"},
      {"5", "is an empty entry"},
      {"0", "not an IPv4-mapped entry"},
      {"one", "is not a number"},
  };
  for (const Case& c : bad) {
    INFO("TBVERBS_GID_INDEX=" << c.value);
    EnvGuard env("TBVERBS_GID_INDEX", c.value);
    const tbverbs::Error e = err(table.select());
    CHECK(e.kind == tbverbs::ErrorKind::gid_index_invalid);
    CHECK_THAT(e.message(), ContainsSubstring(c.says));
    REQUIRE(e.diagnosis() != nullptr);
    CHECK_THAT(std::string(e.diagnosis()->remedy), ContainsSubstring("TBVERBS_GID_INDEX"));
  }
  // A valid override is taken, and says so.
  {
    EnvGuard env("TBVERBS_GID_INDEX", "1");
    const auto sel = ok(table.select());
    CHECK(sel.index() == 1);
    CHECK(sel.reason() == "operator override");
  }
  // Unset again: the library's own choice.
  CHECK(ok(table.select()).reason() == "first IPv4-mapped entry");
}

TEST_CASE("core/gid: an IPv4 address removed after selection makes revalidate() report gid_stale and connect refuse",
          "[core][gid]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());

  auto prep_a = ok(tbverbs::QpRecipe::thunderbolt(a.select()).prepare(a.pd, a.cq));
  auto prep_b = ok(tbverbs::QpRecipe::thunderbolt(b.select()).prepare(b.pd, b.cq));
  const tbverbs::GidSelection sel_a = prep_a.recipe().gid();
  ok(sel_a.revalidate());

  fabric.clear_ipv4(fabric.a()); // the address goes away (APIPA renegotiation, sleep)

  const tbverbs::Error stale = err(sel_a.revalidate());
  CHECK(stale.kind == tbverbs::ErrorKind::gid_stale);
  CHECK(stale.gid_index == 1);
  CHECK_THAT(stale.message(), ContainsSubstring("was ::ffff:10.99.0.1"));
  REQUIRE(stale.diagnosis() != nullptr);

  // connect() re-reads the entry before RTR: the stale selection is refused, not sent to RTR.
  const tbverbs::Error refused = err(std::move(prep_a).connect(prep_b.endpoint()));
  CHECK(refused.kind == tbverbs::ErrorKind::gid_stale);
  CHECK(refused.step == tbverbs::Step::revalidate_gid);
}

TEST_CASE("core/gid: an IPv4 address changed between two table reads: the new table selects the new GID",
          "[core][gid]") {
  Fabric fabric(host_a(), host_b());
  fabric.use("hostA");
  auto ctx = ok(tbverbs::Context::open(emulator(), "rdma_en1"));
  const auto first = ok(ok(ctx.gid_table(1)).select());
  CHECK(first.gid().to_string() == "::ffff:10.99.0.1");

  fabric.set_ipv4(fabric.a(), "10.99.0.5/30");

  // The old snapshot still holds the old value (a snapshot never changes under the caller) ...
  CHECK(first.gid().to_string() == "::ffff:10.99.0.1");
  const tbverbs::Error stale = err(first.revalidate());
  CHECK(stale.kind == tbverbs::ErrorKind::gid_stale);
  CHECK_THAT(stale.message(), ContainsSubstring("now ::ffff:10.99.0.5"));
  // ... and a fresh table selects the new one.
  const auto second = ok(ok(ctx.gid_table(1)).select());
  CHECK(second.index() == 1);
  CHECK(second.gid().to_string() == "::ffff:10.99.0.5");
  ok(second.revalidate());
}

TEST_CASE("core/gid: the ::ffff: entry at index 2 and 7 is found, and RTR uses that index on both sides",
          "[core][gid]") {
  // mlx#3389: sgid_index hard-coded to 1 while the IPv4-mapped GID sat at index 2.
  PortSpec a = host_a(), b = host_b();
  a.ipv4_gid_index = 2;
  b.ipv4_gid_index = 7;
  Fabric fabric(a, b);
  Side sa = Side::open(fabric, fabric.a());
  Side sb = Side::open(fabric, fabric.b());
  const auto table_a = ok(sa.ctx.gid_table(1));
  CHECK(table_a.at(1).is_link_local());
  const auto sel_a = ok(table_a.select());
  CHECK(sel_a.index() == 2);
  CHECK(sel_a.gid().to_string() == "::ffff:10.99.0.1");
  CHECK(ok(ok(sb.ctx.gid_table(1)).select()).index() == 7);

  // The recipe's RTR source index and its advertised GID are both that entry ...
  const auto recipe = tbverbs::QpRecipe::thunderbolt(sel_a);
  CHECK(recipe.local_endpoint(1, 1).gid == sel_a.gid());
  CHECK(ok(recipe.rtr_transition(recipe.local_endpoint(1, 1))).attr.ah_attr.grh.sgid_index == 2);

  // ... and the emulated driver accepts RTR on both sides and delivers data.
  Pair p = connect(sa, sb, [](const tbverbs::GidSelection& s) { return tbverbs::QpRecipe::thunderbolt(s); });
  ok(p.b.recv(5, ok(sb.mr.sge(0, 100))));
  std::memcpy(sa.mr.data(), "index two to index seven", 25);
  ok(p.a.send(6, ok(sa.mr.sge(0, 100))));
  const auto wc = wait_one(sb.cq);
  CHECK(wc.wr_id() == 5);
  CHECK(wc.byte_len() == 100);
  CHECK(std::memcmp(sb.mr.data(), "index two to index seven", 25) == 0);

  // Index 1 from the operator (the hard-coded value of the field report) is refused before RTR.
  EnvGuard env("TBVERBS_GID_INDEX", "1");
  const tbverbs::Error e = err(table_a.select());
  CHECK(e.kind == tbverbs::ErrorKind::gid_index_invalid);
  CHECK_THAT(e.message(), ContainsSubstring("not an IPv4-mapped entry"));
}
