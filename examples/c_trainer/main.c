/* c_trainer: trains the train_mlp model (a stack of LayerNormMLP blocks, data x tensor
 * parallel, FP8 or BF16 GEMMs, on the examples' synthetic teacher task, teacher_c.h) through
 * qmesh's C API only, one MPI rank per process, on the CPU. With the same options it makes
 * the same library calls in the same order as train_mlp, so both end with bitwise the same
 * parameters (the "parameter checksums" lines agree). See --help and docs/c_api.md. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qmesh/c_api.h"
#include "teacher_c.h"

typedef struct options {
  int dp, tp, layers, steps, amax_history, sequence_parallel, regather_input, log_every;
  int checkpoint_every, resume, emulate;
  qmesh_overlap overlap;
  int64_t hidden, ffn, seq, batch;
  float lr, margin;
  const char* optimizer;
  const char* checkpoint_dir; /* NULL: no checkpoints */
  qmesh_recipe recipe;
  uint64_t seed;
} options;

static int rank_of_process = -1; /* -1 until the world exists */

/* Every failure ends here: the status, the library's message, exit status 1. The other ranks
 * fail in their next collective (comm timeout). */
static void check(qmesh_status status, const char* call) {
  if (status == QMESH_OK) return;
  char rank[32] = "";
  if (rank_of_process >= 0) snprintf(rank, sizeof rank, "rank %d: ", rank_of_process);
  fprintf(stderr, "c_trainer: %s%s failed (%s): %s\n", rank, call, qmesh_status_name(status),
          qmesh_last_error());
  fflush(stderr);
  exit(1);
}
#define CHECK(call) check((call), #call)

static void usage(FILE* out) {
  fprintf(out,
          "Usage: mpirun -np <ranks> c_trainer [options]\n"
          "Trains train_mlp's model through the qmesh C API (CPU backend); prints the same\n"
          "'parameter checksums' line as train_mlp for the same options.\n"
          "  --dp N              data-parallel size (default: ranks / tp)\n"
          "  --tp N              tensor-parallel size (1)\n"
          "  --layers N          LayerNormMLP blocks (2)\n"
          "  --hidden N          hidden size (256)\n"
          "  --ffn N             ffn size, divisible by tp (1024)\n"
          "  --seq N             tokens per sequence (64)\n"
          "  --batch N           sequences per dp rank and step (8)\n"
          "  --steps N           training steps (200)\n"
          "  --lr X              learning rate (3e-3)\n"
          "  --optimizer NAME    adamw or sgd (adamw)\n"
          "  --recipe NAME       fp32, bf16, delayed, current, block, mxfp8 or nvfp4 (delayed;\n"
          "                      mxfp8 and nvfp4 need --emulate)\n"
          "  --emulate           run the MXFP8 / NVFP4 GEMMs emulated (dequantized, then an fp32\n"
          "                      GEMM), as QMESH_BLOCK_EMULATION=1 does\n"
          "  --amax-history N    delayed scaling's amax history length (16)\n"
          "  --margin X          delayed scaling's margin (0)\n"
          "  --sequence-parallel shard activations on the token dimension over tp\n"
          "  --overlap NAME      collective-GEMM schedule with sp: none, ring or bidir (none)\n"
          "  --regather-input    fc1 gathers its input again in backward (needs sp)\n"
          "  --seed N            seed of the parameters and the data (1234)\n"
          "  --log-every N       print the loss every N steps (10)\n"
          "  --checkpoint-dir D  save checkpoints in D (train_mlp's format) at the end\n"
          "  --checkpoint-every N  and every N steps\n"
          "  --resume            continue from the latest checkpoint in --checkpoint-dir\n"
          "  --help              this text\n");
}

static int parse_recipe(const char* s, qmesh_recipe* recipe) {
  static const char* names[] = {"fp32", "bf16", "delayed", "current", "block", "mxfp8", "nvfp4"};
  for (int i = 0; i < 7; ++i)
    if (strcmp(s, names[i]) == 0) {
      *recipe = (qmesh_recipe)i;
      return 1;
    }
  return 0;
}

