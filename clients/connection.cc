#include "clients/connection.h"

#include <chrono>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/text.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

std::string ServerAddress(const Args& a) {
  if (!a.server.empty()) return a.server;
  const char* env = std::getenv("TOPIARY_SERVER");
  return env && *env ? env : "127.0.0.1:7077";
}

int ExitCode(grpc::StatusCode code) { return ExitCodeForStatus(static_cast<int>(code)); }

}  // namespace

Connection::Connection(const Args& a) : address_(ServerAddress(a)) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!a.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    auto ca = ReadFile(a.tls_ca);
    if (ca.ok()) ssl.pem_root_certs = *ca;
    creds = grpc::SslCredentials(ssl);
  }
  stub_ = topiary::v1::Topiary::NewStub(grpc::CreateChannel(address_, creds));
  std::string token_file = a.token_file;
  if (token_file.empty() && std::getenv("TOPIARY_TOKEN_FILE")) {
    token_file = std::getenv("TOPIARY_TOKEN_FILE");
  }
  if (!token_file.empty()) {
    auto token = ReadFile(token_file);
    if (token.ok())
      token_ = std::string(absl::StripAsciiWhitespace(*token));
    else
      token_error_ = absl::StrCat("--token_file: ", token.status().message());
  }
}

std::unique_ptr<grpc::ClientContext> Connection::Context(bool stream) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  if (!stream) ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ctx;
}

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    default:
      return "ERROR";
  }
}

int Report(const Args& a, const Connection& c, const grpc::Status& st) {
  std::string message = st.error_message();
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    message = absl::StrCat("no topiaryd at ", c.address(), " (", message,
                           "); start one with `topiaryd` or set --server / TOPIARY_SERVER");
  }
  if (a.json) {
    absl::PrintF("{\"error\":%s,\"code\":\"%s\"}\n", JsonString(message),
                 CodeName(st.error_code()));
  } else {
    absl::FPrintF(stderr, "topiary: %s: %s\n", CodeName(st.error_code()), TerminalText(message));
  }
  return ExitCode(st.error_code());
}

}  // namespace topiary
