// GGML_OP_MOE_FETCH, _COPY, _PUBLISH and _TAKE (moeslots patch 0008), the way llama.cpp's test-backend-ops tests an
// op: a tier stepped on the chosen backend (the rule, then with a CPU share the publish, then the copies, as a
// layer's graph orders them) against a reference written here from the ops' contracts (ggml.h), step after step.
//
// Every shape runs twice: every miss copied, and with a CPU share (cpu_ratio > 0: only the best-scored u of m misses
// copied, u the fewest of those that minimise max(u, (m - u)*ratio), found here by trying every u), each stepped
// batch then publishing into a stage in host memory (the picks, the host plane, the layer's input, the done word
// set to the request word written before the step), and a take node on the CPU giving the two planes back. A last
// check: a take whose done word does not match waits until it does.
//
// Each case: E experts, k picks per token, a pack of S entries whose last D are the tier (some tier slots start
// free), three expert tensors (gate, up, down shapes; F32, or I8 rows of an odd length so the copy's byte path
// runs), the host experts in memory the backend reads (the device's host buffer type: pinned memory for CUDA).
// T steps, each a batch of n tokens (k*n <= D: it steps; every fifth step is read-only, some with n*k > D, half of
// those counted as a decode batch's), picks
// distinct per row with a few out-of-range ids. After every step the result planes must equal the reference's; at the
// end the map, the state (scores bit for bit, residents, in-tier flags, counts, the last step's copies) and every
// pack entry's bytes.
//
// Build against an installed engine (tests/engine/test_moe_fetch_op.py, scripts/h200/fetch-op.sh):
//   g++ -O2 -std=c++17 moe_fetch_op.cpp -I<include> -L<lib> -lggml -lggml-base -lggml-cpu -Wl,-rpath,<lib>
// Run: moe_fetch_op [--backend CPU|CUDA0] [--steps T]
// Prints one line per case and a summary; exit status 1 when a case fails.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include "op_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

// how many of m misses to copy: every u from 0 to min(room, m) tried, the fewest of the least max(u, (m - u)*ratio)
int32_t ref_copies(int32_t m, double ratio, int32_t room) {
    int32_t best = 0;
    double  best_cost = (double) m * ratio;
    for (int32_t u = 1; u <= std::min(room, m); ++u) {
        const double cost = std::max((double) u, (double) (m - u) * ratio);
        if (cost < best_cost) {
            best      = u;
            best_cost = cost;
        }
    }
    return best;
}

struct ref_tier {
    int64_t E, D;
    double decay;
    double ratio = 0.0;             // the CPU share's cost ratio (0: every miss copied)
    std::vector<int32_t> map;       // expert -> entry
    std::vector<double>  score;
    std::vector<int32_t> resident, entry, in_tier;
    uint64_t counts[8] = { 0 };
    std::vector<int32_t> copies;
    std::vector<std::vector<uint8_t>> pack;  // per tensor: n_entries * slab
    std::vector<const uint8_t *> host;        // per tensor
    std::vector<size_t> slab;

