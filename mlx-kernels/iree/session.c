// See session.h. Written against IREE 3.13's C API (the runtime eerie-sys
// builds): iree/runtime for the session, iree/io and
// iree/modules/io/parameters for the parameters.

#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iree/async/util/proactor_pool.h"
#include "iree/hal/drivers/local_task/task_device.h"
#include "iree/hal/drivers/local_task/task_driver.h"
#include "iree/hal/local/executable_plugin_manager.h"
#include "iree/hal/local/loaders/registration/init.h"
#include "iree/io/file_handle.h"
#include "iree/io/parameter_index.h"
#include "iree/io/parameter_index_provider.h"
#include "iree/modules/io/parameters/module.h"
#include "iree/runtime/api.h"
#include "iree/task/executor.h"
#include "iree/task/topology.h"

struct mlxcel_iree_session_t {
  iree_runtime_instance_t* instance;
  iree_hal_device_t* device;
  iree_runtime_session_t* session;
};

// The status as a heap string (NULL for OK), the status freed.
static char* take_error(iree_status_t status, const char* what) {
  if (iree_status_is_ok(status)) return NULL;
  iree_allocator_t allocator = iree_allocator_system();
  char* text = NULL;
  iree_host_size_t length = 0;
  const char* detail = "(no detail)";
  if (iree_status_to_string(status, &allocator, &text, &length)) detail = text;
  size_t size = strlen(what) + strlen(detail) + 3;
  char* message = (char*)malloc(size);
  if (message) snprintf(message, size, "%s: %s", what, detail);
  if (text) iree_allocator_free(allocator, text);
  iree_status_free(status);
  return message ? message : strdup("out of memory formatting an IREE error");
}

static char* error_text(const char* text) { return strdup(text); }

void mlxcel_iree_free_error(char* message) { free(message); }

void mlxcel_iree_session_destroy(mlxcel_iree_session_t* s) {
  if (!s) return;
  if (s->session) iree_runtime_session_release(s->session);
  if (s->device) iree_hal_device_release(s->device);
  if (s->instance) iree_runtime_instance_release(s->instance);
  free(s);
}

// The index of `params` over one file handle wrapping `mapping`, served under
// `scope` by the io_parameters module, appended to the session.
static iree_status_t append_parameters(mlxcel_iree_session_t* s, iree_string_view_t scope,
                                       const uint8_t* mapping, size_t mapping_len,
                                       const mlxcel_iree_parameter_t* params, size_t count) {
  iree_allocator_t host = iree_allocator_system();
  iree_io_file_handle_t* file = NULL;
  // IREE only reads parameters (access READ); the span is not const in its
  // signature because a file handle may also be written.
  IREE_RETURN_IF_ERROR(iree_io_file_handle_wrap_host_allocation(
      IREE_IO_FILE_ACCESS_READ, iree_make_byte_span((void*)mapping, mapping_len),
      iree_io_file_handle_release_callback_null(), host, &file));
  iree_io_parameter_index_t* index = NULL;
  iree_status_t status = iree_io_parameter_index_create(host, &index);
  if (iree_status_is_ok(status)) status = iree_io_parameter_index_reserve(index, count);
  for (size_t i = 0; i < count && iree_status_is_ok(status); ++i) {
    if (params[i].offset > mapping_len || params[i].length > mapping_len - params[i].offset) {
      status = iree_make_status(IREE_STATUS_OUT_OF_RANGE, "parameter %.*s lies outside the mapping",
                                (int)params[i].name_len, params[i].name);
      break;
    }
    iree_io_parameter_index_entry_t entry;
    memset(&entry, 0, sizeof(entry));
    entry.key = iree_make_string_view(params[i].name, params[i].name_len);
    entry.length = params[i].length;
    entry.type = IREE_IO_PARAMETER_INDEX_ENTRY_STORAGE_TYPE_FILE;
    entry.storage.file.handle = file;
    entry.storage.file.offset = params[i].offset;
    status = iree_io_parameter_index_add(index, &entry);
  }
  iree_io_parameter_provider_t* provider = NULL;
  if (iree_status_is_ok(status)) {
    status = iree_io_parameter_index_provider_create(
        scope, index, IREE_IO_PARAMETER_INDEX_PROVIDER_DEFAULT_MAX_CONCURRENT_OPERATIONS, host,
        &provider);
  }
  iree_vm_module_t* module = NULL;
  if (iree_status_is_ok(status)) {
    status = iree_io_parameters_module_create(iree_runtime_instance_vm_instance(s->instance), 1,
                                              &provider, host, &module);
  }
  if (iree_status_is_ok(status)) status = iree_runtime_session_append_module(s->session, module);
  if (module) iree_vm_module_release(module);
  if (provider) iree_io_parameter_provider_release(provider);
  if (index) iree_io_parameter_index_release(index);
  iree_io_file_handle_release(file);
  return status;
}

