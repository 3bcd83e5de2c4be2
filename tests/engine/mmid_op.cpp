// MUL_MAT_ID with negative expert ids, the way llama.cpp's test-backend-ops tests an op.
//
// moeslots' patch series gives ggml one rule: an expert id < 0 selects no expert. The (token, slot) row of such an id
// is written as exact zeros and no weights are read for it. Each case builds
//     dst = mul_mat_id(as, b, ids)                         (plain)
//     dst = swiglu_split(mul_mat_id(gate), mul_mat_id(up)) (fused: CUDA fuses these into one kernel for small batches)
// on the chosen backend and checks:
//   - every row with a negative id is +0.0 exactly (bit pattern zero);
//   - every other row matches a double-precision reference from the dequantized weights (NMSE below the type's bound,
//     the bounds test-backend-ops uses for mul_mat);
//   - on the CPU, every other row is bit-identical to the op run with the negative id of slot j replaced by spare expert
//     E-k+j, which no valid id uses (so every expert computes the same rows in the same order, as in a stock run, and
//     ids stay distinct per token, which the kernels assume); elsewhere the
//     difference to a run with all ids valid and distinct is checked against the same NMSE bound.
// Patterns: "valid" (no negative id: stock behaviour), "mixed" (random negatives, often several per row, and all-negative
// rows), "none" (every id negative). b has one row per token (ne11 = 1: gate/up) or one per slot (ne11 = k: down).
// --pack: the weights hold fewer experts than k (a layer's pack of S < k slots): each token's valid ids are distinct
// slots of the pack at random positions, the rest negative; only pattern "pack", checked against the reference (no
// spare experts to compare rows with).
//
// Build against an installed engine (see tests/engine/test_mmid_op.py and scripts/h200/mmid-op.sh):
//   g++ -O2 -std=c++17 mmid_op.cpp -I<site-packages>/include -L<site-packages>/llama_cpp/lib -lggml -lggml-base \
//       -lggml-cpu -Wl,-rpath,<site-packages>/llama_cpp/lib -o mmid_op
// Run: mmid_op [--backend CPU|CUDA0|...] [--types f32,f16,...] [--batches 1,2,...] [--cols K] [--rows M]
//              [--experts E] [--used k] [--threads N] [--repack] [--pack] [--ref-rows N]
// Prints one line per case and a summary; exit status 1 when a case fails.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct options {
    std::string backend = "CPU";
    std::vector<ggml_type> types;
    std::vector<int> batches = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 32, 33, 64, 128, 512 };
    int64_t cols    = 256; // K (ne00)
    int64_t rows    = 64;  // M (ne01)
    int64_t experts = 16;  // E (ne02)
    int64_t used    = 4;   // k
    int     threads = 2;
    bool    repack  = false;
    bool    pack    = false; // E < k allowed: ids are a pack's distinct slots, the rest negative
    int64_t ref_rows = -1; // compare only the first ref_rows rows of each output row with the reference (-1: all)
};

double max_nmse(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32:  return 1e-9;
        case GGML_TYPE_F16:  return 1e-6;
        default:             return 5e-4; // bf16 and the quantized types: activations are rounded to the vec_dot type
    }
}

struct result {
    std::vector<float> out;
    bool supported = true;
};

