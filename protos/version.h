// The one version of Topiary: `topiary info`, `topiaryd --version`, GetServerInfo and
// checkpoint provenance all print this.
#ifndef TOPIARY_PROTOS_VERSION_H_
#define TOPIARY_PROTOS_VERSION_H_

namespace topiary {

inline constexpr char kTopiaryVersion[] = "0.3.0";

}  // namespace topiary

#endif  // TOPIARY_PROTOS_VERSION_H_
