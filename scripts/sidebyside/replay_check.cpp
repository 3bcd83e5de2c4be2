// replay_check: does llama.cpp b11549's routing-replay hook (patches/0002, LLAMA_MOE_REPLAY) route as told?
//
//   replay_check MODEL.gguf LOGITS_OUT [--table TABLE_OUT] [--ref REF_LOGITS] [--prompt N] [--gen N]
//
// On the CPU: decodes a fixed pseudo-random prompt of N tokens (one batch) and then N single tokens (fixed tokens,
// no sampling), with logits for every token, and writes the logits (float32) to LOGITS_OUT. --table: also writes
// the router's own picks of every MoE layer (captured from the graph's ffn_moe_topk tensors) as a replay table
// (rows = positions), plus TABLE_OUT.shifted: the same picks with every id moved to the next expert. --ref: prints
// the largest |logit difference| against an earlier run's LOGITS_OUT. check.sh runs it three times.

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

struct capture {
    int64_t                               pos0 = 0;  // position of the ubatch's first token (batches are in order)
    int64_t                               k    = 0;
    std::map<int, std::map<int64_t, std::vector<int32_t>>> ids; // layer -> position -> k ids
};

static bool capture_cb(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * cap = (capture *) user_data;
    const char * name = ggml_get_name(t);
    const bool topk = strncmp(name, "ffn_moe_topk-", 13) == 0;
    if (ask) {
        return topk;
    }
    if (!topk) {
        return true;
    }
    if (t->buffer == nullptr || !ggml_backend_buffer_is_host(t->buffer) || t->type != GGML_TYPE_I32) {
        fprintf(stderr, "replay_check: %s is not an I32 tensor in host memory\n", name);
        exit(1);
    }
    const int il = atoi(name + 13);
    cap->k = t->ne[0];
    for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
        std::vector<int32_t> row(t->ne[0]);
        for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
            row[i0] = *(const int32_t *) ((const char *) t->data + i1*t->nb[1] + i0*t->nb[0]);
        }
        cap->ids[il][cap->pos0 + i1] = row;
    }
    return true;
}

