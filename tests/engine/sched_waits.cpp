// The scheduler rules of patch 0009 on the CPU, with a stand-in discrete device.
//
// GGML_TENSOR_FLAG_WAITS: before a split that begins with a node flagged WAITS, the scheduler does not wait for the
// previous backend's queue when that backend cannot use this split's buffers; without the flag, or where it can (an
// integrated device), it waits. The graph: b = a + a on FAKE (a: an input, so a split of its own), then c = 2 w on
// the CPU (w: an input on the CPU, so that split has no inputs to copy). The scheduler synchronizes FAKE once at the
// end of every graph; a wait before c's split is one synchronize more.
//
// GGML_TENSOR_FLAG_HOST_SRCS: a node flagged HOST_SRCS on FAKE reads a source in FAKE's host buffer type in place
// (the scheduler makes no copy of it); unflagged, or with the source in other host memory (the CPU's buffer type), or
// in a compute buffer of FAKE's host type (which the scheduler reuses), the node reads a copy. The graph: d = x + h on FAKE, x in FAKE's memory, h a weight in host memory.
//
// The stand-in device ("FAKE") owns its memory (a buffer type the CPU backend does not take) and a host buffer type
// of its own (host memory, which the CPU takes and FAKE does not), computes ADD of F32 synchronously and logs each
// synchronize the scheduler asks of it and, for d, whether it read h itself or a copy.
//
// Built against the installed engine's ggml and ggml-backend-impl.h from the same sdist (the stand-in's interface):
//   g++ -std=c++17 sched_waits.cpp -I<include> -I<dir of ggml-backend-impl.h> -L<lib> -lggml -lggml-base -lggml-cpu
// Prints one line per case and "N passed, M failed".

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-backend-impl.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static std::vector<std::string> g_log;
static bool g_integrated = false; // FAKE can use the CPU's buffers too (it then shares the CPU's memory)
static const void * g_watch = nullptr; // h's memory: whether FAKE's d reads it in place

// buffer: plain memory FAKE owns

static void fake_buffer_free(ggml_backend_buffer_t buffer) { free(buffer->context); }
static void * fake_buffer_base(ggml_backend_buffer_t buffer) { return buffer->context; }

static void fake_buffer_memset(ggml_backend_buffer_t, ggml_tensor * t, uint8_t value, size_t offset, size_t size) {
    memset((char *) t->data + offset, value, size);
}

static void fake_buffer_set(ggml_backend_buffer_t, ggml_tensor * t, const void * data, size_t offset, size_t size) {
    memcpy((char *) t->data + offset, data, size);
}

static void fake_buffer_get(ggml_backend_buffer_t, const ggml_tensor * t, void * data, size_t offset, size_t size) {
    memcpy(data, (const char *) t->data + offset, size);
}

static void fake_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    memset(buffer->context, value, buffer->size);
}

static const char * fake_buft_name(ggml_backend_buffer_type_t) { return "FAKE"; }
static const char * fake_host_buft_name(ggml_backend_buffer_type_t) { return "FAKE_Host"; }
static bool fake_host_buft_is_host(ggml_backend_buffer_type_t) { return true; }
static size_t fake_buft_alignment(ggml_backend_buffer_type_t) { return 64; }

static ggml_backend_buffer_t fake_buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    ggml_backend_buffer_i iface = {};
    iface.free_buffer   = fake_buffer_free;
    iface.get_base      = fake_buffer_base;
    iface.memset_tensor = fake_buffer_memset;
    iface.set_tensor    = fake_buffer_set;
    iface.get_tensor    = fake_buffer_get;
    iface.clear         = fake_buffer_clear;
    void * mem = aligned_alloc(64, (size + 63) / 64 * 64 + 64);
    return ggml_backend_buffer_init(buft, iface, mem, size);
}

// backend: ADD of F32, computed at once; each synchronize logged

static const char * fake_name(ggml_backend_t) { return "FAKE"; }
static void fake_free(ggml_backend_t) {}
static void fake_synchronize(ggml_backend_t) { g_log.push_back("sync"); }

