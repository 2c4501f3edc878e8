// The one version of Topiary: `topiary info`, `topiaryd --version`, GetServerInfo and
// checkpoint provenance all print this. (0.9 brought sealed checkpoints, which messages about
// older files name; 0.10 the third hostile-input pass.)
#ifndef TOPIARY_PROTOS_VERSION_H_
#define TOPIARY_PROTOS_VERSION_H_

namespace topiary {

inline constexpr char kTopiaryVersion[] = "0.10.0";

}  // namespace topiary

#endif  // TOPIARY_PROTOS_VERSION_H_
