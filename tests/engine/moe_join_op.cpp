// GGML_OP_MOE_FETCH_JOIN (moeslots patch 0010), the way llama.cpp's test-backend-ops tests an op: the join on the
// chosen backend against a reference written here from the op's contract (ggml.h): a + the answer's share, once the
// answer's done word equals the want word (a stage's done word, as for the worker's joins; here a one-row stage in the
// same pinned memory past the answer), both read in place from host memory the backend reads (the device's host
// buffer type: pinned memory for CUDA).
//
// Cases: shapes [n_embd, k, n] (a 30B-A3B layer's 2048 x 8 for one token and for a verify batch, small ones, and one
// whose size is not a multiple of 4, the kernel's scalar path); the answer there before the graph runs; the answer
// written by another thread 50 ms into the graph (the node must wait for it, and read the share written before the
// done word); a stale done word (the last request's) then the answer; no answer at all (after its timeout the node
// gives a alone and sets the failed word to the request; on the CPU the graph's compute returns
// GGML_STATUS_FAILED); an answer given up (the failed word already the request, as the worker marks the layers it
// gives up: the node gives a alone at once, not after its timeout). Every result must equal the reference bit for
// bit (one IEEE addition per element).
//
// Build against an installed engine (tests/engine/test_moe_join_op.py, scripts/h200/fetch-op.sh):
//   g++ -O2 -std=c++17 moe_join_op.cpp -I<include> -L<lib> -lggml -lggml-base -lggml-cpu -Wl,-rpath,<lib>
// Run: moe_join_op [--backend CPU|CUDA0]
// Prints one line per case and a summary; exit status 1 when a case fails.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include "op_backend.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

enum class answer_when { before, late, stale_then_late, never, given_up };

const char * when_name(answer_when w) {
    switch (w) {
        case answer_when::before:          return "answered before";
        case answer_when::late:            return "answered 50 ms late";
        case answer_when::stale_then_late: return "a stale done word, then answered";
        case answer_when::never:           return "never answered";
        case answer_when::given_up:        return "given up by whoever computes it";
    }
    return "";
}