    // one batch: the contract, written plainly (victims chosen one by one, as the host tier does)
    void step(const std::vector<int32_t> & ids, int64_t k, int64_t n) {
        std::vector<int32_t> picked(E, 0);
        for (int64_t r = 0; r < n; ++r) {
            for (double & s : score) {
                s *= decay;
            }
            for (int64_t j = 0; j < k; ++j) {
                const int32_t e = ids[r*k + j];
                if (e < 0 || e >= E) {
                    continue;
                }
                if (map[e] >= 0) {
                    counts[in_tier[e] ? 2 : 1]++;
                }
                score[e] += 1.0;
                picked[e] = 1;
            }
        }
        std::vector<int32_t> miss;
        for (int32_t e = 0; e < E; ++e) {
            if (picked[e] && map[e] < 0) {
                miss.push_back(e);
            }
        }
        std::stable_sort(miss.begin(), miss.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
        copies.assign(1 + 2*D, 0);
        int32_t placed = 0;
        const int32_t n_copy = ratio > 0.0 ? ref_copies((int32_t) miss.size(), ratio, (int32_t) D) : (int32_t) miss.size();
        for (int32_t e : miss) {
            if (placed == n_copy) {
                break;
            }
            int32_t v = -1;
            for (int32_t j = 0; j < D; ++j) {
                const int32_t r = resident[j];
                if (r >= 0 && picked[r]) {
                    continue;
                }
                if (r < 0) {
                    v = j;
                    break;
                }
                const int32_t w = v < 0 ? -1 : resident[v];
                if (v < 0 || score[r] < score[w] || (score[r] == score[w] && r < w)) {
                    v = j;
                }
            }
            if (v < 0) {
                break;
            }
            const int32_t old = resident[v];
            if (old >= 0) {
                map[old] = -1;
                in_tier[old] = 0;
            }
            map[e] = entry[v];
            in_tier[e] = 1;
            resident[v] = e;
            for (size_t t = 0; t < pack.size(); ++t) {
                memcpy(pack[t].data() + entry[v]*slab[t], host[t] + e*slab[t], slab[t]);
                counts[4] += slab[t];
            }
            copies[1 + 2*placed] = e;
            copies[2 + 2*placed] = entry[v];
            placed++;
        }
        copies[0] = placed;
        counts[0] += (uint64_t) n;
        counts[3] += (uint64_t) placed;
        counts[5] += (uint64_t) (miss.size() - placed);
    }

    // a decode batch that only reads the tier: its hits, its distinct misses, its tokens
    void count(const std::vector<int32_t> & ids, int64_t n) {
        std::vector<int32_t> missed(E, 0);
        for (int32_t e : ids) {
            if (e < 0 || e >= E) {
                continue;
            }
            if (map[e] >= 0) {
                counts[in_tier[e] ? 2 : 1]++;
            } else {
                missed[e] = 1;
            }
        }
        for (int32_t m : missed) {
            counts[5] += (uint64_t) m;
        }
        counts[0] += (uint64_t) n;
    }

    void planes(const std::vector<int32_t> & ids, std::vector<int32_t> & out) const {
        const size_t m = ids.size();
        out.assign(2*m, -1);
        for (size_t i = 0; i < m; ++i) {
            const int32_t e = ids[i];
            if (e >= 0 && e < E) {
                out[i]     = map[e];
                out[m + i] = map[e] < 0 ? e : -1;
            }
        }
    }
};

struct shape {
    int64_t E, k, S, D;
    ggml_type type;
    int64_t ne0, ne1; // one expert tensor's rows
    int     max_n;
};

template <typename T>
bool same(const char * what, const T * a, const T * b, size_t n, std::string & why) {
    if (memcmp(a, b, n*sizeof(T)) != 0) {
        why = what;
        return false;
    }
    return true;
}

// a take node over stage_ids on the CPU backend, then a node that reads it: the two planes of n rows (and in after,
// the node after the take: the planes plus one; both stay 0 where the graph did not run them)
std::vector<int32_t> run_take(ggml_backend_t cpu, ggml_tensor * stage_ids, int64_t k, int64_t n, int64_t n_rows,
        int timeout_ms = 60000, ggml_status * status = nullptr, std::vector<int32_t> * after = nullptr) {
    ggml_init_params gp = { 8*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * gctx = ggml_init(gp);
    ggml_tensor * take = ggml_moe_fetch_take(gctx, stage_ids, (int) k, (int) n, (int) n_rows, timeout_ms);
    ggml_set_output(take);
    ggml_tensor * next = ggml_add(gctx, ggml_cast(gctx, take, GGML_TYPE_F32), ggml_arange(gctx, 1.0f, 2.0f, 1.0f));
    ggml_set_output(next);
    ggml_cgraph * gf = ggml_new_graph(gctx);
    ggml_build_forward_expand(gf, next);
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(cpu));
    ggml_gallocr_alloc_graph(galloc, gf);
    std::vector<int32_t> zero(2*k*n, 0);
    std::vector<float>   zero_f(2*k*n, 0.0f);
    ggml_backend_tensor_set(take, zero.data(), 0, zero.size()*sizeof(int32_t));
    ggml_backend_tensor_set(next, zero_f.data(), 0, zero_f.size()*sizeof(float));
    std::vector<int32_t> got(2*k*n, 0);
    const ggml_status st = ggml_backend_graph_compute(cpu, gf);
    if (status) {
        *status = st;
    }
    ggml_backend_tensor_get(take, got.data(), 0, got.size()*sizeof(int32_t));
    if (after) {
        ggml_backend_tensor_get(next, zero_f.data(), 0, zero_f.size()*sizeof(float));
        after->assign(zero_f.begin(), zero_f.end());
    }
    ggml_gallocr_free(galloc);
    ggml_free(gctx);
    return got;
}

// a stage of n_rows rows in host_buft: the buffer, the words and ids as the take's I32 tensor, the input's F32 one
struct stage_mem {
    ggml_context *        ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ggml_tensor *         ids = nullptr;
    ggml_tensor *         cur = nullptr;
    char *                base = nullptr;

