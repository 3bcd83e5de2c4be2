// The per-layer hand-off between the GPU and a persistent CPU worker, without the scheduler: what engine v3's fixed
// cost per layer can be (docs/lab/2026-12-06-h100-layer-trace.md, "What to remove"; today a fetch-split layer pays
// 24-35 us for its CPU split's wait and join, and the target is under 10 us).
//   nvcc -O2 -arch=sm_90 -o /tmp/handoff scripts/h200/handoff.cu && /tmp/handoff [THREADS,...] [LAYERS] [TOKENS]
// Per layer, in one stream: a publish kernel writes the layer's input (2048 floats) and then, after a system fence, a
// request word into pinned host memory; a GPU kernel busy for GPU_US (the slot chain's own work) runs while the
// worker's THREADS threads, polling the request word, are busy for CPU_US (the share's experts) and write their
// slices of a 2048-float output; the last thread to arrive writes the done word; the GPU waits for it (a one-thread
// kernel spinning on the pinned word, or cuStreamWaitValue32), and a join kernel adds the output, read in place.
// Printed per layer: the whole layer, and its excess over max(GPU_US, CPU_US) plus the same kernels with nothing to
// wait for (the launches alone): the hand-off's own cost, the wait's own launch included. Trust the rows where
// GPU_US = CPU_US > 0 most: with no work on either side a stream's rows compare launch rates. THREADS defaults to
// 15,6: the engine's default (cores - 1), the host's own thread beside them. Also the cost of each extra tiny kernel
// a layer (two to four more are what splitting the fetch op by concern would add), in a stream and in a CUDA graph.
#include <cuda.h>
#include <cuda_runtime.h>
#include <immintrin.h>

#include "counts.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define CK(x) do { cudaError_t e = (x); \
    if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

static const int N_EMBD = 2048;

struct alignas(64) Word { volatile uint32_t v; uint32_t pad[15]; };

struct Stage {              // pinned host memory, mapped for the device
    Word req;               // written by the device after the input
    Word done;              // written by the worker's last thread after the output
    float x[N_EMBD];        // the layer's input
    float out[N_EMBD];      // the worker's sum
};

__global__ void publish(Stage * st, uint32_t * seq, const float * x) {
    for (int i = threadIdx.x; i < N_EMBD; i += blockDim.x) st->x[i] = x[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        const uint32_t s = *seq + 1;
        *seq = s;
        st->req.v = s;
    }
}

__global__ void busy(long long cycles) {            // the GPU's own work in the layer
    if (cycles <= 0) return;
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}

__global__ void wait_spin(const Stage * st, const uint32_t * seq, int * timed_out) {
    if (*timed_out) return;                                     // one give-up, not a second per layer after it
    const uint32_t s = *seq;
    for (long long i = 0; st->done.v != s; ++i) {
        if (i > (1ll << 24)) { *timed_out = 1; return; }     // about a second: the worker did not answer
        __nanosleep(64);
    }
    __threadfence_system();
}

__global__ void join(float * y, const Stage * st) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N_EMBD; i += gridDim.x * blockDim.x) y[i] += st->out[i];
}

__global__ void tiny(float * y) { if (threadIdx.x == 0 && blockIdx.x == 0) y[0] += 0.0f; }

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Worker {             // a persistent CPU worker: THREADS threads polling the request word
    Stage * st;
    int n;
    double cpu_us = 0;
    // requests below `from` are passed over (nothing waits for them); a request seen late, after the switch, is
    // still passed over by its number, so a thread can't answer the last unanswered run's request and put the
    // round count out of step
    std::atomic<uint32_t> from{UINT32_MAX};
    std::atomic<bool> stop{false};
    alignas(64) std::atomic<int> arrived{0};    // written each round: a line apart from what the pollers read
    std::atomic<double> first{0};       // when the round's first thread saw its request
    std::atomic<uint32_t> served{0};    // the last round answered (release: join_us is complete up to it)
    std::vector<double> join_us;        // per round: first sight of the request to the done word, beyond CPU_US
    alignas(64) std::vector<std::thread> threads;

    Worker(Stage * st, int n) : st(st), n(n) {
        for (int t = 0; t < n; ++t) threads.emplace_back([this, t] { run(t); });
    }
    ~Worker() {
        stop = true;
        for (auto & th : threads) th.join();
    }
    void run(int t) {
        uint32_t seen = st->req.v;
        while (!stop.load(std::memory_order_relaxed)) {
            const uint32_t r = st->req.v;
            if (r == seen) { _mm_pause(); continue; }
            seen = r;
            if (r < from.load(std::memory_order_acquire)) continue;
            std::atomic_thread_fence(std::memory_order_acquire);
            const double t0 = now_us();
            double none = 0;
            first.compare_exchange_strong(none, t0);
            const int lo = N_EMBD * t / n, hi = N_EMBD * (t + 1) / n;
            for (int i = lo; i < hi; ++i) st->out[i] = 0.5f * st->x[i];
            while (now_us() - t0 < cpu_us) _mm_pause();
            if (arrived.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
                join_us.push_back(now_us() - first.load() - cpu_us);
                first.store(0);
                arrived.store(0, std::memory_order_relaxed);
                served.store(r, std::memory_order_release);
                std::atomic_thread_fence(std::memory_order_release);
                st->done.v = r;
            }
        }
    }
};