static int parse_overlap(const char* s, qmesh_overlap* overlap) {
  static const char* names[] = {"none", "ring", "bidir"};
  for (int i = 0; i < 3; ++i)
    if (strcmp(s, names[i]) == 0) {
      *overlap = (qmesh_overlap)i;
      return 1;
    }
  return 0;
}

/* Returns 0 to run, 1 after --help, 2 for bad options (message printed). */
static int parse_options(int argc, char** argv, options* o) {
  *o = (options){.dp = 0,
                 .tp = 1,
                 .layers = 2,
                 .steps = 200,
                 .amax_history = 16,
                 .log_every = 10,
                 .hidden = 256,
                 .ffn = 1024,
                 .seq = 64,
                 .batch = 8,
                 .lr = 3e-3f,
                 .optimizer = "adamw",
                 .recipe = QMESH_RECIPE_FP8_DELAYED,
                 .seed = 1234};
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (strcmp(a, "--help") == 0) {
      usage(stdout);
      return 1;
    }
    if (strcmp(a, "--sequence-parallel") == 0) {
      o->sequence_parallel = 1;
      continue;
    }
    if (strcmp(a, "--regather-input") == 0) {
      o->regather_input = 1;
      continue;
    }
    if (strcmp(a, "--resume") == 0) {
      o->resume = 1;
      continue;
    }
    if (strcmp(a, "--emulate") == 0) {
      o->emulate = 1;
      continue;
    }
    const int has_value = i + 1 < argc;
    const char* v = has_value ? argv[i + 1] : "";
    char* end = NULL;
    const long long n = strtoll(v, &end, 10);
    const int is_int = *v != '\0' && *end == '\0';
    const int is_count = is_int && n >= 1 && n <= INT32_MAX; /* sizes and counts */
    int ok = 1;
    if (strcmp(a, "--dp") == 0)
      ok = is_count, o->dp = (int)n;
    else if (strcmp(a, "--tp") == 0)
      ok = is_count, o->tp = (int)n;
    else if (strcmp(a, "--layers") == 0)
      ok = is_count, o->layers = (int)n;
    else if (strcmp(a, "--hidden") == 0)
      ok = is_count, o->hidden = n;
    else if (strcmp(a, "--ffn") == 0)
      ok = is_count, o->ffn = n;
    else if (strcmp(a, "--seq") == 0)
      ok = is_count, o->seq = n;
    else if (strcmp(a, "--batch") == 0)
      ok = is_count, o->batch = n;
    else if (strcmp(a, "--steps") == 0)
      ok = is_count, o->steps = (int)n;
    else if (strcmp(a, "--amax-history") == 0)
      ok = is_int, o->amax_history = (int)n;
    else if (strcmp(a, "--log-every") == 0)
      ok = is_int && n > 0, o->log_every = (int)n;
    else if (strcmp(a, "--seed") == 0)
      ok = is_int && n >= 0, o->seed = (uint64_t)n;
    else if (strcmp(a, "--lr") == 0)
      o->lr = strtof(v, &end), ok = *end == '\0';
    else if (strcmp(a, "--margin") == 0)
      o->margin = strtof(v, &end), ok = *end == '\0';
    else if (strcmp(a, "--optimizer") == 0)
      o->optimizer = v, ok = strcmp(v, "adamw") == 0 || strcmp(v, "sgd") == 0;
    else if (strcmp(a, "--checkpoint-every") == 0)
      ok = is_int && n >= 0, o->checkpoint_every = (int)n;
    else if (strcmp(a, "--checkpoint-dir") == 0)
      o->checkpoint_dir = v;
    else if (strcmp(a, "--overlap") == 0)
      ok = parse_overlap(v, &o->overlap);
    else if (strcmp(a, "--recipe") == 0)
      ok = parse_recipe(v, &o->recipe);
    else {
      fprintf(stderr, "c_trainer: unknown option '%s' (see --help)\n", a);
      return 2;
    }
    if (!has_value) {
      fprintf(stderr, "c_trainer: %s needs a value (see --help)\n", a);
      return 2;
    }
    ++i;
    if (!ok) {
      fprintf(stderr, "c_trainer: bad value '%s' for %s (see --help)\n", v, a);
      return 2;
    }
  }
  if (o->resume && o->checkpoint_dir == NULL) {
    fprintf(stderr, "c_trainer: --resume needs --checkpoint-dir (see --help)\n");
    return 2;
  }
  return 0;
}