// A local-task device whose thread pool has `threads` workers. IREE's own
// registration of local-task sizes the pool from its command-line flags
// (one worker per physical core), which a library cannot take from its
// caller; this builds the same driver with the count given.
static iree_status_t create_task_device(int32_t threads, iree_hal_device_t** out_device) {
  iree_allocator_t host = iree_allocator_system();
  iree_task_topology_t topology;
  iree_task_topology_initialize_from_group_count((iree_host_size_t)threads, &topology);
  iree_task_executor_options_t executor_options;
  iree_task_executor_options_initialize(&executor_options);
  iree_task_executor_t* executor = NULL;
  iree_status_t status = iree_task_executor_create(executor_options, &topology, host, &executor);
  iree_task_topology_deinitialize(&topology);

  iree_hal_executable_plugin_manager_t* plugins = NULL;
  if (iree_status_is_ok(status)) status = iree_hal_executable_plugin_manager_create(0, host, &plugins);
  iree_hal_executable_loader_t* loaders[8] = {NULL};
  iree_host_size_t loader_count = 0;
  if (iree_status_is_ok(status)) {
    status = iree_hal_create_all_available_executable_loaders(plugins, IREE_ARRAYSIZE(loaders),
                                                              &loader_count, loaders, host);
  }
  iree_hal_allocator_t* device_allocator = NULL;
  if (iree_status_is_ok(status)) {
    status = iree_hal_allocator_create_heap(IREE_SV("local"), host, host, &device_allocator);
  }
  iree_hal_driver_t* driver = NULL;
  if (iree_status_is_ok(status)) {
    iree_hal_task_device_params_t params;
    iree_hal_task_device_params_initialize(&params);
    status = iree_hal_task_driver_create(IREE_SV("local-task"), &params, 1, &executor, loader_count,
                                         loaders, device_allocator, host, &driver);
  }
  // Devices need a proactor pool for their async I/O (as
  // iree_runtime_instance_try_create_default_device makes one).
  iree_async_proactor_pool_t* proactors = NULL;
  if (iree_status_is_ok(status)) {
    status = iree_async_proactor_pool_create(iree_numa_node_count(), /*node_ids=*/NULL,
                                             iree_async_proactor_pool_options_default(), host,
                                             &proactors);
  }
  if (iree_status_is_ok(status)) {
    iree_hal_device_create_params_t create = iree_hal_device_create_params_default();
    create.proactor_pool = proactors;
    status = iree_hal_driver_create_default_device(driver, &create, host, out_device);
  }

  if (proactors) iree_async_proactor_pool_release(proactors);
  if (driver) iree_hal_driver_release(driver);
  if (device_allocator) iree_hal_allocator_release(device_allocator);
  for (iree_host_size_t i = 0; i < loader_count; ++i) iree_hal_executable_loader_release(loaders[i]);
  if (plugins) iree_hal_executable_plugin_manager_release(plugins);
  if (executor) iree_task_executor_release(executor);
  return status;
}