void store_release(uint32_t * p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

// one join over a [n_embd, k, n] on the backend; false and why when the result or the words break the contract
bool run_case(ggml_backend_t backend, ggml_backend_buffer_type_t host_buft, int64_t n_embd, int64_t k, int64_t n,
              answer_when when, uint32_t seed, std::string & why) {
    const int64_t ne = n_embd*k*n;
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> a(ne), share(ne), want(ne);
    for (int64_t i = 0; i < ne; ++i) {
        a[i]     = dist(rng);
        share[i] = dist(rng);
    }
    const bool answered = when != answer_when::never && when != answer_when::given_up;
    for (int64_t i = 0; i < ne; ++i) {
        want[i] = answered ? a[i] + share[i] : a[i];
    }

    // the answer, then a one-row stage (k = 1) whose done word is the want word, in one buffer of host_buft
    const size_t answer_size = GGML_MOE_FETCH_JOIN_HEAD + (size_t) ne*sizeof(float);
    const size_t stage_at    = (answer_size + 63)/64*64;
    const size_t stage_size  = ggml_moe_fetch_stage_offset(1, 1, 0, GGML_MOE_FETCH_STAGE_CUR);
    ggml_backend_buffer_t answer_buf = ggml_backend_buft_alloc_buffer(host_buft, stage_at + stage_size);
    if (answer_buf == nullptr || !ggml_backend_buffer_is_host(answer_buf)) {
        why = "no host buffer for the answer";
        return false;
    }
    char     * answer = (char *) ggml_backend_buffer_get_base(answer_buf);
    uint32_t * words  = (uint32_t *) answer;
    uint32_t * want_w = (uint32_t *) (answer + stage_at) + 1;
    float    * sh     = (float *) (answer + GGML_MOE_FETCH_JOIN_HEAD);
    memset(answer + stage_at, 0, stage_size);
    ggml_init_params hp = { 2*ggml_tensor_overhead(), nullptr, true };
    ggml_context * hctx = ggml_init(hp);
    ggml_tensor * answer_t = ggml_new_tensor_1d(hctx, GGML_TYPE_I8, (int64_t) answer_size);
    ggml_tensor * stage_t  = ggml_new_tensor_1d(hctx, GGML_TYPE_I32, (int64_t) (stage_size/sizeof(int32_t)));
    if (ggml_backend_tensor_alloc(answer_buf, answer_t, answer) != GGML_STATUS_SUCCESS ||
        ggml_backend_tensor_alloc(answer_buf, stage_t, answer + stage_at) != GGML_STATUS_SUCCESS) {
        why = "no room for the answer's tensors";
        return false;
    }
    const uint32_t request = 40 + seed;
    memset(answer, 0, GGML_MOE_FETCH_JOIN_HEAD + (size_t) ne*sizeof(float));
    *want_w = request;
    if (when == answer_when::before) {
        memcpy(sh, share.data(), ne*sizeof(float));
        words[1] = request;
    } else if (when == answer_when::given_up) {
        words[2] = request; // (the failed word set to the request: the node must not wait for its timeout)
    } else if (when == answer_when::stale_then_late) {
        memcpy(sh, share.data(), ne*sizeof(float)); // (a stale answer's share must not be taken either)
        words[1] = request - 1;
    }

    ggml_init_params ip = { 8*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n_embd, k, n);
    ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    ggml_backend_tensor_set(x, a.data(), 0, ne*sizeof(float));
    const int timeout_ms = when == answer_when::never ? 30 : 20000;
    ggml_tensor * y = ggml_moe_fetch_join(ctx, x, answer_t, stage_t, timeout_ms);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    ggml_gallocr_alloc_graph(galloc, gf);

    std::thread writer;
    if (when == answer_when::late || when == answer_when::stale_then_late) {
        writer = std::thread([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            if (when == answer_when::late) {
                memcpy(sh, share.data(), ne*sizeof(float));
            }
            store_release(&words[1], request);
        });
    }
    const auto t0 = std::chrono::steady_clock::now();
    const ggml_status st = ggml_backend_graph_compute(backend, gf);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (writer.joinable()) {
        writer.join();
    }
    std::vector<float> got(ne);
    ggml_backend_tensor_get(y, got.data(), 0, ne*sizeof(float));

    const bool is_cpu = ggml_backend_dev_type(ggml_backend_get_device(backend)) == GGML_BACKEND_DEVICE_TYPE_CPU;
    if (answered && st != GGML_STATUS_SUCCESS) {
        why = "status " + std::to_string((int) st) + " for an answered join";
    } else if (!answered && is_cpu && st != GGML_STATUS_FAILED) {
        why = "status " + std::to_string((int) st) + ", not GGML_STATUS_FAILED, for a join never answered";
    } else if (memcmp(got.data(), want.data(), ne*sizeof(float)) != 0) {
        int64_t i = 0;
        while (i < ne && memcmp(&got[i], &want[i], sizeof(float)) == 0) {
            ++i;
        }
        why = "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", not " + std::to_string(want[i]);
    } else if (answered && words[2] != 0) {
        why = "an answered join set the failed word";
    } else if (!answered && words[2] != request) {
        why = "the failed word is " + std::to_string(words[2]) + ", not the request " + std::to_string(request);
    } else if (when == answer_when::never && ms < timeout_ms) {
        why = "it gave up before its timeout";
    } else if (when == answer_when::given_up && ms > timeout_ms / 2) {
        why = "it waited for its timeout (" + std::to_string(ms) + " ms) for an answer given up";
    } else if (when != answer_when::before && answered && ms < 45.0) {
        why = "it did not wait for the answer (" + std::to_string(ms) + " ms)";
    }
    ggml_gallocr_free(galloc);
    ggml_backend_buffer_free(xbuf);
    ggml_backend_buffer_free(answer_buf);
    ggml_free(hctx);
    ggml_free(ctx);
    return why.empty();
}

} // namespace

int main(int argc, char ** argv) {
    std::string name = "CPU";
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--backend" && i + 1 < argc) { name = argv[++i]; }
        else { fprintf(stderr, "usage: %s [--backend NAME]\n", argv[0]); return 2; }
    }
    op_backend ob;
    if (!op_backend_init(name, ob)) {
        return 2;
    }
    ggml_backend_t backend = ob.backend;
    ggml_backend_buffer_type_t host_buft = ob.host_buft;
    printf("backend %s, answers in %s\n", ggml_backend_name(backend), ggml_backend_buft_name(host_buft));
    const int64_t shapes[][3] = { { 2048, 8, 1 }, { 2048, 8, 4 }, { 64, 4, 3 }, { 7, 3, 1 } };
    const answer_when whens[] = { answer_when::before, answer_when::late, answer_when::stale_then_late,
                                  answer_when::never, answer_when::given_up };
    int n_pass = 0, n_fail = 0;
    uint32_t seed = 1;
    for (const auto & s : shapes) {
        for (answer_when w : whens) {
            std::string why;
            const bool ok = run_case(backend, host_buft, s[0], s[1], s[2], w, seed++, why);
            printf("%s [%lld, %lld, %lld] %s%s%s\n", ok ? "ok  " : "FAIL", (long long) s[0], (long long) s[1],
                   (long long) s[2], when_name(w), ok ? "" : ": ", why.c_str());
            (ok ? n_pass : n_fail)++;
        }
    }
    printf("%d passed, %d failed, 0 skipped\n", n_pass, n_fail);
    ggml_backend_free(backend);
    return n_fail ? 1 : 0;
}