    bool init(ggml_backend_buffer_type_t buft, int64_t k, int64_t n_rows, int64_t n_embd) {
        const size_t size   = ggml_moe_fetch_stage_offset(k, n_rows, n_embd, GGML_MOE_FETCH_STAGE_SIZE);
        const size_t at_cur = ggml_moe_fetch_stage_offset(k, n_rows, n_embd, GGML_MOE_FETCH_STAGE_CUR);
        buf = ggml_backend_buft_alloc_buffer(buft, size);
        if (!buf || !ggml_backend_buffer_is_host(buf)) {
            return false;
        }
        ggml_init_params ip = { 2*ggml_tensor_overhead(), nullptr, true };
        ctx  = ggml_init(ip);
        ids  = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, (int64_t) (at_cur/sizeof(int32_t)));
        cur  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd, n_rows);
        base = (char *) ggml_backend_buffer_get_base(buf);
        memset(base, 0, size);
        return ggml_backend_tensor_alloc(buf, ids, base) == GGML_STATUS_SUCCESS &&
               ggml_backend_tensor_alloc(buf, cur, base + at_cur) == GGML_STATUS_SUCCESS;
    }
    volatile uint32_t * words() const { return (volatile uint32_t *) base; }
    // a one-row stage (k = 2, n_embd = 4, as the take cases below make it) holding the picks { 5, 9 } and the host
    // plane { -1, 9 }, its request word and a done word
    bool init_one_row(uint32_t request, uint32_t done) {
        if (!init(ggml_backend_cpu_buffer_type(), 2, 1, 4)) {
            return false;
        }
        const int32_t v[4] = { 5, 9, -1, 9 };
        memcpy(base + ggml_moe_fetch_stage_offset(2, 1, 4, GGML_MOE_FETCH_STAGE_IDS), v, sizeof(v));
        words()[0] = request;
        words()[1] = done;
        return true;
    }
    ~stage_mem() {
        if (buf) ggml_backend_buffer_free(buf);
        if (ctx) ggml_free(ctx);
    }
};

