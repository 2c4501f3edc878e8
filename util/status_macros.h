// Status plumbing for code that returns absl::Status / absl::StatusOr across module
// boundaries (every layer, kernels included: this folder depends on nothing but Abseil).
//
// TOPIARY_RETURN_IF_ERROR(expr): returns the Status of `expr` when it is not OK.
// TOPIARY_ASSIGN_OR_RETURN(decl, expr): evaluates the StatusOr `expr`; returns its Status
//   when not OK, else declares or assigns `decl` from its value (moved), e.g.
//   TOPIARY_ASSIGN_OR_RETURN(auto doc, ReadH5File(path));
#ifndef TOPIARY_UTIL_STATUS_MACROS_H_
#define TOPIARY_UTIL_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TOPIARY_RETURN_IF_ERROR(expr)          \
  do {                                         \
    const absl::Status _topiary_st = (expr);   \
    if (!_topiary_st.ok()) return _topiary_st; \
  } while (0)

#define TOPIARY_STATUS_CONCAT_INNER(a, b) a##b
#define TOPIARY_STATUS_CONCAT(a, b) TOPIARY_STATUS_CONCAT_INNER(a, b)

#define TOPIARY_ASSIGN_OR_RETURN(decl, expr) \
  TOPIARY_ASSIGN_OR_RETURN_IMPL(TOPIARY_STATUS_CONCAT(_topiary_or_, __LINE__), decl, expr)

#define TOPIARY_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();       \
  decl = std::move(tmp).value()

#endif  // TOPIARY_UTIL_STATUS_MACROS_H_