enum class Wait { none, spin, value };

// the driver's stream memory operations, through the runtime's entry points (no link to libcuda)
typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*attribute_fn)(int *, CUdevice_attribute, CUdevice);
static wait_value_fn wait_value = nullptr;

template <typename F> static F entry(const char * name) {
    void * fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess
            || q != cudaDriverEntryPointSuccess) {
        return nullptr;
    }
    return (F) fn;
}

struct Bench {
    cudaStream_t s;
    Stage * st;             // host pointer
    Stage * dst;            // its device address
    uint32_t * seq;         // device memory: the layer counter
    int * timed_out;        // device memory: set by a wait that gave up
    float * x;
    float * y;
    CUdeviceptr done_dev;
    int layers, tokens;
    double clock_khz;

    void layer(Wait w, long long gpu_cycles, int extra, uint32_t value) {
        publish<<<1, 256, 0, s>>>(dst, seq, x);
        busy<<<1, 1, 0, s>>>(gpu_cycles);
        for (int e = 0; e < extra; ++e) tiny<<<1, 32, 0, s>>>(y);
        if (w == Wait::spin) wait_spin<<<1, 1, 0, s>>>(dst, seq, timed_out);
        if (w == Wait::value) {
            CUresult r = wait_value((CUstream) s, done_dev, value, CU_STREAM_WAIT_VALUE_EQ);
            if (r != CUDA_SUCCESS) { printf("cuStreamWaitValue32 failed: %d\n", (int) r); exit(1); }
        }
        join<<<8, 256, 0, s>>>(y, dst);
    }

    // us per layer over `tokens` tokens of `layers` layers, in the stream (graph: captured once per token, replayed)
    double run(Wait w, double gpu_us, int extra, bool graph) {
        const long long cycles = (long long) (gpu_us * clock_khz / 1e3);
        uint32_t s0 = 0;
        CK(cudaMemcpy(&s0, seq, 4, cudaMemcpyDeviceToHost));
        cudaGraphExec_t exec = nullptr;
        if (graph) {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int l = 0; l < layers; ++l) layer(w, cycles, extra, 0);
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&exec, g, 0));
            CK(cudaGraphDestroy(g));
        }
        auto token = [&](int i) {
            if (graph) { CK(cudaGraphLaunch(exec, s)); return; }
            for (int l = 0; l < layers; ++l) layer(w, cycles, extra, s0 + (uint32_t) (i * layers + l) + 1);
        };
        token(0);                                       // warm
        CK(cudaStreamSynchronize(s));
        s0 += layers;
        const double t0 = now_us();
        for (int i = 0; i < tokens; ++i) token(i);
        CK(cudaStreamSynchronize(s));
        const double us = (now_us() - t0) / (tokens * layers);
        if (exec) CK(cudaGraphExecDestroy(exec));
        int bad = 0;
        CK(cudaMemcpy(&bad, timed_out, 4, cudaMemcpyDeviceToHost));
        if (bad) { printf("a wait gave up: the worker did not answer\n"); exit(1); }
        return us;
    }
};