static void write_table(const std::string & path, const capture & cap, int64_t n_rows, int32_t n_expert, int shift) {
    const int32_t n_layer = cap.ids.empty() ? 1 : cap.ids.rbegin()->first + 1;
    const int32_t hdr[4] = { 0x3150524d, (int32_t) n_rows, n_layer, (int32_t) cap.k }; // "MRP1"
    std::vector<int32_t> ids((size_t) n_rows*n_layer*cap.k, 0);
    for (const auto & [il, rows] : cap.ids) {
        for (const auto & [pos, row] : rows) {
            for (int64_t j = 0; j < cap.k; ++j) {
                ids[(pos*n_layer + il)*cap.k + j] = (row[j] + shift) % n_expert;
            }
        }
    }
    FILE * f = fopen(path.c_str(), "wb");
    if (!f || fwrite(hdr, sizeof(hdr), 1, f) != 1 || fwrite(ids.data(), sizeof(int32_t), ids.size(), f) != ids.size()) {
        fprintf(stderr, "replay_check: cannot write %s\n", path.c_str());
        exit(1);
    }
    fclose(f);
}

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf LOGITS_OUT [--table TABLE_OUT] [--ref REF_LOGITS] [--prompt N] [--gen N]\n", argv[0]);
        return 2;
    }
    const std::string model_path = argv[1];
    const std::string logits_path = argv[2];
    std::string table_path, ref_path;
    int n_prompt = 24, n_gen = 8;
    for (int i = 3; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--table") { table_path = argv[i + 1]; }
        else if (a == "--ref") { ref_path = argv[i + 1]; }
        else if (a == "--prompt") { n_prompt = atoi(argv[i + 1]); }
        else if (a == "--gen") { n_gen = atoi(argv[i + 1]); }
        else { fprintf(stderr, "replay_check: unknown option %s\n", a.c_str()); return 2; }
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    ggml_backend_dev_t no_devices[1] = { nullptr };      // the CPU only: the capture reads tensors in place
    llama_model_params mparams = llama_model_default_params();
    mparams.devices      = no_devices;
    mparams.n_gpu_layers = 0;
    mparams.use_extra_bufts = false;                     // plain weights: no repacking, which routing does not need
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mparams);
    if (!model) {
        fprintf(stderr, "replay_check: cannot load %s\n", model_path.c_str());
        return 2;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    char buf[64] = {};
    char arch[64] = {};
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
    llama_model_meta_val_str(model, (std::string(arch) + ".expert_count").c_str(), buf, sizeof(buf));
    const int32_t n_expert = atoi(buf);

    capture cap;
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = n_prompt + n_gen + 16;
    cparams.n_batch         = n_prompt;
    cparams.n_ubatch        = n_prompt;
    cparams.n_threads       = 2;
    cparams.n_threads_batch = 2;
    if (!table_path.empty()) {
        cparams.cb_eval           = capture_cb;
        cparams.cb_eval_user_data = &cap;
    }
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        fprintf(stderr, "replay_check: cannot create a context\n");
        return 2;
    }

    uint64_t state = 12345;                             // fixed tokens: the same in every run
    auto next_token = [&]() {
        state = state*6364136223846793005ULL + 1442695040888963407ULL;
        return (llama_token) ((state >> 33) % (uint64_t) (n_vocab - 16));
    };
    std::vector<float> logits;
    llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    int64_t pos = 0;
    for (int step = 0; step <= n_gen; ++step) {
        const int n = step == 0 ? n_prompt : 1;
        batch.n_tokens = n;
        for (int i = 0; i < n; ++i) {
            batch.token[i]     = next_token();
            batch.pos[i]       = (llama_pos) (pos + i);
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i]    = 1;                      // every token an output: no layer is narrowed
        }
        cap.pos0 = pos;
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "replay_check: llama_decode failed\n");
            return 1;
        }
        for (int i = 0; i < n; ++i) {
            const float * l = llama_get_logits_ith(ctx, i);
            logits.insert(logits.end(), l, l + n_vocab);
        }
        pos += n;
    }
    llama_batch_free(batch);

    FILE * f = fopen(logits_path.c_str(), "wb");
    if (!f || fwrite(logits.data(), sizeof(float), logits.size(), f) != logits.size()) {
        fprintf(stderr, "replay_check: cannot write %s\n", logits_path.c_str());
        return 1;
    }
    fclose(f);
    printf("%s: logits of %lld tokens\n", logits_path.c_str(), (long long) pos);

    if (!table_path.empty()) {
        if (cap.ids.empty()) {
            fprintf(stderr, "replay_check: no ffn_moe_topk tensor seen: not a MoE model?\n");
            return 1;
        }
        write_table(table_path, cap, pos, n_expert, 0);
        write_table(table_path + ".shifted", cap, pos, n_expert, 1);
        printf("%s: the router's picks, %lld rows x %d MoE layers x %lld ids (and %s.shifted)\n", table_path.c_str(),
               (long long) pos, (int) cap.ids.size(), (long long) cap.k, table_path.c_str());
    }
    if (!ref_path.empty()) {
        std::vector<float> ref(logits.size());
        FILE * r = fopen(ref_path.c_str(), "rb");
        if (!r || fread(ref.data(), sizeof(float), ref.size(), r) != ref.size()) {
            fprintf(stderr, "replay_check: cannot read %s\n", ref_path.c_str());
            return 1;
        }
        fclose(r);
        double max_diff = 0.0;
        for (size_t i = 0; i < ref.size(); ++i) {
            max_diff = std::max(max_diff, (double) std::fabs(ref[i] - logits[i]));
        }
        printf("max |logit difference| against %s: %g\n", ref_path.c_str(), max_diff);
    }

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
