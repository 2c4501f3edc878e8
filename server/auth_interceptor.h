// Bearer-token authentication for every call the daemon serves (the Topiary service and
// server reflection alike), decided in one place. grpc.health.v1 stays open so that probes
// (load balancers, systemd, Kubernetes) work without the token; it reveals only SERVING.
#ifndef TOPIARY_SERVER_AUTH_INTERCEPTOR_H_
#define TOPIARY_SERVER_AUTH_INTERCEPTOR_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>

namespace topiary::server {

// Creates the interceptor of each call. An empty token authenticates nothing (every call
// passes).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeAuthInterceptorFactory(
    std::string token);

// True when `method` ("/package.Service/Method") is served without a token.
bool IsOpenMethod(const std::string& method);

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_AUTH_INTERCEPTOR_H_