static ggml_status fake_graph_compute(ggml_backend_t, ggml_cgraph * gf) {
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor * t = ggml_graph_node(gf, i);
        if (t->op != GGML_OP_ADD) {
            continue;
        }
        const float * x = (const float *) t->src[0]->data;
        const float * y = (const float *) t->src[1]->data;
        if (strcmp(t->name, "d") == 0) {
            g_log.push_back(t->src[1]->data == g_watch ? "reads-in-place" : "reads-a-copy");
        }
        float * d = (float *) t->data;
        for (int64_t j = 0; j < ggml_nelements(t); ++j) {
            d[j] = x[j] + y[j];
        }
    }
    g_log.push_back("compute");
    return GGML_STATUS_SUCCESS;
}

static ggml_backend_buffer_type g_buft;
static ggml_backend_buffer_type g_host_buft;
static ggml_backend_device      g_dev;
static ggml_backend_reg         g_reg;
static ggml_backend             g_backend;

static const char * fake_dev_name(ggml_backend_dev_t) { return "FAKE"; }
static void fake_dev_memory(ggml_backend_dev_t, size_t * free, size_t * total) { *free = *total = 0; }
static enum ggml_backend_dev_type fake_dev_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_GPU; }

static void fake_dev_props(ggml_backend_dev_t, ggml_backend_dev_props * props) {
    memset(props, 0, sizeof(*props));
    props->name        = "FAKE";
    props->description = "a stand-in discrete device";
    props->type        = GGML_BACKEND_DEVICE_TYPE_GPU;
}

static ggml_backend_t fake_dev_init(ggml_backend_dev_t, const char *) { return &g_backend; }
static ggml_backend_buffer_type_t fake_dev_buft(ggml_backend_dev_t) { return &g_buft; }
static ggml_backend_buffer_type_t fake_dev_host_buft(ggml_backend_dev_t) { return &g_host_buft; }

static bool fake_dev_supports_op(ggml_backend_dev_t, const ggml_tensor * op) {
    return (op->op == GGML_OP_ADD && op->type == GGML_TYPE_F32) || op->op == GGML_OP_NONE; // (NONE: a leaf it holds)
}

static bool fake_dev_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) {
    return buft == &g_buft || (g_integrated && ggml_backend_buft_is_host(buft));
}

static const char * fake_reg_name(ggml_backend_reg_t) { return "FAKE"; }
static size_t fake_reg_count(ggml_backend_reg_t) { return 1; }
static ggml_backend_dev_t fake_reg_device(ggml_backend_reg_t, size_t) { return &g_dev; }

// one of FAKE's buffer types: plain memory, its name, host memory where is_host says so
static void fake_buft_init(ggml_backend_buffer_type & buft, const char * (*name)(ggml_backend_buffer_type_t),
                           bool (*is_host)(ggml_backend_buffer_type_t)) {
    buft.iface = {};
    buft.iface.get_name      = name;
    buft.iface.alloc_buffer  = fake_buft_alloc;
    buft.iface.get_alignment = fake_buft_alignment;
    buft.iface.is_host       = is_host;
    buft.device  = &g_dev;
    buft.context = nullptr;
}

// FAKE first, then the CPU, in one scheduler (FAKE's integration with the CPU's memory as the case says)
struct fake_and_cpu {
    ggml_backend_t       cpu;
    ggml_backend_sched_t sched;

    explicit fake_and_cpu(bool integrated) {
        g_integrated = integrated;
        cpu = ggml_backend_cpu_init();
        ggml_backend_t backends[2] = { &g_backend, cpu };
        sched = ggml_backend_sched_new(backends, nullptr, 2, 64, false, false);
    }
    ~fake_and_cpu() {
        ggml_backend_sched_free(sched);
        ggml_backend_free(cpu);
    }
};

