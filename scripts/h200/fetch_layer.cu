// The tier's own fixed GPU time a layer: the kernels the tier's nodes (and the join) launch for one layer of a
// one-token decode, 48 layers captured in a CUDA graph as a decode graph is, each variant timed per layer against an
// empty kernel a layer (the floor of a graph node). Nothing is copied: every pick is in a slot, so what is left is
// the fixed part the tier adds to a token whatever it moves (a GPU-stepped token's own part is 20-25 µs a layer
// longer than a token with every expert resident: docs/lab/2026-12-07-worker-openmp.md).
// Variants, each at tier sizes 8 and 64 (the rule's victim ranking loops over the tier):
//   empty     one empty kernel a layer
//   cont      a 32-byte device copy a layer (what ggml_cont of the picks becomes for one token)
//   decide    the rule's block, every pick a hit
//   copy      the rule, then the copy kernel with nothing to copy (as the copy node launches it)
//   publish   the rule, the publish block into a stage in pinned memory (fetch-split: the host chain's inputs, the
//             fences), then the copy kernel
//   join      a join whose answer is already there (the worker's add, its reads of host memory)
// The kernels are the engine's own (moe-fetch.cu and moe-join.cu compiled in). Before each replay 256 MiB are
// written so the tier's state is not in L2, as in a token, where the weights stream through it.
// Build and run on the GPU box from the repository root (the engine's source exported in .export/):
//   G=.export/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml
//   nvcc -std=c++17 -O3 -arch=sm_90 -I$G/include -I$G/src -I$G/src/ggml-cuda scripts/h200/fetch_layer.cu \
//        -o /tmp/fetch_layer -Xlinker --unresolved-symbols=ignore-all && /tmp/fetch_layer
// (the ops' host-side entry points, compiled in and never called, need libggml: left unresolved.)
// Prints one line a variant and tier size: the median µs a layer over 350 replays, and the 10th and 90th percentiles.
#include "moe-fetch.cu"
#include "moe-join.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int N_LAYER = 48;
constexpr int N_EXPERT = 128;
constexpr int N_USED = 8;
constexpr int N_EMBD = 2048;
constexpr int REPLAYS = 400;
constexpr int WARMUP = 50;

#define CHECK(x)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));             \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

