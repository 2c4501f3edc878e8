// Bearer-token authentication for every call the daemon serves (the Topiary service and
// server reflection alike), decided in one place. grpc.health.v1 stays open so that probes
// (load balancers, systemd, Kubernetes) work without the token; it reveals only SERVING.
#ifndef TOPIARY_SERVER_AUTH_INTERCEPTOR_H_
#define TOPIARY_SERVER_AUTH_INTERCEPTOR_H_

#include <grpcpp/support/server_interceptor.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/string_ref.h>

#include <map>
#include <memory>
#include <string>

namespace topiary::server {

// Creates the interceptor of each call. An empty token authenticates nothing (every call
// passes).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeAuthInterceptorFactory(
    std::string token);

// True when `method` ("/package.Service/Method") is served without a token.
bool IsOpenMethod(const std::string& method);

// True when `metadata` carries "authorization: Bearer <token>" (an empty token: always).
// Compared in time that does not depend on where a wrong token first differs.
bool HasBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                    const std::string& token);

// What a refused call receives.
grpc::Status Unauthenticated();

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_AUTH_INTERCEPTOR_H_
