// The glue between mlxcel and IREE's C runtime API: one session holding a
// device, the parameter module that serves a bundle's tensors straight from
// its memory map, and the bundle's compiled module; buffers for state the
// functions update in place (KV caches); and one call shape covering the
// module's prefill and decode functions. Rust reaches it through
// src/iree.rs, which owns the safety argument.
//
// Every function that can fail returns NULL on success or a message the
// caller frees with mlxcel_iree_free_error.

#ifndef MLXCEL_IREE_SESSION_H_
#define MLXCEL_IREE_SESSION_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlxcel_iree_session_t mlxcel_iree_session_t;

// One parameter: `name` (not NUL-terminated) is `length` bytes at `offset` of
// the mapping given to mlxcel_iree_session_create.
typedef struct mlxcel_iree_parameter_t {
  const char* name;
  size_t name_len;
  uint64_t offset;
  uint64_t length;
} mlxcel_iree_parameter_t;

// Element types of call arguments.
enum { MLXCEL_IREE_I32 = 0, MLXCEL_IREE_F32 = 1 };

// Argument kinds: host data copied into a new device buffer, or a byte range
// of a buffer from mlxcel_iree_buffer_zeros passed as it is (the function
// may write it in place).
enum { MLXCEL_IREE_ARG_HOST = 0, MLXCEL_IREE_ARG_BUFFER = 1 };

#define MLXCEL_IREE_MAX_RANK 4

typedef struct mlxcel_iree_arg_t {
  int32_t kind;
  int32_t element;
  const void* host;   // MLXCEL_IREE_ARG_HOST: the elements, row-major
  void* buffer;       // MLXCEL_IREE_ARG_BUFFER: from mlxcel_iree_buffer_zeros
  uint64_t offset;    // MLXCEL_IREE_ARG_BUFFER: byte offset into it
  size_t rank;
  int64_t dims[MLXCEL_IREE_MAX_RANK];
} mlxcel_iree_arg_t;

void mlxcel_iree_free_error(char* message);

// Creates a session on the HAL driver `driver` ("local-task", "local-sync",
// "cuda", ...; for local-task, `threads` > 0 workers, 0 IREE's default of one
// per physical core; other drivers ignore it) running the vmfb `module`
// (borrowed: it must outlive the session), whose parameters under `scope` are
// the `params` of `mapping` (borrowed too; imported without a copy where the
// device can read host memory).
char* mlxcel_iree_session_create(const char* driver, size_t driver_len, int32_t threads,
                                 const uint8_t* module, size_t module_len, const char* scope,
                                 size_t scope_len,
                                 const uint8_t* mapping, size_t mapping_len,
                                 const mlxcel_iree_parameter_t* params, size_t param_count,
                                 mlxcel_iree_session_t** out_session);
void mlxcel_iree_session_destroy(mlxcel_iree_session_t* session);

// A device buffer of `bytes` zero bytes.
char* mlxcel_iree_buffer_zeros(mlxcel_iree_session_t* session, uint64_t bytes, void** out_buffer);
void mlxcel_iree_buffer_release(void* buffer);

// Calls `function` with `args`; its first result (f32, exactly `out_len`
// elements) is copied to `out`, the others (written arguments) released.
char* mlxcel_iree_call(mlxcel_iree_session_t* session, const char* function, size_t function_len,
                       const mlxcel_iree_arg_t* args, size_t arg_count, float* out, size_t out_len);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // MLXCEL_IREE_SESSION_H_
