// Isolation of the emulator's shared state (issue 9): senders trust the pids and addresses stored
// in it for process_vm_writev, so it must belong to the user running the emulator and nobody else.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "emu_test_util.hpp"

using namespace emutest;

namespace {
unsigned mode_of(const std::string& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}
struct StateDir {
  std::string path;
  explicit StateDir(const std::string& p) : path(p) { ::setenv("TBVERBS_EMU_STATE_DIR", p.c_str(), 1); }
  ~StateDir() {
    ::unsetenv("TBVERBS_EMU_STATE_DIR");
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
} // namespace

TEST_CASE("isolation: the state directory is 0700 and the state file 0600 (they were 1777 and 0666)",
          "[isolation]") {
  TempFabric f(three_hosts("thunderbolt"));
  StateDir sd(f.dir + "/state");
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx != nullptr);
  CHECK(mode_of(sd.path) == 0700);
  CHECK(mode_of(sd.path + "/state") == 0600);
  ibv_close_device(ctx);
}

TEST_CASE("isolation: a state directory of ours that an older emulator left open (1777) is closed",
          "[isolation]") {
  TempFabric f(three_hosts("thunderbolt"));
  StateDir sd(f.dir + "/state");
  REQUIRE(::mkdir(sd.path.c_str(), 0700) == 0);
  REQUIRE(::chmod(sd.path.c_str(), 01777) == 0);
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx != nullptr);
  CHECK(mode_of(sd.path) == 0700);
  ibv_close_device(ctx);
}

TEST_CASE("isolation: a state directory owned by another user is refused, never used", "[isolation]") {
  if (::geteuid() != 0) {
    SKIP("needs root to give a directory to another user");
  }
  TempFabric f(three_hosts("thunderbolt"));
  StateDir sd(f.dir + "/theirs");
  REQUIRE(::mkdir(sd.path.c_str(), 0700) == 0);
  REQUIRE(::chown(sd.path.c_str(), 65534, 65534) == 0);
  int n = -1;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  CHECK(list == nullptr);
  CHECK(errno != 0);
  if (list) ibv_free_device_list(list);
  // Nothing was created in it.
  CHECK(std::filesystem::is_empty(sd.path));
}

TEST_CASE("leftovers: gc removes state whose fabric file and processes are gone, and keeps the rest",
          "[isolation][gc]") {
  ::unsetenv("TBVERBS_EMU_STATE_DIR");  // the default directory, in /dev/shm, where gc looks
  TempFabric gone(three_hosts("thunderbolt"));
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx != nullptr);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq != nullptr);
  const std::string dir = tbemu_state_dir(gone.p());
  REQUIRE(std::filesystem::exists(dir + "/fabric"));
  TempFabric kept(three_hosts("thunderbolt"));
  const std::string kept_dir = tbemu_state_dir(kept.p());
  REQUIRE(std::filesystem::exists(kept_dir + "/state"));
  std::filesystem::remove(gone.path);
  int n = 0;
  tbemu_gc(0, &n);
  CHECK(std::filesystem::exists(dir));  // a live process (this one) still has a CQ there
  ibv_destroy_cq(cq);
  ibv_close_device(ctx);
  const std::string report = tbemu_gc(0, &n);
  INFO(report);
  CHECK_FALSE(std::filesystem::exists(dir));
  CHECK(report.find(dir) != std::string::npos);
  CHECK(std::filesystem::exists(kept_dir));  // its fabric file is still there
}

TEST_CASE("leftovers: the channel FIFO of a process killed before destroying it is removed", "[isolation][gc]") {
  TempFabric fab(three_hosts("rdma-core-rc"));
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx != nullptr);
  const std::string dir = tbemu_state_dir(fab.p());
  auto fifos = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().rfind("chan-", 0) == 0) names.push_back(e.path().filename().string());
    return names;
  };
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ibv_context* c = open_dev("hostA", "rdma_en1");
    ibv_comp_channel* ch = c ? ibv_create_comp_channel(c) : nullptr;
    _exit(ch != nullptr ? 0 : 1);  // dies holding the channel: nothing destroys it
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const std::string dead = "chan-" + std::to_string(child) + "-";
  auto before = fifos();
  REQUIRE(std::any_of(before.begin(), before.end(), [&](const std::string& n) { return n.rfind(dead, 0) == 0; }));
  ibv_comp_channel* mine = ibv_create_comp_channel(ctx);
  REQUIRE(mine != nullptr);
  auto after = fifos();
  CHECK_FALSE(std::any_of(after.begin(), after.end(), [&](const std::string& n) { return n.rfind(dead, 0) == 0; }));
  CHECK(after.size() == 1);  // ours
  ibv_destroy_comp_channel(mine);
  ibv_close_device(ctx);
}

TEST_CASE("leftovers: gc --fabrics-under removes the state of fabric files that still exist", "[isolation][gc]") {
  ::unsetenv("TBVERBS_EMU_STATE_DIR");
  TempFabric fab(three_hosts("thunderbolt"));
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx != nullptr);
  ibv_close_device(ctx);
  const std::string dir = tbemu_state_dir(fab.p());
  REQUIRE(std::filesystem::exists(dir));
  int n = 0;
  tbemu_gc(0, &n);
  CHECK(std::filesystem::exists(dir));  // the file exists: plain gc keeps it
  tbemu_gc_under(fab.dir.substr(0, fab.dir.size() - 1).c_str(), 0, &n);  // a sibling's prefix, not its directory
  CHECK(std::filesystem::exists(dir));
  const std::string report = tbemu_gc_under(fab.dir.c_str(), 0, &n);
  INFO(report);
  CHECK_FALSE(std::filesystem::exists(dir));
  CHECK(std::filesystem::exists(fab.path));  // the fabric file itself is not touched
}