template <typename T> T * device_copy(const std::vector<T> & v) {
    T * p = nullptr;
    CHECK(cudaMalloc(&p, v.size()*sizeof(T)));
    CHECK(cudaMemcpy(p, v.data(), v.size()*sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

char * pinned(size_t size) {
    char * p = nullptr;
    CHECK(cudaHostAlloc((void **) &p, size, cudaHostAllocDefault));
    memset(p, 0, size);
    return p;
}

__global__ void empty_kernel() {}

// one layer's tier: every pick in a tier slot (a hit), nothing to copy
struct layer_state {
    int32_t *            ids, * map, * resident, * entry, * in_tier, * copies, * out;
    double *             score;
    unsigned long long * counts;
    char *               stage;   // pinned: words, ids, cur
    char *               answer;  // pinned: words (done = want), then the share
};

layer_state make_layer(int il, int D) {
    std::vector<int32_t> map(N_EXPERT, -1), in_tier(N_EXPERT, 0), resident(D), entry(D), ids(N_USED);
    std::vector<double>  score(N_EXPERT);
    for (int j = 0; j < D; ++j) {
        resident[j] = (j + il) % N_EXPERT;
        entry[j]    = j;
        map[resident[j]]     = j;
        in_tier[resident[j]] = 1;
    }
    for (int j = 0; j < N_USED; ++j) {
        ids[j] = resident[(j*D)/N_USED];
    }
    for (int e = 0; e < N_EXPERT; ++e) {
        score[e] = 0.1*((e*37) % 101);
    }
    layer_state l;
    l.ids      = device_copy(ids);
    l.map      = device_copy(map);
    l.resident = device_copy(resident);
    l.entry    = device_copy(entry);
    l.in_tier  = device_copy(in_tier);
    l.score    = device_copy(score);
    l.copies   = device_copy(std::vector<int32_t>(1 + 2*D, 0));
    l.out      = device_copy(std::vector<int32_t>(2*N_USED, 0));
    l.counts   = device_copy(std::vector<unsigned long long>(8, 0));
    l.stage    = pinned(1 << 17);
    l.answer   = pinned(GGML_MOE_FETCH_JOIN_HEAD + N_EMBD*N_USED*sizeof(float));
    ((uint32_t *) l.stage)[0]  = 5;   // request 5 ...
    ((uint32_t *) l.answer)[1] = 5;   // ... answered already
    return l;
}

enum variant { EMPTY, CONT, DECIDE, COPY, PUBLISH, JOIN };
const char * const NAMES[] = { "empty", "cont", "decide", "copy", "publish", "join" };

void enqueue(variant v, const layer_state & l, int D, const moe_fetch_packs & p, const float * cur, float * y,
             cudaStream_t s) {
    if (v == EMPTY) {
        empty_kernel<<<1, 32, 0, s>>>();
        return;
    }
    if (v == CONT) {
        CHECK(cudaMemcpyAsync(l.out, l.ids, N_USED*sizeof(int32_t), cudaMemcpyDeviceToDevice, s));
        return;
    }
    if (v == JOIN) {
        const int blocks = (N_EMBD*N_USED/4 + 255)/256;
        moe_fetch_join<<<blocks, 256, 0, s>>>(cur, l.answer, (const uint32_t *) l.stage, y,
                                              (int64_t) N_EMBD*N_USED, 1000000000ull);
        return;
    }
    const bool pub = v == PUBLISH;
    const size_t smem = (4*(size_t) N_EXPERT + (size_t) D)*sizeof(int);
    moe_fetch_decide<<<1, MOE_FETCH_BLOCK, smem, s>>>(
        l.ids, N_USED, 1, l.map, l.score, l.resident, l.entry, l.in_tier, l.counts, l.copies, N_EXPERT, D, 0.9,
        GGML_MOE_FETCH_MODE_STEP, l.out, pub ? 0.5 : 0.0);
    if (pub) {
        // the publish node's block, before the copies (as a layer's graph orders them)
        moe_fetch_publish<<<1, MOE_FETCH_BLOCK, 0, s>>>(l.ids, l.out, N_USED, cur, N_EMBD, (uint32_t *) l.stage,
                                                        (int32_t *) (l.stage + 64), N_USED, (float *) (l.stage + 128));
    }
    if (v != DECIDE) {
        moe_fetch_copy<<<dim3(MOE_FETCH_COPY_BLOCKS, N_USED, 3), MOE_FETCH_BLOCK, 0, s>>>(l.copies, p, l.counts,
                                                                                         12288);
    }
}

void run(variant v, int D) {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    std::vector<layer_state> layers;
    for (int il = 0; il < N_LAYER; ++il) {
        layers.push_back(make_layer(il, D));
    }
    moe_fetch_packs p = {};
    for (int t = 0; t < 3; ++t) {
        p.host[t] = pinned(1 << 16);
        p.pack[t] = (char *) device_copy(std::vector<char>(1 << 16));
        p.slab[t] = 4096;
    }
    float * cur = device_copy(std::vector<float>(N_EMBD*N_USED, 1.0f));
    float * y   = device_copy(std::vector<float>(N_EMBD*N_USED, 0.0f));
    char *  flush = nullptr;
    CHECK(cudaMalloc(&flush, 256u << 20));

    cudaGraph_t     g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    for (const auto & l : layers) {
        enqueue(v, l, D, p, cur, y, s);
    }
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));

    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> us;
    for (int r = 0; r < REPLAYS; ++r) {
        CHECK(cudaMemsetAsync(flush, r & 0xff, 256u << 20, s));
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaGraphLaunch(ge, s));
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (r >= WARMUP) {
            us.push_back(ms*1000.0f/N_LAYER);
        }
    }
    std::sort(us.begin(), us.end());
    const size_t m = us.size();
    printf("| %s | %d | %.2f | %.2f | %.2f |\n", NAMES[v], D, us[m/2], us[m/10], us[(9*m)/10]);
    fflush(stdout);
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(s));
}

} // namespace

int main() {
    printf("| variant | tier slots | µs a layer (median) | p10 | p90 |\n|---|---|---|---|---|\n");
    for (int D : { 8, 64 }) {
        for (variant v : { EMPTY, CONT, DECIDE, COPY, PUBLISH, JOIN }) {
            run(v, D);
        }
    }
    return 0;
}
