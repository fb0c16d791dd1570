// A queue pair on the fake provider (fake_verbs.hpp), prepared or connected to itself, for the
// unit tests that exercise the QP: Thunderbolt (rdma_en1, UC) or an rdma-core RC NIC (mlx5_0).
#pragma once

#include "fake_verbs.hpp"

#include <optional>

#include <catch2/catch_test_macros.hpp>

#include <utility>

namespace fake {

/// The objects of a prepared QP, owned together.
struct PreparedQp {
  tbverbs::Context ctx;
  tbverbs::ProtectionDomain pd;
  tbverbs::CompletionQueue cq;
  tbverbs::PreparedQueuePair prep;
};

/// The objects of a connected QP, owned together.
struct ConnectedQp {
  tbverbs::Context ctx;
  tbverbs::ProtectionDomain pd;
  tbverbs::CompletionQueue cq;
  tbverbs::QueuePair qp;
};

/// A QP prepared with `caps` asked for, on `rc` ? mlx5_0 (RC) : rdma_en1 (Thunderbolt, UC); with
/// `access`, the recipe's remote access rights instead of the preset's.
inline PreparedQp prepare_qp(FakeVerbs& f, bool rc, tbverbs::QpCapacities caps = {16, 16, 2, 2, 64},
                             std::optional<tbverbs::Access> access = std::nullopt) {
  using namespace tbverbs;
  if (rc) f.device_names = {"mlx5_0"};
  auto ctx = Context::open(f.library(), rc ? "mlx5_0" : "rdma_en1");
  REQUIRE(ctx);
  auto pd = ctx->alloc_pd();
  REQUIRE(pd);
  auto cq = ctx->create_cq(64, CqWait::poll);
  REQUIRE(cq);
  auto sel = ctx->gid_table(1)->first_ipv4_mapped();
  REQUIRE(sel);
  auto recipe = rc ? QpRecipe::rdma_core_rc(*sel) : QpRecipe::thunderbolt(*sel);
  recipe.capacities(caps);
  if (access) recipe.access(*access);
  auto prep = recipe.prepare(*pd, *cq);
  REQUIRE(prep);
  return PreparedQp{std::move(*ctx), std::move(*pd), std::move(*cq), std::move(*prep)};
}

/// prepare_qp(), then connected to its own endpoint.
inline ConnectedQp connect_qp(FakeVerbs& f, bool rc, tbverbs::QpCapacities caps = {16, 16, 2, 2, 64},
                              std::optional<tbverbs::Access> access = std::nullopt) {
  PreparedQp p = prepare_qp(f, rc, caps, access);
  const tbverbs::Endpoint self = p.prep.endpoint();
  auto qp = std::move(p.prep).connect(self);
  if (!qp) FAIL(qp.error().message());
  return ConnectedQp{std::move(p.ctx), std::move(p.pd), std::move(p.cq), std::move(*qp)};
}

} // namespace fake
