// The fabric file loader refuses what it would otherwise misread (issue 9): unknown or misspelled
// keys, duplicate keys, non-integer numbers, cable ends with trailing garbage, names the cable
// syntax or sysfs paths cannot carry.
#include <catch2/catch_test_macros.hpp>

#include <string>

#include "emu_test_util.hpp"

using namespace emutest;

namespace {
// Loads `json` as a fabric; returns the loader's error ("" when it loaded).
std::string load_error(const std::string& json) {
  TempFabric f(json);
  if (tbemu_state_dir(f.p()) != nullptr) return "";
  return tbemu_last_error();
}
std::string two_hosts(const std::string& port_a = R"({"port": 1})", const std::string& cable_a = "hostA:rdma_en1:1",
                      const std::string& extra = "") {
  return R"({"profile": "thunderbolt", )" + extra + R"("hosts": [
      {"name": "hostA", "devices": [{"name": "rdma_en1", "ports": [)" + port_a + R"(]}]},
      {"name": "hostB", "devices": [{"name": "rdma_en1", "ports": [{"port": 1}]}]}],
    "cables": [[")" + cable_a + R"(", "hostB:rdma_en1:1"]]})";
}
} // namespace

TEST_CASE("fabric file: a well-formed file loads (with comments)", "[fabric_file]") {
  CHECK(load_error(two_hosts(R"({"port": 1, "comment": "cable to B"})")) == "");
}

TEST_CASE("fabric file: unknown and misspelled keys are refused, naming the key", "[fabric_file]") {
  CHECK(load_error(two_hosts(R"({"port": 1, "ipv4_adress": "10.0.0.1/30"})")).find("unknown key \"ipv4_adress\"") !=
        std::string::npos);
  CHECK(load_error(two_hosts(R"({"port": 1})", "hostA:rdma_en1:1", R"("quirk": {}, )")).find("unknown key \"quirk\"") !=
        std::string::npos);
}

TEST_CASE("fabric file: a key twice in one object is refused", "[fabric_file]") {
  CHECK(load_error(two_hosts(R"({"port": 1, "state": "up", "state": "down"})")).find("\"state\" appears twice") !=
        std::string::npos);
}

TEST_CASE("fabric file: port 1.9, \"1\" and a cable end \"a:d:1:garbage\" are refused, not read as 1",
          "[fabric_file]") {
  CHECK(load_error(two_hosts(R"({"port": 1.9})")).find("\"port\" must be an integer") != std::string::npos);
  CHECK(load_error(two_hosts(R"({"port": "1"})")).find("\"port\" must be an integer") != std::string::npos);
  CHECK(load_error(two_hosts(R"({"port": 1})", "hostA:rdma_en1:1:garbage")).find("the port must be a number") !=
        std::string::npos);
}

TEST_CASE("fabric file: host and device names with ':' or '/' are refused", "[fabric_file]") {
  const std::string colon = R"({"hosts": [{"name": "host:A", "devices": ["rdma_en1"]}]})";
  CHECK(load_error(colon).find("may not contain ':'") != std::string::npos);
  const std::string slash = R"({"hosts": [{"name": "hostA", "devices": ["../rdma_en1"]}]})";
  CHECK(load_error(slash).find("may not contain ':', '/'") != std::string::npos);
}
