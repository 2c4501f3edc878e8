// topiary upload / download / files: files in and out of the daemon's data directory over
// gRPC (server/file_transfer.h has the daemon's rules). Both directions send each file's
// SHA-256 and check it at the other end; both can be run again after a failure:
// - upload skips files already there with the same checksum (a file there with other
//   content is refused before anything is sent, never replaced);
// - download writes FILE.part and continues it from where it stopped, then checks the whole
//   file's checksum and renames it; a local file with other content is never replaced.
#ifndef TOPIARY_CLIENTS_FILE_COMMANDS_H_
#define TOPIARY_CLIENTS_FILE_COMMANDS_H_

#include <string>

#include "clients/args.h"
#include "clients/connection.h"

namespace topiary {

// topiary upload LOCAL REMOTE: a file, or a folder with everything under it.
int UploadCommand(const Args& a, Connection& c);
// topiary download REMOTE [LOCAL]: a file or a folder (default: its name, here).
int DownloadCommand(const Args& a, Connection& c);
// topiary files [REMOTE] [--sha256]: what is there.
int FilesCommand(const Args& a, Connection& c);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_FILE_COMMANDS_H_
