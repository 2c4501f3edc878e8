#include "server/auth_interceptor.h"

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

namespace topiary::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

// gRPC C++ server interceptors cannot end a call before its handler runs (they have no
// Hijack), so an unauthenticated call is neutralized instead: the handler receives an empty
// request (every handler here refuses or ignores one: an empty id is NOT_FOUND, an empty spec
// INVALID_ARGUMENT), whatever it would send is replaced by an empty message, and the status
// the client receives is UNAUTHENTICATED. Nothing the caller sent reaches a handler, and
// nothing a handler produces reaches the caller. tests/daemon_test.sh checks every RPC.
class AuthInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit AuthInterceptor(const std::string* token) : token_(token) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      const auto* md = methods->GetRecvInitialMetadata();
      bool ok = false;
      const std::string want = "Bearer " + *token_;
      auto range = md->equal_range("authorization");
      for (auto it = range.first; it != range.second; ++it) {
        ok = ok || std::string(it->second.data(), it->second.size()) == want;
      }
      denied_ = !ok;
    }
    if (denied_) {
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
        if (void* request = methods->GetRecvMessage()) {
          static_cast<google::protobuf::Message*>(request)->Clear();
        }
      }
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
        if (grpc::ByteBuffer* out = methods->GetSerializedSendMessage()) out->Clear();
      }
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
        methods->ModifySendStatus(
            grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                         "missing or wrong bearer token (metadata 'authorization: Bearer ...')"));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string* token_;
  bool denied_ = false;
};

class AuthInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit AuthInterceptorFactory(std::string token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (token_.empty() || IsOpenMethod(info->method())) return nullptr;
    return new AuthInterceptor(&token_);
  }

 private:
  std::string token_;
};

}  // namespace

bool IsOpenMethod(const std::string& method) {
  return method.rfind("/grpc.health.v1.Health/", 0) == 0;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeAuthInterceptorFactory(
    std::string token) {
  return std::make_unique<AuthInterceptorFactory>(std::move(token));
}

}  // namespace topiary::server