bool run_case(ggml_backend_t backend, ggml_backend_t cpu, ggml_backend_buffer_type_t host_buft, const shape & sh,
              int steps, uint32_t seed, float ratio, std::string & why) {
    std::mt19937 rng(seed);
    const int64_t E = sh.E, k = sh.k, S = sh.S, D = sh.D;
    const int n_t = 3;
    const double decay = 0.95;
    const int64_t n_embd = 24, n_rows = sh.max_n;
    stage_mem stage;
    if (ratio > 0.0f && !stage.init(host_buft, k, n_rows, n_embd)) {
        why = "no stage";
        return false;
    }

    // host experts, in host_buft
    ggml_init_params hp = { (size_t) n_t*ggml_tensor_overhead(), nullptr, true };
    ggml_context * hctx = ggml_init(hp);
    ggml_tensor * host_t[n_t];
    for (int t = 0; t < n_t; ++t) {
        host_t[t] = ggml_new_tensor_3d(hctx, sh.type, sh.ne0, sh.ne1 + t, E);
    }
    ggml_backend_buffer_t hbuf = ggml_backend_alloc_ctx_tensors_from_buft(hctx, host_buft);
    if (!hbuf || !ggml_backend_buffer_is_host(hbuf)) {
        why = "no host buffer";
        return false;
    }
    for (int t = 0; t < n_t; ++t) {
        uint8_t * p = (uint8_t *) host_t[t]->data;
        for (size_t i = 0; i < ggml_nbytes(host_t[t]); ++i) {
            p[i] = (uint8_t) rng();
        }
    }

    // the backend's pack, map and state
    const size_t state_size = ggml_moe_fetch_state_offset(E, D, GGML_MOE_FETCH_SIZE);
    ggml_init_params dp = { (size_t) (n_t + 2)*ggml_tensor_overhead(), nullptr, true };
    ggml_context * dctx = ggml_init(dp);
    ggml_tensor * pack_t[n_t];
    for (int t = 0; t < n_t; ++t) {
        pack_t[t] = ggml_new_tensor_3d(dctx, sh.type, sh.ne0, sh.ne1 + t, S);
    }
    ggml_tensor * map_t   = ggml_new_tensor_1d(dctx, GGML_TYPE_I32, E);
    ggml_tensor * state_t = ggml_new_tensor_1d(dctx, GGML_TYPE_I8, (int64_t) state_size);
    ggml_backend_buffer_t dbuf = ggml_backend_alloc_ctx_tensors(dctx, backend);

    // the plan: S experts at random, the last D pack entries the tier, a few of its slots free
    ref_tier ref;
    ref.E = E; ref.D = D; ref.decay = decay; ref.ratio = (double) ratio;
    std::vector<int32_t> perm(E);
    for (int32_t e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    ref.map.assign(E, -1);
    ref.score.assign(E, 0.0);
    ref.in_tier.assign(E, 0);
    for (int64_t j = 0; j < S; ++j) {
        const bool tier = j >= S - D;
        const bool free_slot = tier && rng() % 5 == 0;
        if (!free_slot) {
            ref.map[perm[j]] = (int32_t) j;
        }
        if (tier) {
            ref.resident.push_back(free_slot ? -1 : perm[j]);
            ref.entry.push_back((int32_t) j);
            if (!free_slot) ref.in_tier[perm[j]] = 1;
        }
    }
    for (int t = 0; t < n_t; ++t) {
        const size_t slab = host_t[t]->nb[2];
        ref.slab.push_back(slab);
        ref.host.push_back((const uint8_t *) host_t[t]->data);
        std::vector<uint8_t> img(S*slab);
        for (int64_t j = 0; j < S; ++j) {
            int32_t e = -1;
            for (int32_t x = 0; x < E; ++x) if (ref.map[x] == j) e = x;
            if (e >= 0) memcpy(img.data() + j*slab, ref.host[t] + e*slab, slab);
            else memset(img.data() + j*slab, 0xab, slab);
        }
        ref.pack.push_back(img);
        ggml_backend_tensor_set(pack_t[t], img.data(), 0, img.size());
    }
    ggml_backend_tensor_set(map_t, ref.map.data(), 0, E*sizeof(int32_t));
    std::vector<uint8_t> st(state_size, 0);
    auto at = [&](ggml_moe_fetch_part p) { return st.data() + ggml_moe_fetch_state_offset(E, D, p); };
    memcpy(at(GGML_MOE_FETCH_RESIDENT), ref.resident.data(), D*sizeof(int32_t));
    memcpy(at(GGML_MOE_FETCH_ENTRY), ref.entry.data(), D*sizeof(int32_t));
    memcpy(at(GGML_MOE_FETCH_IN_TIER), ref.in_tier.data(), E*sizeof(int32_t));
    ggml_backend_tensor_set(state_t, st.data(), 0, state_size);

    bool ok = true;
    std::vector<int32_t> last_copies(1 + 2*D, 0);
    for (int s = 0; s < steps && ok; ++s) {
        const bool read_only = s % 5 == 4;
        const bool counted   = read_only && s % 10 == 9;   // a decode batch (counted), else a prompt's
        int n = 1 + (int) (rng() % sh.max_n);
        if (!read_only) {
            n = std::max(1, std::min<int>(n, (int) (D / k)));
        }
        std::vector<int32_t> ids(k*n);
        for (int r = 0; r < n; ++r) {
            // skewed picks (every seventh expert favoured), distinct in the row: hits, misses and ties all occur
            std::vector<int32_t> row(E);
            std::vector<double> key(E);
            for (int32_t e = 0; e < E; ++e) {
                row[e] = e;
                key[e] = (double) (rng() % 1000) * (1 + e % 7);
            }
            std::partial_sort(row.begin(), row.begin() + k, row.end(), [&](int32_t a, int32_t b) {
                return key[a] < key[b] || (key[a] == key[b] && a < b);
            });
            for (int j = 0; j < k; ++j) {
                ids[r*k + j] = rng() % 97 == 0 ? (rng() % 2 ? -1 : (int32_t) E + 3) : row[j];
            }
        }
        ggml_init_params gp = { 16*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
        ggml_context * gctx = ggml_init(gp);
        ggml_tensor * ids_t = ggml_new_tensor_2d(gctx, GGML_TYPE_I32, k, n);
        ggml_set_input(ids_t);
        // a stepped batch of a tier with a CPU share publishes (the layer's input: random floats)
        const bool publish = ratio > 0.0f && !read_only;
        ggml_tensor * cur_t = nullptr;
        std::vector<float> cur(n_embd*n);
        if (publish) {
            cur_t = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, n_embd, n);
            ggml_set_input(cur_t);
            for (float & x : cur) {
                x = (float) (rng() % 20001) / 1000.0f - 10.0f;
            }
        }
        // the rule, then (a stepped batch) the publish node before the copies, as a layer's graph orders them
        const ggml_moe_fetch_mode mode = !read_only ? GGML_MOE_FETCH_MODE_STEP :
                                         counted ? GGML_MOE_FETCH_MODE_COUNT : GGML_MOE_FETCH_MODE_READ;
        ggml_tensor * fetch_t = ggml_moe_fetch(gctx, ids_t, map_t, state_t, (int) D, decay, mode,
                                               read_only ? 0.0f : ratio);
        ggml_cgraph * gf = ggml_new_graph(gctx);
        if (publish) {
            ggml_build_forward_expand(gf, ggml_moe_fetch_publish(gctx, fetch_t, cur_t, stage.ids, stage.cur));
        }
        ggml_tensor * out_t = read_only ? fetch_t :
            ggml_moe_fetch_copy(gctx, fetch_t, state_t, pack_t, host_t, n_t, (int) D);
        ggml_set_output(out_t);
        ggml_build_forward_expand(gf, out_t);
        ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
        ggml_gallocr_alloc_graph(galloc, gf);
        ggml_backend_tensor_set(ids_t, ids.data(), 0, ids.size()*sizeof(int32_t));
        const uint32_t request = 1000 + (uint32_t) s;
        if (publish) {
            ggml_backend_tensor_set(cur_t, cur.data(), 0, cur.size()*sizeof(float));
            stage.words()[0] = request;
        }
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            why = "compute failed";
            ok = false;
        }
        std::vector<int32_t> got(2*k*n), want;
        ggml_backend_tensor_get(out_t, got.data(), 0, got.size()*sizeof(int32_t));
        if (!read_only) {
            ref.step(ids, k, n);
            last_copies = ref.copies;
        } else if (counted) {
            ref.count(ids, n);
        }
        ref.planes(ids, want);
        if (ok && got != want) {
            why = "result planes differ at step " + std::to_string(s);
            ok = false;
        }
        if (ok && publish) {
            // the stage: the done word, the picks and host plane in their rows, the input; then the take's planes
            const int32_t * s_ids = (const int32_t *) (stage.base + ggml_moe_fetch_stage_offset(k, n_rows, n_embd, GGML_MOE_FETCH_STAGE_IDS));
            const float   * s_cur = (const float *) (stage.base + ggml_moe_fetch_stage_offset(k, n_rows, n_embd, GGML_MOE_FETCH_STAGE_CUR));
            if (stage.words()[1] != request) {
                why = "the done word was not set at step " + std::to_string(s);
                ok = false;
            } else if (memcmp(s_ids, ids.data(), k*n*sizeof(int32_t)) != 0 ||
                       memcmp(s_ids + k*n_rows, want.data() + k*n, k*n*sizeof(int32_t)) != 0) {
                why = "the staged ids differ at step " + std::to_string(s);
                ok = false;
            } else if (memcmp(s_cur, cur.data(), cur.size()*sizeof(float)) != 0) {
                why = "the staged input differs at step " + std::to_string(s);
                ok = false;
            } else {
                std::vector<int32_t> planes(want);
                std::copy(ids.begin(), ids.end(), planes.begin());
                if (run_take(cpu, stage.ids, k, n, n_rows) != planes) {
                    why = "the take's planes differ at step " + std::to_string(s);
                    ok = false;
                }
            }
        }
        ggml_gallocr_free(galloc);
        ggml_free(gctx);
    }
    if (ok) {
        std::vector<int32_t> map(E);
        ggml_backend_tensor_get(map_t, map.data(), 0, E*sizeof(int32_t));
        ggml_backend_tensor_get(state_t, st.data(), 0, state_size);
        ok = same("map", map.data(), ref.map.data(), E, why) &&
             same("scores", (const double *) at(GGML_MOE_FETCH_SCORE), ref.score.data(), E, why) &&
             same("residents", (const int32_t *) at(GGML_MOE_FETCH_RESIDENT), ref.resident.data(), D, why) &&
             same("in-tier flags", (const int32_t *) at(GGML_MOE_FETCH_IN_TIER), ref.in_tier.data(), E, why) &&
             same("counts", (const uint64_t *) at(GGML_MOE_FETCH_COUNTS), ref.counts, 8, why) &&
             same("the last step's copies", (const int32_t *) at(GGML_MOE_FETCH_COPIES), last_copies.data(),
                  1 + 2*(size_t) ((const int32_t *) at(GGML_MOE_FETCH_COPIES))[0], why);
        for (int t = 0; ok && t < n_t; ++t) {
            std::vector<uint8_t> img(ref.pack[t].size());
            ggml_backend_tensor_get(pack_t[t], img.data(), 0, img.size());
            ok = same("pack bytes", img.data(), ref.pack[t].data(), img.size(), why);
        }
        if (ok && (ref.counts[3] == 0 || ref.counts[5] == 0)) {
            why = "no copy, or no counted miss, happened: the case tests too little";
            ok = false;
        }
        if (ok && ratio > 0.0f && ref.counts[5] <= ref.counts[3]/8) {
            why = "the CPU share left almost no miss to the host chain: the case tests too little";
            ok = false;
        }
    }
    ggml_backend_buffer_free(dbuf);
    ggml_free(dctx);
    ggml_backend_buffer_free(hbuf);
    ggml_free(hctx);
    return ok;
}

} // namespace