char* mlxcel_iree_session_create(const char* driver, size_t driver_len, int32_t threads,
                                 const uint8_t* module, size_t module_len, const char* scope,
                                 size_t scope_len,
                                 const uint8_t* mapping, size_t mapping_len,
                                 const mlxcel_iree_parameter_t* params, size_t param_count,
                                 mlxcel_iree_session_t** out_session) {
  *out_session = NULL;
  mlxcel_iree_session_t* s = (mlxcel_iree_session_t*)calloc(1, sizeof(*s));
  if (!s) return error_text("out of memory creating an IREE session");
  iree_allocator_t host = iree_allocator_system();
  iree_runtime_instance_options_t options;
  iree_runtime_instance_options_initialize(&options);
  iree_runtime_instance_options_use_all_available_drivers(&options);
  char* error = take_error(iree_runtime_instance_create(&options, host, &s->instance),
                           "creating the IREE instance");
  iree_string_view_t driver_name = iree_make_string_view(driver, driver_len);
  if (!error && threads > 0 && iree_string_view_equal(driver_name, IREE_SV("local-task"))) {
    error = take_error(create_task_device(threads, &s->device), "creating the IREE device");
  } else if (!error) {
    error = take_error(
        iree_runtime_instance_try_create_default_device(s->instance, driver_name, &s->device),
        "creating the IREE device");
  }
  if (!error) {
    iree_runtime_session_options_t session_options;
    iree_runtime_session_options_initialize(&session_options);
    error = take_error(iree_runtime_session_create_with_device(s->instance, &session_options,
                                                               s->device, host, &s->session),
                       "creating the IREE session");
  }
  if (!error) {
    error = take_error(append_parameters(s, iree_make_string_view(scope, scope_len), mapping,
                                         mapping_len, params, param_count),
                       "serving the bundle's tensors as IREE parameters");
  }
  if (!error) {
    // Borrowed (a null deallocator): the bytes stay in the caller's mapping.
    error = take_error(iree_runtime_session_append_bytecode_module_from_memory(
                           s->session, iree_make_const_byte_span(module, module_len),
                           iree_allocator_null()),
                       "loading the IREE module");
  }
  if (error) {
    mlxcel_iree_session_destroy(s);
    return error;
  }
  *out_session = s;
  return NULL;
}

char* mlxcel_iree_buffer_zeros(mlxcel_iree_session_t* s, uint64_t bytes, void** out_buffer) {
  *out_buffer = NULL;
  iree_hal_buffer_params_t params;
  memset(&params, 0, sizeof(params));
  params.usage = IREE_HAL_BUFFER_USAGE_DEFAULT;
  params.type = IREE_HAL_MEMORY_TYPE_DEVICE_LOCAL;
  iree_hal_buffer_t* buffer = NULL;
  char* error = take_error(
      iree_hal_allocator_allocate_buffer(iree_runtime_session_device_allocator(s->session), params,
                                         (iree_device_size_t)bytes, &buffer),
      "allocating an IREE buffer");
  if (error) return error;
  // Zeroed from the host in pieces, so that the staging memory stays small.
  enum { CHUNK = 1 << 20 };
  void* zeros = calloc(1, CHUNK);
  if (!zeros) {
    iree_hal_buffer_release(buffer);
    return error_text("out of memory zeroing an IREE buffer");
  }
  for (uint64_t at = 0; at < bytes && !error; at += CHUNK) {
    uint64_t n = bytes - at < CHUNK ? bytes - at : CHUNK;
    error = take_error(iree_hal_device_transfer_h2d(
                           s->device, zeros, buffer, (iree_device_size_t)at, (iree_device_size_t)n,
                           IREE_HAL_TRANSFER_BUFFER_FLAG_DEFAULT, iree_infinite_timeout()),
                       "zeroing an IREE buffer");
  }
  free(zeros);
  if (error) {
    iree_hal_buffer_release(buffer);
    return error;
  }
  *out_buffer = buffer;
  return NULL;
}

void mlxcel_iree_buffer_release(void* buffer) {
  if (buffer) iree_hal_buffer_release((iree_hal_buffer_t*)buffer);
}

static iree_hal_element_type_t element_type(int32_t element) {
  return element == MLXCEL_IREE_F32 ? IREE_HAL_ELEMENT_TYPE_FLOAT_32 : IREE_HAL_ELEMENT_TYPE_SINT_32;
}

