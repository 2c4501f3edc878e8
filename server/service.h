// The Topiary gRPC service (protos/topiary/v1/service.proto) over the registry and the
// scheduler: request checks (paths, sizes, states) and the mapping to gRPC codes.
// Each handler checks the bearer token before anything else (auth_interceptor.h), so a
// refused call does no work.
#ifndef TOPIARY_SERVER_SERVICE_H_
#define TOPIARY_SERVER_SERVICE_H_

#include <atomic>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/registry.h"
#include "server/scheduler.h"
#include "topiary/v1/service.grpc.pb.h"

namespace topiary::server {

struct ServiceOptions {
  std::string token;                   // the bearer token every call needs ("" : none)
  int max_watchers = 64;               // Watch streams open at once; more: RESOURCE_EXHAUSTED
  int max_queued = 256;                // QUEUED experiments beyond this: RESOURCE_EXHAUSTED
  std::vector<std::string> devices;    // for GetServerInfo
  std::vector<std::string> gpu_names;  // per scheduled GPU, in the scheduler's order
  // Besides the data directory, dataset folders specs may name (Debian's dataset packages).
  std::vector<std::string> dataset_roots = {"/usr/share/datasets"};
  // The client binary RunCommand runs (server/command_runner.h); "" : none, the call fails.
  std::string topiary_binary;
  uint64_t max_file_bytes = uint64_t{2} << 30;  // topiaryd's --max_file_bytes, for children
};

class TopiaryService final : public topiary::v1::Topiary::Service {
 public:
  TopiaryService(Registry* registry, Scheduler* scheduler, ServiceOptions options)
      : registry_(registry), scheduler_(scheduler), options_(std::move(options)) {}

  grpc::Status SubmitExperiment(grpc::ServerContext* ctx,
                                const topiary::v1::SubmitExperimentRequest* req,
                                topiary::v1::Experiment* out) override;
  grpc::Status GetExperiment(grpc::ServerContext* ctx, const topiary::v1::ExperimentRef* req,
                             topiary::v1::Experiment* out) override;
  grpc::Status ListExperiments(grpc::ServerContext* ctx,
                               const topiary::v1::ListExperimentsRequest* req,
                               topiary::v1::ListExperimentsResponse* out) override;
  grpc::Status WatchExperiment(grpc::ServerContext* ctx,
                               const topiary::v1::WatchExperimentRequest* req,
                               grpc::ServerWriter<topiary::v1::Event>* writer) override;
  grpc::Status PauseExperiment(grpc::ServerContext* ctx, const topiary::v1::ExperimentRef* req,
                               topiary::v1::Experiment* out) override;
  grpc::Status ResumeExperiment(grpc::ServerContext* ctx, const topiary::v1::ExperimentRef* req,
                                topiary::v1::Experiment* out) override;
  grpc::Status CancelExperiment(grpc::ServerContext* ctx, const topiary::v1::ExperimentRef* req,
                                topiary::v1::Experiment* out) override;
  grpc::Status AdvanceRound(grpc::ServerContext* ctx, const topiary::v1::AdvanceRoundRequest* req,
                            topiary::v1::Experiment* out) override;
  grpc::Status ForkExperiment(grpc::ServerContext* ctx,
                              const topiary::v1::ForkExperimentRequest* req,
                              topiary::v1::Experiment* out) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* ctx, const topiary::v1::ExperimentRef* req,
                               topiary::v1::ListCheckpointsResponse* out) override;
  grpc::Status ImportModel(grpc::ServerContext* ctx, const topiary::v1::ImportModelRequest* req,
                           topiary::v1::ImportSummary* out) override;
  grpc::Status InspectCheckpoint(grpc::ServerContext* ctx,
                                 const topiary::v1::InspectCheckpointRequest* req,
                                 topiary::v1::CheckpointReport* out) override;
  grpc::Status ListMultipliers(grpc::ServerContext* ctx,
                               const topiary::v1::ListMultipliersRequest* req,
                               topiary::v1::ListMultipliersResponse* out) override;
  grpc::Status GetServerInfo(grpc::ServerContext* ctx, const topiary::v1::GetServerInfoRequest* req,
                             topiary::v1::ServerInfo* out) override;
  grpc::Status UploadFiles(grpc::ServerContext* ctx,
                           grpc::ServerReader<topiary::v1::UploadChunk>* reader,
                           topiary::v1::UploadSummary* out) override;
  grpc::Status DownloadFile(grpc::ServerContext* ctx, const topiary::v1::DownloadFileRequest* req,
                            grpc::ServerWriter<topiary::v1::FileChunk>* writer) override;
  grpc::Status ListFiles(grpc::ServerContext* ctx, const topiary::v1::ListFilesRequest* req,
                         topiary::v1::ListFilesResponse* out) override;
  grpc::Status RunCommand(grpc::ServerContext* ctx, const topiary::v1::RunCommandRequest* req,
                          grpc::ServerWriter<topiary::v1::CommandOutput>* writer) override;
  grpc::Status ReportRunEvents(grpc::ServerContext* ctx,
                               const topiary::v1::ReportRunEventsRequest* req,
                               topiary::v1::ReportRunEventsResponse* out) override;

 private:
  // OK when the call carries the token (or none is needed; or `ctx` is null: a call from
  // inside the process).
  grpc::Status Authorize(grpc::ServerContext* ctx) const;
  // Resolves a data-directory-relative path; PERMISSION_DENIED outside it (or a missing file).
  grpc::Status ResolvePath(const std::string& field, const std::string& path,
                           std::string* absolute) const;
  // A data set's path: a relative one inside the data directory (as every path a client
  // names), an absolute one inside it or a dataset folder, once links are followed;
  // PERMISSION_DENIED naming the folders and the rule otherwise.
  grpc::Status ResolveDataPath(const std::string& path, std::string* absolute) const;
  grpc::Status CheckSpec(topiary::v1::ExperimentSpec* spec) const;
  // The data directory's multipliers/ folder.
  std::string MultiplierFolder() const;
  // Rewrites each rule's multiplier to the table file it means (a bare stem or NAME.bin: in
  // multipliers/; a path: inside the data directory) and reads every table, so that a bad
  // one is refused at submission with the rule named.
  grpc::Status ResolveMultipliers(topiary::v1::ApproximationSpec* approx) const;
  grpc::Status Admit(const topiary::v1::ExperimentSpec& spec, const std::string& parent,
                     topiary::v1::Experiment* out);

  Registry* registry_;
  Scheduler* scheduler_;
  ServiceOptions options_;
  std::atomic<int> watchers_{0};
  std::atomic<int> imports_{0};
  std::atomic<int> transfers_{0};  // upload and download streams open
  std::atomic<int> commands_{0};   // RunCommand calls under way (waiting or running)
  std::atomic<int> next_command_{1};
  // ReportRunEvents: per experiment, the run's newest event held (a retry's events are
  // skipped), for its Slurm job.
  absl::Mutex reports_mu_;
  std::map<std::string, std::pair<std::string, uint32_t>> reported_ ABSL_GUARDED_BY(reports_mu_);
};

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_SERVICE_H_
