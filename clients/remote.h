// The topiary commands that talk to topiaryd: submit, list, get, watch, pause, resume, cancel,
// round, fork, checkpoints, and inspect of a checkpoint through the daemon. The server is
// --server ADDR, else $TOPIARY_SERVER, else 127.0.0.1:7077; --token_file (or
// $TOPIARY_TOKEN_FILE) sends the bearer token; --tls_ca FILE connects with TLS.
#ifndef TOPIARY_CLIENTS_REMOTE_H_
#define TOPIARY_CLIENTS_REMOTE_H_

#include <optional>
#include <string>

#include "clients/args.h"
#include "topiary/v1/service.pb.h"

namespace topiary {

bool IsRemoteCommand(const std::string& command);
// Runs a remote command; returns the exit code (clients/args.h).
int RunRemoteCommand(const Args& args);
// evaluate, sensitivity or export with --remote: the daemon runs the command on files in its
// data directory (server/command_runner.h); its output and exit code are this process's.
int RunInDaemon(const Args& args);
// `topiary info` adds the daemon's view when one answers at the server address.
void PrintRemoteInfo(const Args& args);
// The daemon's GetServerInfo (devices, queue, each GPU's occupant), or nullopt with why.
std::optional<topiary::v1::ServerInfo> FetchRemoteInfo(const Args& args, std::string* why);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_REMOTE_H_