int main(int argc, char ** argv) {
    std::string name = "CPU";
    int steps = 200;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--backend" && i + 1 < argc) { name = argv[++i]; }
        else if (a == "--steps" && i + 1 < argc) { steps = atoi(argv[++i]); }
        else { fprintf(stderr, "usage: %s [--backend NAME] [--steps T]\n", argv[0]); return 2; }
    }
    op_backend ob;
    if (!op_backend_init(name, ob)) {
        return 2;
    }
    ggml_backend_t backend = ob.backend;
    ggml_backend_buffer_type_t host_buft = ob.host_buft;
    ggml_backend_t cpu = ob.is_cpu ? backend : ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    printf("backend %s, host experts in %s\n", ggml_backend_name(backend), ggml_backend_buft_name(host_buft));
    const shape shapes[] = {
        { 16,  4,  8,  4, GGML_TYPE_F32,  32,  4, 2 },  // a tiny model's layer: one token fills the tier
        { 16,  4, 12, 12, GGML_TYPE_F32,  32,  4, 4 },  // every slot a tier
        { 128, 8, 64, 32, GGML_TYPE_F32, 256, 12, 8 },  // 30B-A3B-like counts, verify batches of up to 4 stepping
        { 256, 8, 96, 64, GGML_TYPE_I8,   37,  5, 8 },  // 256 experts, odd slabs (the byte copy), batches of 8
        { 64,  6, 40, 40, GGML_TYPE_I8,   19,  3, 8 },
    };
    int n_pass = 0, n_fail = 0;
    uint32_t seed = 1;
    const float ratios[] = { 0.0f, 0.7f, 2.5f };
    for (const shape & sh : shapes) {
        for (int ri = 0; ri < 2; ++ri) {
            // each shape every miss copied, then with a CPU share (cheap and dear CPUs alternating)
            const float ratio = ri == 0 ? 0.0f : ratios[1 + (&sh - shapes) % 2];
            std::string why;
            const bool ok = run_case(backend, cpu, host_buft, sh, steps, seed++, ratio, why);
            printf("%s E=%lld k=%lld S=%lld D=%lld %s cpu_ratio %.1f%s%s\n", ok ? "ok  " : "FAIL", (long long) sh.E,
                   (long long) sh.k, (long long) sh.S, (long long) sh.D, ggml_type_name(sh.type), ratio, ok ? "" : ": ",
                   why.c_str());
            (ok ? n_pass : n_fail)++;
        }
    }
    {
        // a take waits for its done word: not done after 50 ms of a stale one, done once the word matches
        stage_mem stage;
        bool ok = stage.init_one_row(7, 6);
        std::atomic<bool> finished{false};
        std::vector<int32_t> got;
        if (ok) {
            std::thread th([&] { got = run_take(cpu, stage.ids, 2, 1, 1); finished = true; });
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const bool early = finished.load();
            stage.words()[1] = 7;
            th.join();
            ok = !early && got == std::vector<int32_t>({ 5, 9, -1, 9 });
        }
        printf("%s a take waits for its done word\n", ok ? "ok  " : "FAIL");
        (ok ? n_pass : n_fail)++;
    }
    {
        // a device that never answers: after its timeout the take fails the graph (no abort), its planes are -1,
        // the node after it does not run, and the stage's failed word names the request; the same stage answered
        // then gives a good graph again
        stage_mem stage;
        bool ok = stage.init_one_row(12, 11);
        std::string why;
        if (ok) {
            ggml_status st = GGML_STATUS_SUCCESS;
            std::vector<int32_t> after;
            const auto t0 = std::chrono::steady_clock::now();
            const std::vector<int32_t> got = run_take(cpu, stage.ids, 2, 1, 1, 30, &st, &after);
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (st != GGML_STATUS_FAILED) {
                why = "status " + std::to_string((int) st) + ", not GGML_STATUS_FAILED";
            } else if (got != std::vector<int32_t>({ -1, -1, -1, -1 })) {
                why = "the planes of a failed take are not -1";
            } else if (after != std::vector<int32_t>({ 0, 0, 0, 0 })) {
                why = "the node after a failed take ran";
            } else if (stage.words()[2] != 12) {
                why = "the failed word is " + std::to_string(stage.words()[2]) + ", not the request 12";
            } else if (ms < 30.0) {
                why = "it gave up before its timeout";
            }
            stage.words()[1] = 12;
            if (why.empty() && (run_take(cpu, stage.ids, 2, 1, 1, 30, &st, &after) != std::vector<int32_t>({ 5, 9, -1, 9 }) ||
                                st != GGML_STATUS_SUCCESS || after != std::vector<int32_t>({ 6, 10, 0, 10 }))) {
                why = "the answered stage did not give a good graph after the failed one";
            }
            ok = why.empty();
        }
        printf("%s a take that waits past its timeout fails its graph%s%s\n", ok ? "ok  " : "FAIL", ok ? "" : ": ",
               why.c_str());
        (ok ? n_pass : n_fail)++;
    }
    printf("%d passed, %d failed, 0 skipped\n", n_pass, n_fail);
    if (cpu != backend) {
        ggml_backend_free(cpu);
    }
    ggml_backend_free(backend);
    return n_fail ? 1 : 0;
}
