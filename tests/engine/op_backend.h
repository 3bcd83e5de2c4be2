// The backend an op test runs on, named on its command line (CPU, CUDA0, ...), and the host buffer type for what
// the op reads or writes in host memory: the CPU's, or the device's own (pinned memory for CUDA). Shared by
// moe_fetch_op.cpp and moe_join_op.cpp.
#pragma once

#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cstdio>
#include <string>

struct op_backend {
    ggml_backend_t             backend   = nullptr;
    ggml_backend_buffer_type_t host_buft = nullptr;
    bool                       is_cpu    = false;
};

// false, said on stderr, when there is no such backend or it has no host buffer type
static bool op_backend_init(const std::string & name, op_backend & b) {
    b.backend = ggml_backend_init_by_name(name.c_str(), nullptr);
    if (b.backend == nullptr) {
        fprintf(stderr, "no backend named %s\n", name.c_str());
        return false;
    }
    ggml_backend_dev_t dev = ggml_backend_get_device(b.backend);
    b.is_cpu    = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
    b.host_buft = b.is_cpu ? ggml_backend_cpu_buffer_type() : ggml_backend_dev_host_buffer_type(dev);
    if (b.host_buft == nullptr) {
        fprintf(stderr, "%s has no host buffer type\n", name.c_str());
        return false;
    }
    return true;
}
