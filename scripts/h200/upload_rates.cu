// Upload rates from pinned host memory to the GPU, in the shapes a MoE layer's missed experts have: k chunks of one
// expert tensor each (gate, up, down slabs of a 30B-A3B-shaped Q4_K model: 884,736 bytes), per layer.
//   nvcc -O2 -arch=sm_90 -o /tmp/upload_rates scripts/h200/upload_rates.cu && /tmp/upload_rates
// Prints GB/s for: one cudaMemcpyAsync per chunk (no sync between layers, and with a host round trip per layer as a
// host-driven cache has), one copy of the whole layer's bytes (contiguous), and a gather kernel in which the GPU reads
// the chunks from host memory itself (mapped pinned memory, no host involvement), for several grid sizes.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

struct chunk { const int4 * src; int4 * dst; };

__global__ void gather(const chunk * chunks, int n_chunks, size_t n16) {
    // blockIdx.y: the chunk; blocks along x split its bytes
    const int c = blockIdx.y;
    if (c >= n_chunks) return;
    const int4 * __restrict__ s = chunks[c].src;
    int4 * __restrict__ d = chunks[c].dst;
    for (size_t i = (size_t) blockIdx.x*blockDim.x + threadIdx.x; i < n16; i += (size_t) gridDim.x*blockDim.x) {
        d[i] = s[i];
    }
}

__global__ void touch(int * flag, int v) { *flag = v; }

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
    const size_t C = 884736;              // one expert tensor
    const int    E = 64, L = 48, K = 12;  // host experts x tensors per layer, layers, chunks per layer (4 experts x 3)
    const size_t host_bytes = (size_t) L * E * 3 * C;
    char * h; CK(cudaMallocHost(&h, host_bytes));
    for (size_t i = 0; i < host_bytes; i += 4096) h[i] = (char) i;
    char * d; CK(cudaMalloc(&d, (size_t) L * K * C));
    int * dflag; CK(cudaMalloc(&dflag, 4));
    int * hflag; CK(cudaMallocHost(&hflag, 4));
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    srand(1);
    // per layer: K chunks at random experts of that layer
    std::vector<chunk> ch((size_t) L * K);
    for (int l = 0; l < L; ++l) for (int j = 0; j < K; ++j) {
        const int e = rand() % E, t = j % 3;
        ch[(size_t) l*K + j].src = (const int4 *) (h + (((size_t) l*E + e)*3 + t)*C);
        ch[(size_t) l*K + j].dst = (int4 *) (d + ((size_t) l*K + j)*C);
    }
    chunk * dch; CK(cudaMalloc(&dch, ch.size()*sizeof(chunk)));
    CK(cudaMemcpy(dch, ch.data(), ch.size()*sizeof(chunk), cudaMemcpyHostToDevice));
    const double bytes = (double) L * K * C;
    auto report = [&](const char * what, double t) {
        printf("%-58s %7.1f GB/s  %6.1f us/layer\n", what, bytes/t/1e9, t/L*1e6);
    };
    // layer l's chunks, one cudaMemcpyAsync each
    auto copy_chunks = [&](int l) {
        for (int j = 0; j < K; ++j)
            CK(cudaMemcpyAsync(ch[(size_t) l*K+j].dst, ch[(size_t) l*K+j].src, C, cudaMemcpyHostToDevice, st));
    };
    // what a host-driven cache waits for per layer: the GPU's work so far, then a few bytes (the ids) on the host
    auto round_trip = [&](int l) {
        touch<<<1, 1, 0, st>>>(dflag, l);
        CK(cudaMemcpyAsync(hflag, dflag, 4, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
    };
    for (int rep = 0; rep < 2; ++rep) {
        printf("-- repetition %d (48 layers x 12 chunks of %zu bytes = %.1f MB a token)\n", rep, C, bytes/1e6);
        double t0 = now_s();
        for (int l = 0; l < L; ++l) copy_chunks(l);
        CK(cudaStreamSynchronize(st));
        report("memcpyAsync per chunk, no sync between layers", now_s() - t0);

        t0 = now_s();
        for (int l = 0; l < L; ++l) {
            round_trip(l);
            copy_chunks(l);
        }
        CK(cudaStreamSynchronize(st));
        report("memcpyAsync per chunk, host round trip per layer", now_s() - t0);

        t0 = now_s();
        for (int l = 0; l < L; ++l) round_trip(l);
        double rt = (now_s() - t0) / L;
        printf("%-58s %7.1f us\n", "host round trip alone (kernel, 4-byte read, sync)", rt*1e6);

        t0 = now_s();
        for (int l = 0; l < L; ++l)
            CK(cudaMemcpyAsync(d + (size_t) l*K*C, h + (size_t) l*E*3*C, K*C, cudaMemcpyHostToDevice, st));
        CK(cudaStreamSynchronize(st));
        report("one contiguous copy per layer", now_s() - t0);

        for (int threads : { 256, 512, 1024 }) for (int bx : { 4, 8, 16, 32, 64 }) {
            t0 = now_s();
            for (int l = 0; l < L; ++l)
                gather<<<dim3(bx, K), threads, 0, st>>>(dch + (size_t) l*K, K, C/16);
            CK(cudaStreamSynchronize(st));
            char what[96];
            snprintf(what, sizeof what, "gather kernel per layer, grid %d x %d, %d threads", bx, K, threads);
            report(what, now_s() - t0);
        }
    }
    // correctness of the gather
    std::vector<char> back(C);
    CK(cudaMemcpy(back.data(), ch[5].dst, C, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (size_t i = 0; i < C; i += 4096) ok &= back[i] == ((const char *) ch[5].src)[i];
    printf("gather copies the bytes: %s\n", ok ? "yes" : "NO");
    return 0;
}
