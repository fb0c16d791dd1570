// Isolation of the emulator's shared state (issue 9): senders trust the pids and addresses stored
// in it for process_vm_writev, so it must belong to the user running the emulator and nobody else.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

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