/* FNV-1a over the raw bytes of the parameters' local shards, in `params` order (as
 * train_mlp's checksum). */
static uint32_t checksum(qmesh_parameter* const* params, int n) {
  uint32_t h = 2166136261u;
  for (int i = 0; i < n; ++i) {
    qmesh_tensor value;
    CHECK(qmesh_parameter_value(params[i], &value));
    const size_t bytes = qmesh_tensor_nbytes(&value);
    unsigned char* host = malloc(bytes);
    if (host == NULL) check(QMESH_ERROR_OUT_OF_MEMORY, "malloc");
    qmesh_tensor copy = qmesh_host_tensor(host, value.dtype, value.ndim, value.shape);
    CHECK(qmesh_tensor_copy(&copy, &value));
    for (size_t b = 0; b < bytes; ++b) h = (h ^ host[b]) * 16777619u;
    free(host);
  }
  return h;
}

static int run(const options* o, qmesh_world* world) {
  int rank = 0, size = 1;
  CHECK(qmesh_world_rank(world, &rank));
  CHECK(qmesh_world_size(world, &size));
  if (o->dp == 0 && size % o->tp != 0) {
    if (rank == 0)
      fprintf(stderr, "c_trainer: --tp %d does not divide the number of ranks %d (see --help)\n",
              o->tp, size);
    return 2;
  }
  const int dp = o->dp > 0 ? o->dp : size / o->tp;

  /* The mesh {dp, tp} and the layers' context (recipe, delayed scaling; the host). */
  const qmesh_mesh_axis axes[2] = {{"dp", dp}, {"tp", o->tp}};
  qmesh_mesh* mesh = NULL;
  CHECK(qmesh_mesh_create(world, axes, 2, NULL, &mesh));
  int dp_rank = 0, tp_rank = 0;
  CHECK(qmesh_mesh_coord(mesh, "dp", &dp_rank));
  CHECK(qmesh_mesh_coord(mesh, "tp", &tp_rank));
  qmesh_context_config cc;
  qmesh_context_config_init(&cc);
  cc.recipe = o->recipe;
  cc.amax_history_len = o->amax_history;
  cc.margin = o->margin;
  cc.overlap = o->overlap;
  cc.emulate = o->emulate;
  qmesh_context* ctx = NULL;
  CHECK(qmesh_context_create(mesh, &cc, &ctx));

  /* The blocks, and their parameters in the order gradients become ready (last block
   * first). */
  qmesh_layernorm_mlp** blocks = calloc((size_t)o->layers, sizeof *blocks);
  int per_block = 0;
  for (int l = 0; l < o->layers; ++l) {
    qmesh_layernorm_mlp_config bc;
    qmesh_layernorm_mlp_config_init(&bc);
    bc.hidden = o->hidden;
    bc.ffn = o->ffn;
    bc.sequence_parallel = o->sequence_parallel;
    bc.regather_input = o->regather_input;
    bc.seed = o->seed + 1000u * (uint64_t)(l + 1);
    char name[32];
    snprintf(name, sizeof name, "block%d", l);
    CHECK(qmesh_layernorm_mlp_create(ctx, name, &bc, &blocks[l]));
    CHECK(qmesh_layernorm_mlp_parameter_count(blocks[l], &per_block));
  }
  const int nparams = per_block * o->layers;
  qmesh_parameter** params = calloc((size_t)nparams, sizeof *params);
  for (int l = o->layers - 1, k = 0; l >= 0; --l)
    for (int i = 0; i < per_block; ++i)
      CHECK(qmesh_layernorm_mlp_parameter(blocks[l], i, &params[k++]));

  qmesh_optimizer* opt = NULL;
  if (strcmp(o->optimizer, "adamw") == 0) {
    qmesh_adamw_config ac;
    qmesh_adamw_config_init(&ac);
    ac.lr = o->lr;
    ac.weight_decay = 0.0f;
    CHECK(qmesh_optimizer_create_adamw(params, nparams, &ac, NULL, &opt));
  } else {
    qmesh_sgd_config sc;
    qmesh_sgd_config_init(&sc);
    sc.lr = o->lr;
    sc.momentum = 0.9f;
    CHECK(qmesh_optimizer_create_sgd(params, nparams, &sc, NULL, &opt));
  }
  qmesh_grad_sync* sync = NULL;
  CHECK(qmesh_grad_sync_create(mesh, "dp", params, nparams, 4u << 20, NULL, &sync));
  example_teacher* teacher = example_teacher_create(o->hidden, o->seed);
  if (!teacher) exit(1); /* the reason is on stderr */

  /* What a checkpoint holds besides the context, the parameters and the optimizer state
   * (qmesh_checkpoint_save_training saves them all): the run's configuration, with
   * train_mlp's name; fsdp 1. */
  int32_t config[8] = {dp,
                       1,
                       o->tp,
                       o->layers,
                       (int32_t)o->hidden,
                       (int32_t)o->ffn,
                       (int32_t)o->recipe,
                       o->sequence_parallel};
  const int64_t eight = 8;
  const qmesh_named_tensor run_config = {"run.config",
                                         qmesh_host_tensor(config, QMESH_INT32, 1, &eight)};
  int start = 0;
  if (o->resume) {
    const int32_t expected[8] = {config[0], config[1], config[2], config[3],
                                 config[4], config[5], config[6], config[7]};
    CHECK(qmesh_checkpoint_load_training(world, o->checkpoint_dir, -1, ctx, params, nparams, opt,
                                         &run_config, 1, &start));
    if (memcmp(expected, config, sizeof config) != 0) {
      fprintf(stderr,
              "c_trainer: the checkpoint in %s was written by a run with another "
              "dp/fsdp/tp/layers/hidden/ffn/recipe/sequence-parallel configuration\n",
              o->checkpoint_dir);
      return 1;
    }
    if (rank == 0) printf("resumed from %s at step %d\n", o->checkpoint_dir, start);
  }

  /* Tokens of this rank: its dp rank's batch, sliced over tp under sequence parallelism. */
  const int64_t dp_tokens = o->batch * o->seq;
  const int64_t tokens = o->sequence_parallel ? dp_tokens / o->tp : dp_tokens;
  const int64_t first = dp_rank * dp_tokens + (o->sequence_parallel ? tp_rank * tokens : 0);
  const double global_count = (double)dp_tokens * dp * (double)o->hidden;
  const char* loss_axes[2] = {"dp", "tp"};
  const int loss_naxes = o->sequence_parallel ? 2 : 1; /* replicated outputs: over dp only */

  const double baseline = example_teacher_mean_predictor_loss(teacher);
  if (rank == 0) {
    printf("%s\n", qmesh_build_info());
    printf(
        "c_trainer: %d ranks = dp %d x tp %d%s, %d x LayerNormMLP(hidden %lld, ffn %lld), "
        "%d steps\n",
        size, dp, o->tp, o->sequence_parallel ? " (sequence parallel)" : "", o->layers,
        (long long)o->hidden, (long long)o->ffn, o->steps);
    printf("loss of predicting the mean: %.6f\n", baseline);
  }

  const int64_t shape[2] = {tokens, o->hidden};
  const size_t elems = (size_t)(tokens * o->hidden);
  float* xs = malloc(elems * sizeof(float));
  float* ts = malloc(elems * sizeof(float));
  float* dys = malloc(elems * sizeof(float));
  if (!blocks || !params || !xs || !ts || !dys) check(QMESH_ERROR_OUT_OF_MEMORY, "malloc");
  const qmesh_tensor x = qmesh_host_tensor(xs, QMESH_FLOAT32, 2, shape);
  const qmesh_tensor t = qmesh_host_tensor(ts, QMESH_FLOAT32, 2, shape);
  const qmesh_tensor dy = qmesh_host_tensor(dys, QMESH_FLOAT32, 2, shape);
  double sum_sq = 0;
  const int64_t one = 1;
  const qmesh_tensor loss_sum = qmesh_host_tensor(&sum_sq, QMESH_FLOAT64, 1, &one);
  double loss = 0;
  for (int step = start + 1; step <= o->steps; ++step) {
    if (example_teacher_batch(teacher, step, first, tokens, xs, ts) != 0) exit(1);
    qmesh_tensor y = x;
    for (int l = 0; l < o->layers; ++l) CHECK(qmesh_layernorm_mlp_forward(blocks[l], &y, &y));
    CHECK(qmesh_mse_loss(&y, &t, global_count, &dy, &loss_sum, NULL));
    qmesh_tensor grad = dy;
    for (int l = o->layers - 1; l >= 0; --l) {
      CHECK(qmesh_layernorm_mlp_backward(blocks[l], &grad, &grad));
      CHECK(qmesh_grad_sync_ready(sync, params + (o->layers - 1 - l) * per_block, per_block));
    }
    CHECK(qmesh_grad_sync_finish(sync));
    CHECK(qmesh_context_end_step(ctx)); /* the step's one amax all-reduce (FP8 delayed) */
    CHECK(qmesh_optimizer_step(opt));
    CHECK(qmesh_mesh_all_reduce(mesh, loss_axes, loss_naxes, &loss_sum, QMESH_SUM));
    loss = sum_sq / global_count;
    if (!isfinite(loss)) {
      fprintf(stderr, "c_trainer: the loss became %f at step %d; lower --lr\n", loss, step);
      return 1;
    }
    if (rank == 0 && (step % o->log_every == 0 || step == o->steps)) {
      printf("step %5d  loss %.6f\n", step, loss);
      fflush(stdout);
    }
    if (o->checkpoint_dir != NULL &&
        (step == o->steps || (o->checkpoint_every > 0 && step % o->checkpoint_every == 0)))
      CHECK(qmesh_checkpoint_save_training(world, o->checkpoint_dir, step, ctx, params, nparams,
                                           opt, &run_config, 1));
  }

  /* Every rank's parameter checksum, to compare runs (and train_mlp) bit for bit. */
  int32_t mine = (int32_t)checksum(params, nparams);
  int32_t* sums = calloc((size_t)size, sizeof *sums);
  const int64_t nranks = size;
  const qmesh_tensor in = qmesh_host_tensor(&mine, QMESH_INT32, 1, &one);
  const qmesh_tensor out = qmesh_host_tensor(sums, QMESH_INT32, 1, &nranks);
  CHECK(qmesh_world_all_gather(world, &in, &out));
  if (rank == 0) {
    printf("final loss %.6f (predicting the mean: %.6f, ratio %.3f)\nparameter checksums:", loss,
           baseline, loss / baseline);
    for (int r = 0; r < size; ++r) printf(" %08x", (unsigned)(uint32_t)sums[r]);
    printf("\n");
  }

  /* Destroyed in reverse order of creation. */
  free(sums);
  free(dys);
  free(ts);
  free(xs);
  example_teacher_destroy(teacher);
  CHECK(qmesh_grad_sync_destroy(sync));
  CHECK(qmesh_optimizer_destroy(opt));
  free(params);
  for (int l = o->layers - 1; l >= 0; --l) CHECK(qmesh_layernorm_mlp_destroy(blocks[l]));
  free(blocks);
  CHECK(qmesh_context_destroy(ctx));
  CHECK(qmesh_mesh_destroy(mesh));
  return 0;
}

int main(int argc, char** argv) {
  options o;
  const int parsed = parse_options(argc, argv, &o);
  if (parsed != 0) return parsed == 1 ? 0 : 2;
  if (qmesh_version() != QMESH_C_API_VERSION) {
    fprintf(stderr, "c_trainer: built against qmesh C API %d, running with %d\n",
            QMESH_C_API_VERSION, qmesh_version());
    return 2;
  }
  qmesh_world* world = NULL;
  CHECK(qmesh_world_create_mpi(&argc, &argv, &world));
  CHECK(qmesh_world_rank(world, &rank_of_process));
  const int status = run(&o, world);
  if (status != 0) exit(status); /* not MPI_Finalize: it would wait for the other ranks */
  CHECK(qmesh_world_destroy(world));
  return 0;
}
