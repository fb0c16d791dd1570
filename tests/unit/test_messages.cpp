// Messages that read badly (issue 13), pinned in their new form. (The errno of a condition:
// test_error.cpp; the device-not-found cause and the /30 remedy: test_diagnosis.cpp.)
#include <catch2/catch_test_macros.hpp>

#include <tbverbs/diagnosis.hpp>
#include <tbverbs/gid.hpp>

#include <string>

using namespace tbverbs;

namespace {
std::size_t count(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (auto at = s.find(part); at != std::string::npos; at = s.find(part, at + part.size())) ++n;
  return n;
}
} // namespace

TEST_CASE("issue 13: a port with only fe80:: GIDs says \"no IPv4-mapped GID\" once", "[messages][gid]") {
  auto ll = Gid::parse("fe80::1");
  REQUIRE(ll);
  const GidTable table = GidTable::from_entries(1, {*ll}, Platform::apple, "rdma_en1");
  auto sel = table.select();
  REQUIRE_FALSE(sel);
  const std::string m = sel.error().message();
  INFO(m);
  CHECK(sel.error().is(ErrorKind::no_ipv4_gid));
  // Was "select GID: no IPv4-mapped GID [device rdma_en1, port 1]: no IPv4-mapped GID: GID[0]=...".
  CHECK(m.starts_with("select GID: no IPv4-mapped GID [device rdma_en1, port 1]: GID[0]=fe80::1 (only fe80:: "
                      "entries: the interface behind this port has no IPv4 address)"));
  CHECK(count(m, "no IPv4-mapped GID") == 1);
}

TEST_CASE("issue 13: no GID for the bootstrap address names the address once", "[messages][gid]") {
  const GidTable table = GidTable::from_entries(1, {Gid(), Gid::from_ipv4(0x0a630001)}, Platform::apple, "rdma_en1");
  auto sel = table.matching_ipv4(0x0a630005);
  REQUIRE_FALSE(sel);
  const std::string m = sel.error().message();
  INFO(m);
  CHECK(m.starts_with("select GID: no GID matches the address [device rdma_en1, port 1]: the address is "
                      "10.99.0.5: GID[1]=::ffff:10.99.0.1"));
}
