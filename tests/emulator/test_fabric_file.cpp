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

namespace {
// Two hosts with two cables (rdma_en1 and rdma_en2 on each); `link` goes at the top level, `cable2`
// is the second cable (array or object form). Returns the loader's error, or "" and the
// description (tbemu_describe) in `show`.
std::string load_links(const std::string& link, const std::string& cable2, std::string* show = nullptr) {
  const std::string json = R"({"profile": "rdma-core-rc", )" + link + R"("hosts": [
      {"name": "hostA", "devices": ["rdma_en1", "rdma_en2"]},
      {"name": "hostB", "devices": ["rdma_en1", "rdma_en2"]}],
    "cables": [["hostA:rdma_en1:1", "hostB:rdma_en1:1"], )" + cable2 + "]}";
  TempFabric f(json);
  const char* d = tbemu_describe(f.p());
  if (!d) return tbemu_last_error();
  if (show) *show = d;
  return "";
}
const std::string kCable2 = R"(["hostA:rdma_en2:1", "hostB:rdma_en2:1"])";
size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
} // namespace

TEST_CASE("fabric file: \"link\" paces every cable; a cable's own link replaces it, absent keys unpaced",
          "[fabric_file][link]") {
  std::string show;
  REQUIRE(load_links(R"("link": {"gbytes_per_s": 0.25, "latency_us": 500}, )", kCable2, &show) == "");
  CHECK(count_of(show, "link 0.25 GB/s, 500 us") == 4);  // both ends of both cables
  // Object form with its own link: only latency there (bandwidth unpaced on that cable).
  REQUIRE(load_links(R"("link": {"gbytes_per_s": 1.5}, )",
                     R"({"a": "hostA:rdma_en2:1", "b": "hostB:rdma_en2:1", "link": {"latency_us": 7.5}})", &show) == "");
  CHECK(count_of(show, "link 1.5 GB/s, 0 us") == 2);
  CHECK(count_of(show, "link unpaced bandwidth, 7.5 us") == 2);
  // No link anywhere, or an empty one: unpaced, nothing shown.
  REQUIRE(load_links("", kCable2, &show) == "");
  CHECK(show.find("link ") == std::string::npos);
  REQUIRE(load_links(R"("link": {"gbytes_per_s": 2}, )",
                     R"({"a": "hostA:rdma_en2:1", "b": "hostB:rdma_en2:1", "link": {}})", &show) == "");
  CHECK(count_of(show, "link 2 GB/s") == 2);
  CHECK(count_of(show, "link ") == 2);
}

TEST_CASE("fabric file: bad link values and keys are refused, naming them", "[fabric_file][link]") {
  auto top = [](const std::string& link) { return load_links(R"("link": )" + link + ", ", kCable2); };
  auto has = [](const std::string& error, const std::string& what) {
    INFO(error);
    return error.find(what) != std::string::npos;
  };
  CHECK(has(top(R"({"gbytes_per_s": -1})"), "\"gbytes_per_s\" must be a number from 1e-06"));
  CHECK(has(top(R"({"gbytes_per_s": 0})"), "\"gbytes_per_s\" must be a number from 1e-06"));
  CHECK(has(top(R"({"gbytes_per_s": 1e400})"), "number overflow"));  // JSON has no NaN; infinity is refused too
  CHECK(has(top(R"({"gbytes_per_s": "0.25"})"), "\"gbytes_per_s\" must be a number"));
  CHECK(has(top(R"({"gbytes_per_s": true})"), "\"gbytes_per_s\" must be a number"));
  CHECK(has(top(R"({"latency_us": -0.5})"), "\"latency_us\" must be a number from 0 to 1e+07"));
  CHECK(has(top(R"({"latency_us": 1e8})"), "\"latency_us\" must be a number from 0 to 1e+07"));
  CHECK(has(top(R"({"latency_us": null})"), "\"latency_us\" must be a number"));
  CHECK(has(top(R"({"gbps": 1})"), "unknown key \"gbps\" (known: gbytes_per_s, latency_us)"));
  CHECK(has(top(R"([1, 2])"), "\"link\" must be an object"));
  CHECK(has(load_links("", R"({"a": "hostA:rdma_en2:1", "b": "hostB:rdma_en2:1", "link": {"latency": 5}})"),
            "the link of cable hostA:rdma_en2:1 - hostB:rdma_en2:1: unknown key \"latency\""));
  CHECK(has(load_links("", R"({"a": "hostA:rdma_en2:1", "b": "hostB:rdma_en2:1", "lnk": {}})"), "unknown key \"lnk\""));
}

TEST_CASE("TBVERBS_EMU_LINK paces every cable; bad text is refused, naming the key", "[fabric_file][link]") {
  struct Env {
    explicit Env(const char* v) { setenv("TBVERBS_EMU_LINK", v, 1); }
    ~Env() { unsetenv("TBVERBS_EMU_LINK"); }
  };
  std::string show;
  {
    Env e("gbytes_per_s=0.5,latency_us=20");
    REQUIRE(load_links(R"("link": {"gbytes_per_s": 9}, )", kCable2, &show) == "");
    CHECK(count_of(show, "link 0.5 GB/s, 20 us") == 4);
  }
  {
    Env e("gbytes_per_s=nan");
    CHECK(load_links("", kCable2).find("TBVERBS_EMU_LINK: \"gbytes_per_s\" must be a number from 1e-06") !=
          std::string::npos);
  }
  {
    Env e("latency_us=5us");
    CHECK(load_links("", kCable2).find("\"latency_us\" must be a number, not \"5us\"") != std::string::npos);
  }
  {
    Env e("bandwidth=1");
    CHECK(load_links("", kCable2).find("unknown key \"bandwidth\"") != std::string::npos);
  }
}
