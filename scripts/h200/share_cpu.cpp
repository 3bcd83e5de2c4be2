// A layer's CPU share of a decode token on the CPU alone, computed as the scheduler's CPU split computes it today and
// as engine v3's persistent worker could: what is fixed per layer (waking the thread pool, a barrier after each op)
// and what scales with the experts. With scripts/h200/handoff.cu (the GPU's side of the hand-off) it prices engine
// v3's per-layer cost before it is built (docs/lab/2026-12-06-h100-layer-trace.md: the CPU split's fixed part was
// 65-115 us a layer at 16 threads).
//
// The 30B-A3B shape's experts (Q4_K gate and up 2048 x 768, down 768 x 2048: 2.654 MB an expert), EXPERTS of them in
// each of LAYERS layers (48 x 16 by default: 2 GB, more than any cache), random weights. Per layer the chain
// llama.cpp builds for a MoE layer's host experts: mul_mat_id (gate), mul_mat_id (up), swiglu, mul_mat_id (down),
// with k = 8 ids of which c are experts of this layer (drawn anew every token) and the rest -1 ("no expert", patch
// 0001), c in {0, 1, 2, 4}. Two ways a token's 48 layers are computed:
//   per layer: a graph of its own each (the scheduler's CPU split: the pool wakes once a layer);
//   one graph: every layer's chain in one graph (the pool wakes once a token; a barrier after each op remains).
// Each with the pool sleeping between graphs (poll 0) and spinning (poll 100). Printed: us a layer at each c, the
// fixed part (c = 0) and the rate of the experts' bytes ((t(4) - t(0)) against 4 experts).
//
// Built against the engine's ggml (the installed llama_cpp package's include/ and lib/):
//   g++ -O2 -std=c++17 scripts/h200/share_cpu.cpp -I$INC -L$LIB -lggml -lggml-base -lggml-cpu -Wl,-rpath,$LIB
//       -o /tmp/share_cpu && /tmp/share_cpu [THREADS,...] [LAYERS] [EXPERTS] [TOKENS]

#include "ggml.h"
#include "ggml-cpu.h"

#include "counts.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static const int N_EMBD = 2048, N_FF = 768, K = 8;

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// random Q4_K blocks with a small valid scale: d and dmin (the block's first two halves) set, the rest random bytes
static void fill_q4_k(ggml_tensor * t, uint64_t seed) {
    const size_t bs = ggml_type_size(GGML_TYPE_Q4_K), n = ggml_nbytes(t) / bs;
    const ggml_fp16_t d = ggml_fp32_to_fp16(1e-3f), dmin = ggml_fp32_to_fp16(1e-4f);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t b = 0; b < n; ++b) {
        uint8_t * p = (uint8_t *) t->data + b * bs;
        for (size_t i = 0; i + 8 <= bs; i += 8) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            memcpy(p + i, &x, 8);
        }
        memcpy(p, &d, 2);
        memcpy(p + 2, &dmin, 2);
    }
}

struct Layer {
    ggml_tensor * gate, * up, * down;   // [N_EMBD, N_FF, E], [N_EMBD, N_FF, E], [N_FF, N_EMBD, E]
    ggml_tensor * ids;                  // [K, 1] I32
    ggml_tensor * out;                  // [N_EMBD, K, 1]
};