// run the op (fused or plain) on backend with weights in buft; ids [k, T], b [K, ne11, T]
result run_op(ggml_backend_t backend, ggml_backend_buffer_type_t buft_w, ggml_type type, const options & o,
        int64_t n_tokens, int64_t ne11, bool fused, const std::vector<uint8_t> & q_up, const std::vector<uint8_t> & q_gate,
        const std::vector<float> & b, const std::vector<int32_t> & ids) {
    result r;
    ggml_init_params ip = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx_w  = ggml_init(ip);
    ggml_context * ctx_io = ggml_init(ip);
    ggml_context * ctx_g  = ggml_init(ip);

    ggml_tensor * up   = ggml_new_tensor_3d(ctx_w, type, o.cols, o.rows, o.experts);
    ggml_tensor * gate = fused ? ggml_new_tensor_3d(ctx_w, type, o.cols, o.rows, o.experts) : nullptr;
    ggml_tensor * tb   = ggml_new_tensor_3d(ctx_io, GGML_TYPE_F32, o.cols, ne11, n_tokens);
    ggml_tensor * tids = ggml_new_tensor_2d(ctx_io, GGML_TYPE_I32, o.used, n_tokens);

    ggml_tensor * out = ggml_mul_mat_id(ctx_g, up, tb, tids);
    if (fused) {
        out = ggml_swiglu_split(ctx_g, ggml_mul_mat_id(ctx_g, gate, tb, tids), out);
    }
    ggml_cgraph * gf = ggml_new_graph(ctx_g);
    ggml_build_forward_expand(gf, out);
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        if (!ggml_backend_supports_op(backend, ggml_graph_node(gf, i))) {
            r.supported = false;
        }
    }

    ggml_backend_buffer_t buf_w  = ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, buft_w);
    ggml_backend_buffer_t buf_io = ggml_backend_alloc_ctx_tensors(ctx_io, backend);
    if (r.supported) {
        ggml_backend_tensor_set(up, q_up.data(), 0, ggml_nbytes(up));
        if (gate) {
            ggml_backend_tensor_set(gate, q_gate.data(), 0, ggml_nbytes(gate));
        }
        ggml_backend_tensor_set(tb, b.data(), 0, ggml_nbytes(tb));
        ggml_backend_tensor_set(tids, ids.data(), 0, ggml_nbytes(tids));

        ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
        ggml_gallocr_alloc_graph(galloc, gf);
        // garbage in the output first: a row the op does not write must not pass for zeros
        std::vector<float> junk(ggml_nelements(out), 1234.5f);
        ggml_backend_tensor_set(out, junk.data(), 0, ggml_nbytes(out));
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "graph compute failed\n");
            exit(2);
        }
        r.out.resize(ggml_nelements(out));
        ggml_backend_tensor_get(out, r.out.data(), 0, ggml_nbytes(out));
        ggml_gallocr_free(galloc);
    }
    ggml_backend_buffer_free(buf_w);
    ggml_backend_buffer_free(buf_io);
    ggml_free(ctx_w);
    ggml_free(ctx_io);
    ggml_free(ctx_g);
    return r;
}

std::vector<uint8_t> quantize(ggml_type type, const std::vector<float> & w, int64_t nrows, int64_t ncols) {
    std::vector<uint8_t> q(ggml_row_size(type, ncols)*nrows);
    ggml_quantize_chunk(type, w.data(), q.data(), 0, nrows, ncols, nullptr);
    return q;
}

// the weights as the backend sees them (quantized, then dequantized)
std::vector<float> dequantize(ggml_type type, const std::vector<uint8_t> & q, int64_t n) {
    std::vector<float> out(n);
    if (type == GGML_TYPE_F32) {
        memcpy(out.data(), q.data(), n*sizeof(float));
    } else {
        ggml_get_type_traits(type)->to_float(q.data(), out.data(), n);
    }
    return out;
}

ggml_type parse_type(const std::string & s) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * name = ggml_type_name((ggml_type) t);
        if (name && s == name) {
            return (ggml_type) t;
        }
    }
    fprintf(stderr, "unknown type %s\n", s.c_str());
    exit(2);
}

std::vector<std::string> split(const std::string & s) {
    std::vector<std::string> out;
    size_t p = 0;
    while (p <= s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) {
            q = s.size();
        }
        if (q > p) {
            out.push_back(s.substr(p, q - p));
        }
        p = q + 1;
    }
    return out;
}

} // namespace

