// Error propagation for absl::Status / absl::StatusOr at module boundaries.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SC_CONCAT_INNER_(a, b) a##b
#define SC_CONCAT_(a, b) SC_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function when not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status sc_status_ = (expr);      \
    if (!sc_status_.ok()) return sc_status_; \
  } while (0)

// Evaluates `expr` (an absl::StatusOr<T>); on error returns its status, else moves the value
// into `lhs` (which may be a declaration: `ASSIGN_OR_RETURN(auto x, F());`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(SC_CONCAT_(sc_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)   \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()