// The buffer view of one argument (retained for the caller).
static iree_status_t argument_view(mlxcel_iree_session_t* s, const mlxcel_iree_arg_t* arg,
                                   iree_hal_buffer_view_t** out_view) {
  if (arg->rank > MLXCEL_IREE_MAX_RANK) {
    return iree_make_status(IREE_STATUS_INVALID_ARGUMENT, "rank %zu", arg->rank);
  }
  iree_hal_dim_t dims[MLXCEL_IREE_MAX_RANK];
  uint64_t elements = 1;
  for (size_t d = 0; d < arg->rank; ++d) {
    if (arg->dims[d] < 0) return iree_make_status(IREE_STATUS_INVALID_ARGUMENT, "negative dimension");
    dims[d] = (iree_hal_dim_t)arg->dims[d];
    elements *= (uint64_t)arg->dims[d];
  }
  iree_allocator_t host = iree_allocator_system();
  iree_hal_element_type_t type = element_type(arg->element);
  iree_hal_encoding_type_t encoding = IREE_HAL_ENCODING_TYPE_DENSE_ROW_MAJOR;
  uint64_t bytes = elements * 4;
  if (arg->kind == MLXCEL_IREE_ARG_HOST) {
    iree_hal_buffer_params_t params;
    memset(&params, 0, sizeof(params));
    params.usage = IREE_HAL_BUFFER_USAGE_DEFAULT;
    params.type = IREE_HAL_MEMORY_TYPE_DEVICE_LOCAL;
    return iree_hal_buffer_view_allocate_buffer_copy(
        s->device, iree_runtime_session_device_allocator(s->session), arg->rank, dims, type,
        encoding, params, iree_make_const_byte_span(arg->host, (iree_host_size_t)bytes), out_view);
  }
  iree_hal_buffer_t* buffer = (iree_hal_buffer_t*)arg->buffer;
  iree_hal_buffer_t* range = NULL;
  IREE_RETURN_IF_ERROR(iree_hal_buffer_subspan(buffer, (iree_device_size_t)arg->offset,
                                               (iree_device_size_t)bytes, host, &range));
  iree_status_t status =
      iree_hal_buffer_view_create(range, arg->rank, dims, type, encoding, host, out_view);
  iree_hal_buffer_release(range);
  return status;
}

static iree_status_t call(mlxcel_iree_session_t* s, iree_string_view_t function,
                          const mlxcel_iree_arg_t* args, size_t arg_count, float* out,
                          size_t out_len) {
  iree_runtime_call_t call;
  IREE_RETURN_IF_ERROR(iree_runtime_call_initialize_by_name(s->session, function, &call));
  iree_status_t status = iree_ok_status();
  for (size_t i = 0; i < arg_count && iree_status_is_ok(status); ++i) {
    iree_hal_buffer_view_t* view = NULL;
    status = argument_view(s, &args[i], &view);
    if (iree_status_is_ok(status)) {
      status = iree_runtime_call_inputs_push_back_buffer_view(&call, view);
      iree_hal_buffer_view_release(view);
    }
  }
  if (iree_status_is_ok(status)) status = iree_runtime_call_invoke(&call, 0);
  iree_hal_buffer_view_t* result = NULL;
  if (iree_status_is_ok(status)) {
    status = iree_runtime_call_outputs_pop_front_buffer_view(&call, &result);
  }
  if (iree_status_is_ok(status)) {
    iree_device_size_t bytes = iree_hal_buffer_view_byte_length(result);
    if (iree_hal_buffer_view_element_type(result) != IREE_HAL_ELEMENT_TYPE_FLOAT_32 ||
        bytes != (iree_device_size_t)out_len * sizeof(float)) {
      status = iree_make_status(IREE_STATUS_FAILED_PRECONDITION,
                                "the first result holds %" PRIu64 " bytes, not %zu f32 values",
                                (uint64_t)bytes, out_len);
    } else {
      status = iree_hal_device_transfer_d2h(s->device, iree_hal_buffer_view_buffer(result), 0, out,
                                            bytes, IREE_HAL_TRANSFER_BUFFER_FLAG_DEFAULT,
                                            iree_infinite_timeout());
    }
  }
  if (result) iree_hal_buffer_view_release(result);
  iree_runtime_call_deinitialize(&call);
  return status;
}

char* mlxcel_iree_call(mlxcel_iree_session_t* s, const char* function, size_t function_len,
                       const mlxcel_iree_arg_t* args, size_t arg_count, float* out,
                       size_t out_len) {
  iree_string_view_t name = iree_make_string_view(function, function_len);
  iree_status_t status = call(s, name, args, arg_count, out, out_len);
  return take_error(status, "running the IREE module");
}