int main(int argc, char ** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s needs a value\n", a.c_str());
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--backend") { o.backend = next(); }
        else if (a == "--types") { for (auto & t : split(next())) { o.types.push_back(parse_type(t)); } }
        else if (a == "--batches") { o.batches.clear(); for (auto & t : split(next())) { o.batches.push_back(atoi(t.c_str())); } }
        else if (a == "--cols") { o.cols = atoll(next().c_str()); }
        else if (a == "--rows") { o.rows = atoll(next().c_str()); }
        else if (a == "--experts") { o.experts = atoll(next().c_str()); }
        else if (a == "--used") { o.used = atoll(next().c_str()); }
        else if (a == "--threads") { o.threads = atoi(next().c_str()); }
        else if (a == "--repack") { o.repack = true; }
        else if (a == "--pack") { o.pack = true; }
        else if (a == "--ref-rows") { o.ref_rows = atoll(next().c_str()); }
        else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
    }
    if (!o.pack && o.experts < 2*o.used) {
        fprintf(stderr, "--experts must be at least twice --used (k spare experts), or --pack\n");
        return 2;
    }
    if (o.types.empty()) {
        o.types = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                    GGML_TYPE_Q6_K, GGML_TYPE_MXFP4 };
    }
    if (o.repack) {
        // CPU_REPACK serves MUL_MAT_ID for Q4_0 with AVX2 (and rows % 8 == 0): the only repacked type checked here
        if (!ggml_cpu_has_avx2() || o.rows % 8 != 0) {
            printf("repack: this CPU does not repack Q4_0; nothing to check\n0 passed, 0 failed, 0 skipped\n");
            return 0;
        }
        o.types = { GGML_TYPE_Q4_0 };
    }

    ggml_backend_t backend = ggml_backend_init_by_name(o.backend.c_str(), nullptr);
    if (backend == nullptr) {
        fprintf(stderr, "no backend named %s (devices:", o.backend.c_str());
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            fprintf(stderr, " %s", ggml_backend_dev_name(ggml_backend_dev_get(i)));
        }
        fprintf(stderr, ")\n");
        return 2;
    }
    const bool is_cpu = ggml_backend_dev_type(ggml_backend_get_device(backend)) == GGML_BACKEND_DEVICE_TYPE_CPU;
    if (is_cpu) {
        ggml_backend_cpu_set_n_threads(backend, o.threads);
    }
    ggml_backend_buffer_type_t buft_w = ggml_backend_get_default_buffer_type(backend);
    if (o.repack) {
        ggml_backend_dev_t dev = ggml_backend_get_device(backend);
        auto get_extra = (ggml_backend_dev_get_extra_bufts_t)
            ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
        buft_w = nullptr;
        for (ggml_backend_buffer_type_t * b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b) {
            if (std::string(ggml_backend_buft_name(*b)) == "CPU_REPACK") {
                buft_w = *b;
            }
        }
        if (buft_w == nullptr) {
            printf("repack: no CPU_REPACK buffer type in this build\n0 passed, 0 failed, 0 skipped\n");
            return 0;
        }
    }
    printf("backend %s, weights in %s, K=%lld M=%lld E=%lld k=%lld\n", ggml_backend_name(backend),
            ggml_backend_buft_name(buft_w), (long long) o.cols, (long long) o.rows, (long long) o.experts, (long long) o.used);

    std::mt19937 rng(42);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    int n_pass = 0, n_fail = 0, n_skip = 0;

    for (ggml_type type : o.types) {
        const int64_t n_w = o.cols*o.rows*o.experts;
        std::vector<float> w_up(n_w), w_gate(n_w);
        for (auto & x : w_up)   { x = uni(rng); }
        for (auto & x : w_gate) { x = uni(rng); }
        const std::vector<uint8_t> q_up   = quantize(type, w_up,   o.rows*o.experts, o.cols);
        const std::vector<uint8_t> q_gate = quantize(type, w_gate, o.rows*o.experts, o.cols);
        const std::vector<float>   r_up   = dequantize(type, q_up,   n_w);
        const std::vector<float>   r_gate = dequantize(type, q_gate, n_w);

        for (int n_tokens : o.batches) {
            // b with one row per token, then one per slot (the same thing when k = 1)
            const std::vector<int64_t> ne11s = o.used == 1 ? std::vector<int64_t>{ 1 } : std::vector<int64_t>{ 1, o.used };
            for (int64_t ne11 : ne11s) {
                for (const char * pattern : { "valid", "mixed", "none", "pack" }) {
                    if ((std::string(pattern) == "pack") != o.pack) {
                        continue;
                    }
                    for (bool fused : { false, true }) {
                        if (fused && ne11 != 1) {
                            continue; // gate/up read one row per token
                        }
                        std::vector<float> b(o.cols*ne11*n_tokens);
                        for (auto & x : b) { x = uni(rng); }
                        // k distinct experts per token from [0, E-k) (the last k are spares), then the pattern's negatives
                        std::vector<int32_t> ids(o.used*n_tokens), ids_valid(o.used*n_tokens), ids_spare(o.used*n_tokens);
                        for (int t = 0; t < n_tokens; ++t) {
                            if (o.pack) {
                                // up to min(E, k) distinct slots of the pack, at random positions among the k
                                std::vector<int32_t> slots(o.experts), pos(o.used);
                                for (int64_t e = 0; e < o.experts; ++e) { slots[e] = (int32_t) e; }
                                for (int64_t j = 0; j < o.used; ++j) { pos[j] = (int32_t) j; }
                                std::shuffle(slots.begin(), slots.end(), rng);
                                std::shuffle(pos.begin(), pos.end(), rng);
                                const int64_t n_valid = (int64_t) (rng() % (std::min(o.experts, o.used) + 1));
                                for (int64_t j = 0; j < o.used; ++j) {
                                    ids[t*o.used + j] = -1;
                                }
                                for (int64_t j = 0; j < n_valid; ++j) {
                                    ids[t*o.used + pos[j]] = slots[j];
                                }
                                continue;
                            }
                            std::vector<int32_t> perm(o.experts - o.used);
                            for (int64_t e = 0; e + o.used < o.experts; ++e) { perm[e] = (int32_t) e; }
                            std::shuffle(perm.begin(), perm.end(), rng);
                            const bool all_neg = std::string(pattern) == "none" ||
                                (std::string(pattern) == "mixed" && n_tokens > 1 && t % 5 == 1);
                            for (int64_t j = 0; j < o.used; ++j) {
                                ids_valid[t*o.used + j] = perm[j];
                                bool neg = all_neg || (std::string(pattern) == "mixed" && rng() % 2 == 0);
                                ids[t*o.used + j] = neg ? ((rng() % 4 == 0) ? -3 : -1) : perm[j];
                                ids_spare[t*o.used + j] = neg ? (int32_t) (o.experts - o.used + j) : perm[j];
                            }
                        }
                        const result r = run_op(backend, buft_w, type, o, n_tokens, ne11, fused, q_up, q_gate, b, ids);
                        char label[160];
                        snprintf(label, sizeof(label), "%-5s T=%-3d ne11=%lld %-5s %s", ggml_type_name(type), n_tokens,
                                (long long) ne11, pattern, fused ? "fused" : "plain");
                        if (!r.supported) {
                            printf("skip %s (the backend does not support this op)\n", label);
                            n_skip++;
                            continue;
                        }
                        const result rv = std::string(pattern) == "valid" || o.pack ? r :
                            run_op(backend, buft_w, type, o, n_tokens, ne11, fused, q_up, q_gate, b, is_cpu ? ids_spare : ids_valid);

                        // dst is [M, k, T]
                        bool zeros_ok = true, same_ok = true;
                        double err = 0.0, norm = 0.0, diff = 0.0, dnorm = 0.0;
                        for (int t = 0; t < n_tokens; ++t) {
                            for (int64_t j = 0; j < o.used; ++j) {
                                const int32_t e = ids[t*o.used + j];
                                const float * row  = r.out.data()  + (t*o.used + j)*o.rows;
                                const float * rowv = rv.out.data() + (t*o.used + j)*o.rows;
                                if (e < 0) {
                                    for (int64_t i = 0; i < o.rows; ++i) {
                                        uint32_t bits;
                                        memcpy(&bits, row + i, 4);
                                        zeros_ok = zeros_ok && bits == 0;
                                    }
                                    continue;
                                }
                                const float * x = b.data() + (t*ne11 + (ne11 == 1 ? 0 : j))*o.cols;
                                for (int64_t i = 0; i < o.rows; ++i) {
                                    diff  += ((double) row[i] - rowv[i])*((double) row[i] - rowv[i]);
                                    dnorm += (double) rowv[i]*rowv[i];
                                    if (memcmp(row + i, rowv + i, 4) != 0) {
                                        same_ok = false;
                                    }
                                    if (o.ref_rows >= 0 && i >= o.ref_rows) {
                                        continue;
                                    }
                                    double u = 0.0, g = 0.0;
                                    const float * wu = r_up.data()   + (e*o.rows + i)*o.cols;
                                    const float * wg = r_gate.data() + (e*o.rows + i)*o.cols;
                                    for (int64_t c = 0; c < o.cols; ++c) {
                                        u += (double) wu[c]*x[c];
                                        if (fused) {
                                            g += (double) wg[c]*x[c];
                                        }
                                    }
                                    const double ref = fused ? u*g/(1.0 + std::exp(-g)) : u;
                                    err  += (row[i] - ref)*(row[i] - ref);
                                    norm += ref*ref;
                                }
                            }
                        }
                        const double nmse  = norm  > 0 ? err/norm   : 0.0;
                        const double dnmse = dnorm > 0 ? diff/dnorm : 0.0;
                        // the CPU's own bounds; other backends the one test-backend-ops uses for mul_mat (their F32
                        // and F16 paths may round differently, e.g. through cuBLAS)
                        const double bound = is_cpu ? max_nmse(type) : 5e-4;
                        const bool ref_ok = nmse <= bound;
                        const bool rows_ok = is_cpu ? same_ok : dnmse <= bound;
                        const bool ok = zeros_ok && ref_ok && rows_ok;
                        printf("%s %s nmse=%.2e%s%s%s\n", ok ? "ok  " : "FAIL", label, nmse,
                                zeros_ok ? "" : " negative-id rows not zero", ref_ok ? "" : " (reference mismatch)",
                                rows_ok ? "" : (is_cpu ? " valid rows differ from the all-valid run" : " valid rows drift from the all-valid run"));
                        if (!is_cpu && std::string(pattern) != "valid") {
                            printf("     all-valid run: nmse %.2e%s\n", dnmse, same_ok ? " (bit-identical)" : "");
                        }
                        ok ? n_pass++ : n_fail++;
                    }
                }
            }
        }
    }
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    ggml_backend_free(backend);
    return n_fail > 0 ? 1 : 0;
}