int main(int argc, char ** argv) {
    const std::vector<int> thread_counts = parse_counts(argc > 1 ? argv[1] : "15,6");
    if (thread_counts.empty()) { printf("bad thread count in %s\n", argv[1]); return 1; }
    Bench b{};
    b.layers = argc > 2 ? std::atoi(argv[2]) : 48;
    b.tokens = argc > 3 ? std::atoi(argv[3]) : 200;
    if (b.layers < 1 || b.tokens < 1) { printf("bad layers or tokens\n"); return 1; }
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    b.clock_khz = khz;
    CK(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
    {   // busy's cycles a microsecond at the SM clock it runs at, not the attribute's peak (a slower clock would
        // stretch GPU_US, hide that much of the hand-off behind it when GPU_US = CPU_US, and under-report it)
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        const long long cycles = (long long) khz * 20;     // 20 ms at the peak
        busy<<<1, 1, 0, b.s>>>(cycles);
        CK(cudaEventRecord(e0, b.s));
        busy<<<1, 1, 0, b.s>>>(cycles);
        CK(cudaEventRecord(e1, b.s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        b.clock_khz = cycles / ms;
        printf("SM clock: %.0f MHz (peak %d)\n", b.clock_khz / 1e3, khz / 1000);
    }
    CK(cudaHostAlloc((void **) &b.st, sizeof(Stage), cudaHostAllocMapped));
    memset((void *) b.st, 0, sizeof(Stage));
    CK(cudaHostGetDevicePointer((void **) &b.dst, b.st, 0));
    b.done_dev = (CUdeviceptr) &b.dst->done.v;
    CK(cudaMalloc(&b.seq, 4));
    CK(cudaMemset(b.seq, 0, 4));
    CK(cudaMalloc(&b.timed_out, 4));
    CK(cudaMemset(b.timed_out, 0, 4));
    CK(cudaMalloc(&b.x, N_EMBD * 4));
    CK(cudaMalloc(&b.y, N_EMBD * 4));
    CK(cudaMemset(b.x, 0, N_EMBD * 4));
    CK(cudaMemset(b.y, 0, N_EMBD * 4));
    int mem_ops = 0;
    wait_value = entry<wait_value_fn>("cuStreamWaitValue32");
    if (attribute_fn attr = entry<attribute_fn>("cuDeviceGetAttribute")) {
        attr(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0);
    }
    mem_ops = mem_ops && wait_value;
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d layers x %d tokens, stream memory operations: %s\n", p.name, b.layers, b.tokens,
           mem_ops ? "yes" : "no");

    // the launches alone: publish, busy(0), join; then each extra tiny kernel
    for (bool graph : {false, true}) {
        const double base = b.run(Wait::none, 0, 0, graph);
        printf("launches, %s: %.2f us a layer (publish, busy, join); each extra kernel:", graph ? "graph " : "stream",
               base);
        for (int extra : {1, 2, 4}) printf(" +%d: %+.2f", extra, (b.run(Wait::none, 0, extra, graph) - base) / extra);
        printf(" us\n");
    }
    const double gpu_us[] = {0, 50, 150};
    const double cpu_us[] = {0, 50, 150};
    for (int n : thread_counts) {
        Worker w(b.st, n);
        for (Wait wait : {Wait::spin, Wait::value}) {
            if (wait == Wait::value && !mem_ops) continue;
            for (bool graph : {false, true}) {
                if (graph && wait == Wait::value) continue;     // the value waited for changes every layer
                for (double g : gpu_us) {
                    for (double c : cpu_us) {
                        if (g > 0 && c > 0 && g != c) continue;
                        const double none = b.run(Wait::none, g, 0, graph);   // the launches and the GPU's work
                        w.cpu_us = c;
                        w.join_us.clear();
                        w.from = b.st->req.v + 1;                   // the stream is idle: req is the last request
                        const double us = b.run(wait, g, 0, graph);
                        w.from = UINT32_MAX;
                        while (w.served.load(std::memory_order_acquire) != b.st->req.v) _mm_pause();
                        // the warm token's rounds left out
                        std::vector<double> j(w.join_us.begin() + std::min(w.join_us.size(), (size_t) b.layers),
                                              w.join_us.end());
                        std::sort(j.begin(), j.end());
                        const double p50 = j.empty() ? 0 : j[j.size() / 2];
                        const double p99 = j.empty() ? 0 : j[j.size() * 99 / 100];
                        printf("%2d threads, %-5s wait, %s: GPU %3.0f us, CPU %3.0f us: %7.2f us a layer, "
                               "hand-off %6.2f us (CPU join p50 %.2f, p99 %.2f us)\n",
                               n, wait == Wait::spin ? "spin" : "value", graph ? "graph " : "stream", g, c, us,
                               us - none - std::max(0.0, c - g), p50, p99);
                    }
                }
            }
        }
    }
    return 0;
}