int main(int argc, char ** argv) {
    const std::vector<int> thread_counts = parse_counts(argc > 1 ? argv[1] : "15,6");
    if (thread_counts.empty()) { printf("bad thread count in %s\n", argv[1]); return 1; }
    const int L = argc > 2 ? std::atoi(argv[2]) : 48;
    const int E = argc > 3 ? std::atoi(argv[3]) : 16;
    const int T = argc > 4 ? std::atoi(argv[4]) : 40;
    if (L < 1 || E < 4 || T < 3) { printf("LAYERS >= 1, EXPERTS >= 4, TOKENS >= 3\n"); return 1; }

    const size_t w_bytes = (size_t) L * 3 * ggml_row_size(GGML_TYPE_Q4_K, N_EMBD) * N_FF * E;
    ggml_init_params wp = { w_bytes + (size_t) L * 3 * ggml_tensor_overhead() + (1 << 20), nullptr, false };
    ggml_context * wctx = ggml_init(wp);
    ggml_init_params gp = { (size_t) 256 << 20, nullptr, false };
    ggml_context * gctx = ggml_init(gp);
    if (!wctx || !gctx) { printf("out of memory for %.1f GB of experts\n", w_bytes / 1e9); return 1; }
    const double slab_mb = 3.0 * ggml_row_size(GGML_TYPE_Q4_K, N_EMBD) * N_FF / 1e6;
    printf("%d layers x %d experts, %.3f MB an expert, %.2f GB of experts\n", L, E, slab_mb, w_bytes / 1e9);

    ggml_tensor * cur = ggml_new_tensor_3d(gctx, GGML_TYPE_F32, N_EMBD, 1, 1);
    for (int i = 0; i < N_EMBD; ++i) ((float *) cur->data)[i] = 0.01f * (float) ((i * 7919) % 201 - 100);
    std::vector<Layer> layers(L);
    ggml_cgraph * whole = ggml_new_graph_custom(gctx, (size_t) L * 16, false);
    std::vector<ggml_cgraph *> per(L);
    for (int l = 0; l < L; ++l) {
        Layer & y = layers[l];
        y.gate = ggml_new_tensor_3d(wctx, GGML_TYPE_Q4_K, N_EMBD, N_FF, E);
        y.up   = ggml_new_tensor_3d(wctx, GGML_TYPE_Q4_K, N_EMBD, N_FF, E);
        y.down = ggml_new_tensor_3d(wctx, GGML_TYPE_Q4_K, N_FF, N_EMBD, E);
        fill_q4_k(y.gate, 3 * l + 1);
        fill_q4_k(y.up, 3 * l + 2);
        fill_q4_k(y.down, 3 * l + 3);
        y.ids = ggml_new_tensor_2d(gctx, GGML_TYPE_I32, K, 1);
        ggml_tensor * g = ggml_mul_mat_id(gctx, y.gate, cur, y.ids);     // [N_FF, K, 1]
        ggml_tensor * u = ggml_mul_mat_id(gctx, y.up, cur, y.ids);
        ggml_tensor * a = ggml_swiglu_split(gctx, g, u);
        y.out = ggml_mul_mat_id(gctx, y.down, a, y.ids);                 // [N_EMBD, K, 1]
        per[l] = ggml_new_graph(gctx);
        ggml_build_forward_expand(per[l], y.out);
        ggml_build_forward_expand(whole, y.out);
    }

    std::mt19937 rng(7);
    auto draw = [&](int c) {            // c experts of each layer for this token, the other ids -1
        for (Layer & y : layers) {
            int32_t * ids = (int32_t *) y.ids->data;
            std::vector<int> e(E);
            for (int i = 0; i < E; ++i) e[i] = i;
            std::shuffle(e.begin(), e.end(), rng);
            for (int j = 0; j < K; ++j) ids[j] = j < c ? e[j] : -1;
        }
    };
    const int cs[] = {0, 1, 2, 4};
    for (int n : thread_counts) {
        for (int poll : {0, 100}) {
            ggml_threadpool_params tpp = ggml_threadpool_params_default(n);
            tpp.poll = poll;
            ggml_threadpool * tp = ggml_threadpool_new(&tpp);
            for (bool one : {false, true}) {
                ggml_cplan plan = ggml_graph_plan(one ? whole : per[0], n, tp);
                std::vector<uint8_t> work(plan.work_size + 1);
                plan.work_data = work.data();
                double at[4] = {0};
                for (int ci = 0; ci < 4; ++ci) {
                    std::vector<double> tok;
                    for (int t = 0; t < T; ++t) {
                        draw(cs[ci]);
                        const double t0 = now_us();
                        if (one) {
                            ggml_graph_compute(whole, &plan);
                        } else {
                            for (int l = 0; l < L; ++l) ggml_graph_compute(per[l], &plan);
                        }
                        if (t >= 2) tok.push_back((now_us() - t0) / L);      // the first two warm the pool
                    }
                    std::sort(tok.begin(), tok.end());
                    at[ci] = tok[tok.size() / 2];
                }
                const double gbps = at[3] > at[0] ? 4 * slab_mb / (at[3] - at[0]) * 1e3 : 0.0;
                printf("%2d threads, poll %3d, %s: us a layer at 0/1/2/4 CPU experts: %.1f / %.1f / %.1f / %.1f; "
                       "fixed %.1f us, experts at %.1f GB/s\n", n, poll, one ? "one graph a token" : "a graph a layer ",
                       at[0], at[1], at[2], at[3], at[0], gbps);
                fflush(stdout);
            }
            ggml_threadpool_free(tp);
        }
    }
    ggml_free(gctx);
    ggml_free(wctx);
    return 0;
}