static void fake_init() {
    fake_buft_init(g_buft, fake_buft_name, nullptr);
    fake_buft_init(g_host_buft, fake_host_buft_name, fake_host_buft_is_host);

    g_reg.api_version = GGML_BACKEND_API_VERSION;
    g_reg.iface = {};
    g_reg.iface.get_name         = fake_reg_name;
    g_reg.iface.get_device_count = fake_reg_count;
    g_reg.iface.get_device       = fake_reg_device;
    g_reg.context = nullptr;

    g_dev.iface = {};
    g_dev.iface.get_name        = fake_dev_name;
    g_dev.iface.get_description = fake_dev_name;
    g_dev.iface.get_memory      = fake_dev_memory;
    g_dev.iface.get_type        = fake_dev_type;
    g_dev.iface.get_props       = fake_dev_props;
    g_dev.iface.init_backend    = fake_dev_init;
    g_dev.iface.get_buffer_type = fake_dev_buft;
    g_dev.iface.get_host_buffer_type = fake_dev_host_buft;
    g_dev.iface.supports_op     = fake_dev_supports_op;
    g_dev.iface.supports_buft   = fake_dev_supports_buft;
    g_dev.reg     = &g_reg;
    g_dev.context = nullptr;

    static ggml_guid guid = { 0x6d, 0x6f, 0x65, 0x73, 0x6c, 0x6f, 0x74, 0x73, 0x2d, 0x66, 0x61, 0x6b, 0x65, 0, 0, 1 };
    g_backend.guid = &guid;
    g_backend.iface = {};
    g_backend.iface.get_name      = fake_name;
    g_backend.iface.free          = fake_free;
    g_backend.iface.synchronize   = fake_synchronize;
    g_backend.iface.graph_compute = fake_graph_compute;
    g_backend.device  = &g_dev;
    g_backend.context = nullptr;
}

// one graph: the synchronizes of FAKE after its compute, and whether both results are right
static bool run_case(const char * name, bool flagged, bool integrated, int want_syncs_after) {
    fake_and_cpu both(integrated);
    ggml_backend_t       cpu   = both.cpu;
    ggml_backend_sched_t sched = both.sched;

    const int n = 64;
    ggml_init_params params = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    ggml_tensor * w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    ggml_set_input(a);
    ggml_set_input(w);
    ggml_tensor * b = ggml_add(ctx, a, a);
    ggml_tensor * c = ggml_scale(ctx, w, 2.0f);
    ggml_set_output(b);
    ggml_set_output(c);
    if (flagged) {
        c->flags |= GGML_TENSOR_FLAG_WAITS;
    }
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, b);
    ggml_build_forward_expand(gf, c);
    ggml_backend_sched_set_tensor_backend(sched, b, &g_backend);
    ggml_backend_sched_set_tensor_backend(sched, c, cpu);

    bool ok = ggml_backend_sched_alloc_graph(sched, gf);
    std::vector<float> va(n), vw(n), vb(n), vc(n);
    for (int i = 0; i < n; ++i) {
        va[i] = 0.5f*i;
        vw[i] = 1.0f + i;
    }
    if (ok) {
        ggml_backend_tensor_set(a, va.data(), 0, n*sizeof(float));
        ggml_backend_tensor_set(w, vw.data(), 0, n*sizeof(float));
        g_log.clear();
        ok = ggml_backend_sched_graph_compute(sched, gf) == GGML_STATUS_SUCCESS;
    }
    int syncs_after = -1;
    std::string seen;
    for (size_t i = 0; i < g_log.size(); ++i) {
        seen += (i ? " " : "") + g_log[i];
        if (g_log[i] == "compute") {
            syncs_after = 0;
        } else if (syncs_after >= 0) {
            syncs_after++;
        }
    }
    bool right = ok;
    if (ok) {
        ggml_backend_tensor_get(b, vb.data(), 0, n*sizeof(float));
        ggml_backend_tensor_get(c, vc.data(), 0, n*sizeof(float));
        for (int i = 0; i < n; ++i) {
            right = right && vb[i] == 2*va[i] && vc[i] == 2*vw[i];
        }
    }
    const int splits = ggml_backend_sched_get_n_splits(sched);
    const bool pass = right && splits == 2 && syncs_after == want_syncs_after;
    printf("%s %s: %d splits, FAKE's log: %s (synchronizes after its compute: %d, want %d)%s\n", pass ? "ok" : "FAIL",
           name, splits, seen.c_str(), syncs_after, want_syncs_after, right ? "" : "; wrong results");
    ggml_free(ctx);
    return pass;
}

