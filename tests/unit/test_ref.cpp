// The handles' own shared ownership and atomics (detail/ref.hpp, detail/atomic.hpp), which replace
// std::shared_ptr, std::unique_ptr and std::atomic in the data-path headers (issue 8, finding 14:
// compile time): every reference counted, the object deleted exactly once, after the last Ref;
// conversions keep it alive; concurrent counting loses nothing; an owned verbs object is
// destroyed once, after its children and before its parent.
#include <catch2/catch_test_macros.hpp>

#include <tbverbs/detail/atomic.hpp>
#include <tbverbs/detail/handle.hpp>
#include <tbverbs/detail/ref.hpp>

#include <cerrno>
#include <thread>
#include <utility>
#include <vector>

using namespace tbverbs::detail;

namespace {

int g_deleted = 0;
struct Counted final : RefCounted {
  int value;
  explicit Counted(int v) : value(v) {}
  ~Counted() override { ++g_deleted; }
};

} // namespace

TEST_CASE("Ref: copies count, the object goes with the last reference, exactly once", "[ref]") {
  g_deleted = 0;
  Ref<Counted> a = make_ref<Counted>(7);
  CHECK(a.use_count() == 1);
  {
    Ref<Counted> b = a;
    CHECK(a.use_count() == 2);
    CHECK(b->value == 7);
    Ref<Counted> c = std::move(b);
    CHECK(b == nullptr);
    CHECK(c.use_count() == 2);
  }
  CHECK(a.use_count() == 1);
  CHECK(g_deleted == 0);
  a.reset();
  CHECK(a == nullptr);
  CHECK(a.use_count() == 0);
  CHECK(g_deleted == 1);
  a.reset(); // a second reset of an empty Ref deletes nothing
  CHECK(g_deleted == 1);
}

TEST_CASE("Ref: a Ref<RefCounted> made from a Ref<Derived> keeps the object alive", "[ref]") {
  g_deleted = 0;
  Ref<RefCounted> keep;
  {
    Ref<Counted> made = make_ref<Counted>(1);
    keep = made;                                  // converting copy
    Ref<RefCounted> moved = Ref<Counted>(made);   // converting move of a copy
    CHECK(made.use_count() == 3);
  }
  CHECK(g_deleted == 0);
  CHECK(keep.use_count() == 1);
  keep = nullptr;
  CHECK(g_deleted == 1);
}

TEST_CASE("Ref: self-assignment and assignment over a held object", "[ref]") {
  g_deleted = 0;
  Ref<Counted> a = make_ref<Counted>(1);
  Ref<Counted>& same = a;
  a = same;
  CHECK(a.use_count() == 1);
  CHECK(g_deleted == 0);
  a = make_ref<Counted>(2); // the first one goes
  CHECK(g_deleted == 1);
  CHECK(a->value == 2);
}

TEST_CASE("Ref and Atomic: concurrent copies and counts lose nothing", "[ref][atomic]") {
  g_deleted = 0;
  Atomic<long> n{0};
  Ref<Counted> shared = make_ref<Counted>(3);
  constexpr int per_thread = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) {
        Ref<Counted> copy = shared;
        n.fetch_add(1, Order::relaxed);
      }
    });
  for (auto& t : ts) t.join();
  CHECK(n.load() == 2 * per_thread);
  CHECK(shared.use_count() == 1);
  CHECK(g_deleted == 0);
  shared.reset();
  CHECK(g_deleted == 1);
}

namespace {
void handler_a(int) {}
using Fn = void (*)(int);
} // namespace

TEST_CASE("Atomic: bool, int and function pointer operations return the value before", "[atomic]") {
  Atomic<bool> flag;
  CHECK_FALSE(flag.exchange(true, Order::relaxed));
  CHECK(flag.exchange(true, Order::relaxed));
  Atomic<int> i{5};
  CHECK(i.fetch_sub(2, Order::acq_rel) == 5);
  CHECK(i.fetch_add(10) == 3);
  i.store(-1, Order::release);
  CHECK(i.load(Order::acquire) == -1);
  Atomic<Fn> f{&handler_a};
  CHECK(f.exchange(nullptr, Order::acq_rel) == &handler_a);
  CHECK(f.load() == nullptr);
}

namespace {
int g_destroyed = 0;
int destroy_ok(int*) {
  ++g_destroyed;
  return 0;
}
int g_busy_calls = 0;
int destroy_busy(int*) {
  ++g_busy_calls;
  return EBUSY;
}
} // namespace

TEST_CASE("Owned: destroyed once, after its children; close() refuses while a child lives", "[ref][handle]") {
  g_destroyed = 0;
  int parent_object = 0, child_object = 0;
  Owned<int> parent(&parent_object, destroy_ok, nullptr);
  {
    Owned<int> child(&child_object, destroy_ok, parent.keep_alive());
    auto busy = parent.close();
    REQUIRE_FALSE(busy);
    CHECK(busy.error().is(EBUSY));
    CHECK(g_destroyed == 0);
    Owned<int> moved = std::move(child);
    CHECK(child.get() == nullptr);
    CHECK(moved.get() == &child_object);
  }
  CHECK(g_destroyed == 1); // the child
  REQUIRE(parent.close());
  CHECK(g_destroyed == 2);
  CHECK(parent.get() == nullptr);
  REQUIRE(parent.close()); // closing twice is a no-op
  CHECK(g_destroyed == 2);
}

TEST_CASE("Owned: a parent dropped first lives until its last child goes", "[ref][handle]") {
  g_destroyed = 0;
  int p = 0, c = 0;
  Owned<int> child;
  {
    Owned<int> parent(&p, destroy_ok, nullptr);
    child = Owned<int>(&c, destroy_ok, parent.keep_alive());
  }
  CHECK(g_destroyed == 0); // the child keeps the parent
  child = Owned<int>();
  CHECK(g_destroyed == 2);
}

TEST_CASE("Owned: a failed close() keeps the object, and the destructor destroys it later", "[ref][handle]") {
  int obj = 0;
  g_busy_calls = 0;
  {
    Owned<int> o(&obj, destroy_busy, nullptr);
    auto r = o.close();
    REQUIRE_FALSE(r);
    CHECK(r.error().is(EBUSY));
    CHECK(o.get() == &obj);
    CHECK(g_busy_calls == 1);
  } // the destructor tries again (its result cannot be reported)
  CHECK(g_busy_calls == 2);
}
