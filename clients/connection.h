// A client's connection to topiaryd: the address (--server, else $TOPIARY_SERVER, else
// 127.0.0.1:7077), TLS (--tls_ca), the bearer token (--token_file or $TOPIARY_TOKEN_FILE) on
// every call, and how a failed call is reported.
#ifndef TOPIARY_CLIENTS_CONNECTION_H_
#define TOPIARY_CLIENTS_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "clients/args.h"
#include "topiary/v1/service.grpc.pb.h"

namespace topiary {

class Connection {
 public:
  explicit Connection(const Args& a);
  // A context with the token and, for unary calls, a 30 s deadline.
  std::unique_ptr<grpc::ClientContext> Context(bool stream = false) const;
  topiary::v1::Topiary::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }
  // Why the token could not be read ("" when it could, or none is used).
  const std::string& token_error() const { return token_error_; }

 private:
  std::string address_, token_, token_error_;
  std::unique_ptr<topiary::v1::Topiary::Stub> stub_;
};

// "INVALID_ARGUMENT", ... for messages and --json.
const char* CodeName(grpc::StatusCode code);

// Reports a failed call (as {"error": ..., "code": ...} with --json, else on stderr; no
// daemon at the address says how to start one) and returns its exit code (clients/args.h).
int Report(const Args& a, const Connection& c, const grpc::Status& st);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_CONNECTION_H_
