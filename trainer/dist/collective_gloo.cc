// Gloo between CPU ranks of separate processes (topiary worker; Debian's libgloo): TCP pairs
// between every two ranks, connected through Gloo's file store in the rendezvous directory.
// Gradients are gathered whole and summed in rank order here, as the host collective of one
// process does, so processes and threads give the same bits.
#include <gloo/allgather.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdlib>
#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/elementwise/elementwise.h"
#include "trainer/dist/collective.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

class GlooCollective : public Collective {
 public:
  absl::Status Init(const World& world, double timeout_s) {
    world_ = world;
    const std::string store_dir = world.rendezvous + "/gloo";
    TOPIARY_RETURN_IF_ERROR(MakeDirs(store_dir));
    return Guard("connecting the ranks", [&] {
      gloo::transport::tcp::attr attr;
      // Which interface the ranks reach each other on (PyTorch's variable); by default the
      // address this host's name resolves to.
      if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME")) attr.iface = iface;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      gloo::rendezvous::FileStore store(store_dir);
      auto context = std::make_shared<gloo::rendezvous::Context>(world.rank, world.size);
      context->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
      context->connectFullMesh(store, device);
      context_ = std::move(context);
    });
  }

  int ranks() const override { return world_.size; }
  std::string name() const override {
    return absl::StrFormat("gloo, ordered, %d processes", world_.size);
  }

  absl::Status Reserve(int rank, size_t n) override {
    if (n * world_.size > gathered_.size()) gathered_.resize(n * world_.size);
    return absl::OkStatus();
  }

  absl::Status AllReduceMean(int rank, float* data, size_t n) override {
    if (n * world_.size > gathered_.size()) {
      return absl::InternalError(absl::StrFormat("all-reduce of %d floats exceeds the %d reserved",
                                                 n, gathered_.size() / world_.size));
    }
    TOPIARY_RETURN_IF_ERROR(AllGather(rank, data, n, gathered_.data()));
    std::vector<const float*> rows(world_.size);
    for (int r = 0; r < world_.size; ++r) rows[r] = gathered_.data() + r * n;
    kernels::MeanRowsCpu(world_.size, static_cast<int64_t>(n), rows.data(), data);
    return absl::OkStatus();
  }

  absl::Status AllGather(int rank, const float* data, size_t n, float* all) override {
    return ExchangeHost(rank, data, n * sizeof(float), all);
  }

  absl::Status ExchangeHost(int rank, const void* data, size_t n, void* all) override {
    return Guard("all-gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(data)), n);
      opts.setOutput(static_cast<uint8_t*>(all), n * world_.size);
      opts.setTag(NextTag());
      gloo::allgather(opts);
    });
  }

  absl::Status Broadcast(int rank, float* data, size_t n) override {
    return Guard("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, n);
      opts.setRoot(0);
      opts.setTag(NextTag());
      gloo::broadcast(opts);
    });
  }

  // A failed rank's peers see its sockets close (or time out); nothing to release here.
  void Abort() override {}

 private:
  uint32_t NextTag() { return tag_++; }

  // Gloo reports failures by throwing: a peer that died, a timeout.
  template <typename F>
  absl::Status Guard(const char* what, F&& f) {
    if (failed_) return absl::AbortedError("gloo: an earlier operation failed");
    try {
      f();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      failed_ = true;
      return absl::UnavailableError(
          absl::StrCat("gloo ", what, " (rank ", world_.rank, " of ", world_.size, "): ", e.what(),
                       " (another rank's process ended, failed or cannot be reached)"));
    }
  }

  World world_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<float> gathered_;
  uint32_t tag_ = 0;
  bool failed_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> MakeGlooCollective(const World& world,
                                                               double timeout_s) {
  auto c = std::make_unique<GlooCollective>();
  TOPIARY_RETURN_IF_ERROR(c->Init(world, timeout_s));
  return std::unique_ptr<Collective>(std::move(c));
}

}  // namespace topiary