// one graph: d = x + h on FAKE, h a weight in FAKE's host buffer type (or the CPU's); whether d read h itself
static bool run_host_case(const char * name, bool flagged, bool in_fake_host, bool want_in_place,
                          ggml_backend_buffer_usage usage = GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
    fake_and_cpu both(false);
    ggml_backend_sched_t sched = both.sched;

    const int n = 64;
    ggml_init_params wp = { 2*ggml_tensor_overhead(), nullptr, true };
    ggml_context * wctx = ggml_init(wp);
    ggml_tensor * x = ggml_new_tensor_1d(wctx, GGML_TYPE_F32, n);
    ggml_tensor * h = ggml_new_tensor_1d(wctx, GGML_TYPE_F32, n);
    ggml_backend_buffer_t xbuf = ggml_backend_buft_alloc_buffer(&g_buft, 64 + n*sizeof(float));
    ggml_backend_buffer_t hbuf = ggml_backend_buft_alloc_buffer(
            in_fake_host ? &g_host_buft : ggml_backend_cpu_buffer_type(), 64 + n*sizeof(float));
    ggml_backend_buffer_set_usage(hbuf, usage);
    bool ok = ggml_backend_tensor_alloc(xbuf, x, ggml_backend_buffer_get_base(xbuf)) == GGML_STATUS_SUCCESS &&
              ggml_backend_tensor_alloc(hbuf, h, ggml_backend_buffer_get_base(hbuf)) == GGML_STATUS_SUCCESS;
    std::vector<float> vx(n), vh(n), vd(n);
    for (int i = 0; i < n; ++i) {
        vx[i] = 0.25f*i;
        vh[i] = 3.0f - i;
    }
    if (ok) {
        ggml_backend_tensor_set(x, vx.data(), 0, n*sizeof(float));
        ggml_backend_tensor_set(h, vh.data(), 0, n*sizeof(float));
    }
    g_watch = h->data;

    ggml_init_params params = { 8*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * d = ggml_add(ctx, x, h);
    ggml_set_name(d, "d");
    ggml_set_output(d);
    if (flagged) {
        d->flags |= GGML_TENSOR_FLAG_HOST_SRCS;
    }
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, d);
    ggml_backend_sched_set_tensor_backend(sched, d, &g_backend);
    ok = ok && ggml_backend_sched_alloc_graph(sched, gf);
    g_log.clear();
    ok = ok && ggml_backend_sched_graph_compute(sched, gf) == GGML_STATUS_SUCCESS;
    bool right = ok;
    if (ok) {
        ggml_backend_tensor_get(d, vd.data(), 0, n*sizeof(float));
        for (int i = 0; i < n; ++i) {
            right = right && vd[i] == vx[i] + vh[i];
        }
    }
    std::string seen;
    bool in_place = false, read = false;
    for (const std::string & e : g_log) {
        seen += (seen.empty() ? "" : " ") + e;
        in_place = in_place || e == "reads-in-place";
        read     = read || e == "reads-in-place" || e == "reads-a-copy";
    }
    const bool pass = right && read && in_place == want_in_place;
    printf("%s %s: FAKE's log: %s (want %s)%s\n", pass ? "ok" : "FAIL", name, seen.c_str(),
           want_in_place ? "reads-in-place" : "reads-a-copy", right ? "" : "; wrong results");
    ggml_free(ctx);
    ggml_backend_buffer_free(xbuf);
    ggml_backend_buffer_free(hbuf);
    ggml_free(wctx);
    return pass;
}

int main() {
    fake_init();
    int passed = 0, failed = 0;
    // unflagged: the CPU's split waits for FAKE's queue first (1), then the graph's end (1)
    (run_case("unflagged, discrete", false, false, 2) ? passed : failed)++;
    // flagged: no wait before the CPU's split; the graph's end still synchronizes
    (run_case("flagged, discrete", true, false, 1) ? passed : failed)++;
    // flagged but FAKE can use the CPU's buffers (its allocator may share them): it waits
    (run_case("flagged, integrated", true, true, 2) ? passed : failed)++;
    // HOST_SRCS: a source in FAKE's host buffer type read in place only by a flagged node
    (run_host_case("host source, unflagged", false, true, false) ? passed : failed)++;
    (run_host_case("host source, flagged", true, true, true) ? passed : failed)++;
    // flagged, but the source in the CPU's memory (not memory FAKE maps): a copy
    (run_host_case("CPU source, flagged", true, false, false) ? passed : failed)++;
    // flagged, the source in FAKE's host buffer type but in compute memory (reused from split to split): a copy
    (run_host_case("host compute source, flagged", true, true, false, GGML_BACKEND_BUFFER_USAGE_COMPUTE) ? passed
                                                                                                       : failed)++;
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
