#include "server/auth_interceptor.h"

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

namespace topiary::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

// gRPC C++ server interceptors cannot end a call before its handler runs (they have no
// Hijack), so an unauthenticated call is neutralized instead: the handler receives an empty
// request, whatever it would send is replaced by an empty message, and the status the client
// receives is UNAUTHENTICATED. Nothing the caller sent reaches a handler, and nothing a
// handler produces reaches the caller. The Topiary service's handlers also check the token
// themselves first (service.cc), so a refused call does no work there; this interceptor is
// what guards the services the daemon does not write (server reflection).
// tests/daemon_test.sh checks every RPC.
class AuthInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit AuthInterceptor(const std::string* token) : token_(token) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      denied_ = !HasBearerToken(*methods->GetRecvInitialMetadata(), *token_);
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
        methods->ModifySendStatus(Unauthenticated());
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

bool HasBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                    const std::string& token) {
  if (token.empty()) return true;
  const std::string want = "Bearer " + token;
  bool ok = false;
  auto range = metadata.equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    // Every byte compared, whatever differs first (no early exit on a mismatch).
    const grpc::string_ref& have = it->second;
    unsigned diff = have.size() != want.size();
    for (size_t i = 0; i < want.size(); ++i) {
      diff |= static_cast<unsigned char>(want[i]) ^
              static_cast<unsigned char>(i < have.size() ? have.data()[i] : 0);
    }
    ok |= diff == 0;
  }
  return ok;
}

grpc::Status Unauthenticated() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or wrong bearer token (metadata 'authorization: Bearer ...')");
}

bool IsOpenMethod(const std::string& method) {
  return method.rfind("/grpc.health.v1.Health/", 0) == 0;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeAuthInterceptorFactory(
    std::string token) {
  return std::make_unique<AuthInterceptorFactory>(std::move(token));
}

}  // namespace topiary::server
