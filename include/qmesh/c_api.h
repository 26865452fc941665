/* qmesh's stable C API (C11; usable from C++): what trainers written in other languages or
 * built with other compilers link against (library qmesh_c, pkg-config module qmesh).
 * docs/c_api.md has the lifetime and threading rules and an annotated program.
 *
 * Conventions:
 * - Every function returns a qmesh_status; QMESH_OK (0) is success. On failure,
 *   qmesh_last_error() gives this thread's message and the out-parameters are untouched.
 *   No C++ exception, abort or exit crosses this API.
 * - Objects are opaque handles with a create/destroy pair; destroy(NULL) is a no-op. A
 *   destroyed handle must not be used or destroyed again (undefined, not detected).
 *   A handle must outlive every handle created from it (destroy in reverse order).
 * - Config structs start with their own size: set struct_size = sizeof(the struct) (the
 *   *_init functions do), so a program built against an older header keeps working.
 * - Tensors are described by the caller (qmesh_tensor); qmesh never takes ownership of
 *   user memory. Views that qmesh returns (layer outputs, parameters) are owned by the
 *   object that returned them and stay valid as documented at each function.
 */
#ifndef QMESH_C_API_H_
#define QMESH_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QMESH_C_EXPORT __attribute__((visibility("default")))

/* The version of this header: major.minor.patch of the qmesh release it comes with. */
#define QMESH_C_API_VERSION_MAJOR 0
#define QMESH_C_API_VERSION_MINOR 1
#define QMESH_C_API_VERSION_PATCH 0
#define QMESH_C_API_VERSION \
  (QMESH_C_API_VERSION_MAJOR * 10000 + QMESH_C_API_VERSION_MINOR * 100 + QMESH_C_API_VERSION_PATCH)

typedef enum qmesh_status {
  QMESH_OK = 0,
  QMESH_ERROR_INVALID_ARGUMENT = 1, /* bad or unfitting input: see qmesh_last_error */
  QMESH_ERROR_FAILED = 2,           /* a timeout (a peer died or never came) or a library failed */
  QMESH_ERROR_UNSUPPORTED = 3,      /* not in this build or device (e.g. UCX, CUDA) */
  QMESH_ERROR_OUT_OF_MEMORY = 4,
  QMESH_ERROR_INTERNAL = 5 /* an unexpected failure inside qmesh: please report it */
} qmesh_status;

/* This thread's message for its last failed call ("" if none has failed). Valid until the
 * thread's next qmesh call. */
QMESH_C_EXPORT const char* qmesh_last_error(void);
/* "OK", "invalid argument", ... */
QMESH_C_EXPORT const char* qmesh_status_name(qmesh_status status);
/* The library's QMESH_C_API_VERSION (compare with the header's to detect a mismatch). */
QMESH_C_EXPORT int qmesh_version(void);
/* "qmesh 0.1.0 (cuda=off ...)": version and build configuration. Static storage. */
QMESH_C_EXPORT const char* qmesh_build_info(void);

/* ---- tensors ------------------------------------------------------------------------ */

typedef enum qmesh_dtype {
  QMESH_FLOAT32 = 0,
  QMESH_FLOAT16 = 1,
  QMESH_BFLOAT16 = 2,
  QMESH_FLOAT8_E4M3 = 3,
  QMESH_FLOAT8_E5M2 = 4,
  QMESH_INT32 = 5,
  QMESH_FLOAT64 = 6
} qmesh_dtype;

typedef enum qmesh_device_kind { QMESH_DEVICE_HOST = 0, QMESH_DEVICE_CUDA = 1 } qmesh_device_kind;

typedef struct qmesh_device {
  qmesh_device_kind kind;
  int index; /* CUDA ordinal; 0 for the host */
} qmesh_device;

#define QMESH_MAX_DIMS 8

/* A caller-described tensor (not owned by qmesh). Dense row-major: strides, when not NULL,
 * must be the row-major strides of shape in elements (anything else: INVALID_ARGUMENT). */
typedef struct qmesh_tensor {
  void* data;
  qmesh_dtype dtype;
  int ndim; /* 0 ..= QMESH_MAX_DIMS */
  int64_t shape[QMESH_MAX_DIMS];
  const int64_t* strides;
  qmesh_device device;
} qmesh_tensor;

/* A dense host tensor view over `data` (ndim <= QMESH_MAX_DIMS, dims copied). */
QMESH_C_EXPORT qmesh_tensor qmesh_host_tensor(void* data, qmesh_dtype dtype, int ndim,
                                              const int64_t* shape);
/* Bytes of the tensor's elements (0 for a bad dtype or ndim). */
QMESH_C_EXPORT size_t qmesh_tensor_nbytes(const qmesh_tensor* tensor);
/* Copies src into dst (same dtype and shape; any devices). Blocking. */
QMESH_C_EXPORT qmesh_status qmesh_tensor_copy(const qmesh_tensor* dst, const qmesh_tensor* src);

/* ---- quantized tensors and the GEMM ---------------------------------------------------- */

/* An FP8 tensor described by the caller: codes, an optional transposed copy (the columnwise
 * layout CUDA FP8 GEMMs read when the rowwise one is not contiguous along K), and its fp32
 * scalars on the same device (value = code * scale_inv; scale = 1 / scale_inv). */
typedef struct qmesh_quantized_tensor {
  qmesh_tensor data;   /* QMESH_FLOAT8_E4M3 or _E5M2, [rows, cols] */
  qmesh_tensor data_t; /* [cols, rows], or data_t.data == NULL for none */
  float* scale;
  float* scale_inv;
  float* amax;
} qmesh_quantized_tensor;

/* out.data = saturate(round-to-nearest-even(x * *out.scale)), *out.scale_inv = 1 / *out.scale,
 * *out.amax = max(*out.amax, max |x|) (a running max; out.data_t untouched). x: fp32, bf16 or
 * fp16 with out.data's element count, same device. stream: cudaStream_t or NULL. */
QMESH_C_EXPORT qmesh_status qmesh_quantize(const qmesh_tensor* x, const qmesh_quantized_tensor* out,
                                           void* stream);

/* A GEMM input: exactly one of plain (fp32, bf16, fp16) and fp8 is non-NULL. */
typedef struct qmesh_gemm_operand {
  const qmesh_tensor* plain;
  const qmesh_quantized_tensor* fp8;
} qmesh_gemm_operand;

typedef enum qmesh_gemm_epilogue {
  QMESH_GEMM_EPILOGUE_NONE = 0,
  QMESH_GEMM_EPILOGUE_BIAS = 1,          /* r += bias[n] */
  QMESH_GEMM_EPILOGUE_GELU = 2,          /* r = gelu(r) */
  QMESH_GEMM_EPILOGUE_BIAS_GELU_AUX = 3, /* aux = r + bias[n]; r = gelu(aux) */
  QMESH_GEMM_EPILOGUE_DGELU = 4,         /* r *= gelu'(aux) */
  QMESH_GEMM_EPILOGUE_BIAS_GRAD = 5      /* bias[m] = sum_k op(A)[m, k] */
} qmesh_gemm_epilogue;

/* D = epilogue(alpha * op(A) * op(B) [+ D]), row-major: op(A) [M, K], op(B) [K, N], D [M, N];
 * trans_a: A stored [K, M]; trans_b: B stored [N, K] (the default, the canonical "TN" form).
 * qmesh_gemm_args_init: trans_b = 1, alpha = 1, the rest 0 / NULL. */
typedef struct qmesh_gemm_args {
  size_t struct_size;
  qmesh_gemm_operand a;
  qmesh_gemm_operand b;
  int trans_a;
  int trans_b;
  qmesh_tensor d;
  float* d_scale; /* FP8 D only (required): fp32 scalar on D's device */
  float* d_amax;  /* FP8 D only (optional) */
  float alpha;
  int accumulate; /* D += result (not with an FP8 D) */
  qmesh_gemm_epilogue epilogue;
  const qmesh_tensor* bias; /* per the epilogue, else NULL */
  const qmesh_tensor* aux;
  int split_accumulation; /* Hopper FP8: promote to fp32 regularly (dgrad, wgrad) */
} qmesh_gemm_args;

QMESH_C_EXPORT void qmesh_gemm_args_init(qmesh_gemm_args* args);

/* A planned GEMM: checked and planned once (algorithm, workspace), run many times on the
 * tensors it was created with (they must outlive the plan). Not thread-safe. */
typedef struct qmesh_gemm_plan qmesh_gemm_plan;

/* FAILED with the reason when the GEMM cannot run (shapes, dtypes, layouts, devices). */
QMESH_C_EXPORT qmesh_status qmesh_gemm_plan_create(const qmesh_gemm_args* args, void* stream,
                                                   qmesh_gemm_plan** plan);
QMESH_C_EXPORT qmesh_status qmesh_gemm_plan_destroy(qmesh_gemm_plan* plan);
/* Host: computes D before returning. CUDA: enqueues on stream. */
QMESH_C_EXPORT qmesh_status qmesh_gemm_plan_run(qmesh_gemm_plan* plan, void* stream);

/* ---- world: the processes of the job ----------------------------------------------- */

typedef struct qmesh_world qmesh_world;

typedef enum qmesh_reduce_op { QMESH_SUM = 0, QMESH_MAX = 1, QMESH_MIN = 2 } qmesh_reduce_op;

/* The MPI world (MPI_COMM_WORLD): initializes MPI (MPI_THREAD_MULTIPLE) unless the caller
 * already did; the last MPI world destroyed finalizes MPI if this call initialized it.
 * argc/argv may be NULL. UNSUPPORTED without MPI support. */
QMESH_C_EXPORT qmesh_status qmesh_world_create_mpi(int* argc, char*** argv, qmesh_world** world);
/* A world bootstrapped through a directory that every rank sees (one fresh directory per
 * job), over UCX: every rank passes its rank in [0, size). Blocks until all ranks joined
 * (comm timeout). UNSUPPORTED without UCX support. */
QMESH_C_EXPORT qmesh_status qmesh_world_create_store(int rank, int size, const char* directory,
                                                     qmesh_world** world);
QMESH_C_EXPORT qmesh_status qmesh_world_destroy(qmesh_world* world);
QMESH_C_EXPORT qmesh_status qmesh_world_rank(const qmesh_world* world, int* rank);
QMESH_C_EXPORT qmesh_status qmesh_world_size(const qmesh_world* world, int* size);
/* Collectives over every rank, host tensors, blocking (comm timeout). */
QMESH_C_EXPORT qmesh_status qmesh_world_all_reduce(qmesh_world* world, const qmesh_tensor* tensor,
                                                   qmesh_reduce_op op);
/* out: ranks x in's elements, rank order. */
QMESH_C_EXPORT qmesh_status qmesh_world_all_gather(qmesh_world* world, const qmesh_tensor* in,
                                                   const qmesh_tensor* out);
QMESH_C_EXPORT qmesh_status qmesh_world_barrier(qmesh_world* world);

/* ---- mesh: named parallelism axes over a world ------------------------------------- */

typedef struct qmesh_mesh qmesh_mesh;

typedef struct qmesh_mesh_axis {
  const char* name; /* non-empty, unique */
  int size;         /* >= 1; the sizes multiply to the world size */
} qmesh_mesh_axis;

/* Which axis plays which role (like TransformerEngine JAX's MeshResource); NULL or "" for
 * an absent role. qmesh_mesh_resource_init sets dp = "dp", tp = "tp". */
typedef struct qmesh_mesh_resource {
  size_t struct_size;
  const char* dp;
  const char* tp;
  const char* fsdp;
  const char* pp;
} qmesh_mesh_resource;

QMESH_C_EXPORT void qmesh_mesh_resource_init(qmesh_mesh_resource* resource);
/* Collective over the world. The last axis varies fastest. resource may be NULL (defaults). */
QMESH_C_EXPORT qmesh_status qmesh_mesh_create(qmesh_world* world, const qmesh_mesh_axis* axes,
                                              int naxes, const qmesh_mesh_resource* resource,
                                              qmesh_mesh** mesh);
QMESH_C_EXPORT qmesh_status qmesh_mesh_destroy(qmesh_mesh* mesh);
/* This rank's coordinate along the named axis. */
QMESH_C_EXPORT qmesh_status qmesh_mesh_coord(const qmesh_mesh* mesh, const char* axis, int* coord);
/* All-reduce of a host tensor over the ranks that differ from this one only along `axes`. */
QMESH_C_EXPORT qmesh_status qmesh_mesh_all_reduce(qmesh_mesh* mesh, const char* const* axes,
                                                  int naxes, const qmesh_tensor* tensor,
                                                  qmesh_reduce_op op);

/* ---- layer context: recipe, FP8 scaling, placement ---------------------------------- */

typedef struct qmesh_context qmesh_context;

typedef enum qmesh_recipe {
  QMESH_RECIPE_FP32 = 0,
  QMESH_RECIPE_BF16 = 1,
  QMESH_RECIPE_FP8_DELAYED = 2,
  QMESH_RECIPE_FP8_CURRENT = 3,
  QMESH_RECIPE_FP8_BLOCK = 4, /* 1x128 blocks of activations and gradients, 128x128 weight tiles */
  QMESH_RECIPE_MXFP8 = 5,     /* MXFP8 (TransformerEngine's defaults); its GEMMs run natively on
                               * compute capability 10.0+, elsewhere emulated with config.emulate
                               * or QMESH_BLOCK_EMULATION=1 (docs/design/mxfp8.md) */
  QMESH_RECIPE_NVFP4 = 6      /* NVFP4 (TransformerEngine's defaults; the nvfp4_* switches); its
                               * GEMMs run emulated and need config.emulate or
                               * QMESH_BLOCK_EMULATION=1 (docs/design/nvfp4.md) */
} qmesh_recipe;

typedef enum qmesh_fp8_format { QMESH_FP8_HYBRID = 0, QMESH_FP8_E4M3 = 1 } qmesh_fp8_format;
typedef enum qmesh_amax_algo { QMESH_AMAX_MAX = 0, QMESH_AMAX_MOST_RECENT = 1 } qmesh_amax_algo;
typedef enum qmesh_overlap {
  QMESH_OVERLAP_NONE = 0,
  QMESH_OVERLAP_RING = 1,
  QMESH_OVERLAP_BIDIR = 2
} qmesh_overlap;

/* qmesh_context_config_init gives TransformerEngine's defaults (delayed scaling, history
 * 1024, margin 0, max, hybrid) on the host. */
typedef struct qmesh_context_config {
  size_t struct_size;
  qmesh_recipe recipe;
  /* delayed scaling */
  int amax_history_len;
  float margin;
  qmesh_amax_algo amax_algo;
  qmesh_fp8_format delayed_format;
  /* current scaling */
  qmesh_fp8_format current_format;
  int power_of_two_scales;
  float amax_epsilon;
  /* default collective-GEMM schedule of sequence-parallel layers */
  qmesh_overlap overlap;
  /* placement: device, compute stream and communication stream (cudaStream_t or NULL) */
  qmesh_device device;
  void* stream;
  void* comm_stream;
  /* block scaling (TransformerEngine's Float8BlockScaling defaults: E4M3, power-of-two block
   * scales); the block shapes are the recipe's defaults. */
  qmesh_fp8_format block_format;
  int block_power_of_two_scales; /* of inputs, weights and gradients alike */
  /* NVFP4 (TransformerEngine's NVFP4BlockScaling switches; 0, their default, keeps the random
   * Hadamard transform, stochastic rounding of gradients and 16x16 weight tiles) */
  int nvfp4_disable_rht;
  int nvfp4_disable_stochastic_rounding;
  int nvfp4_disable_2d_quantization;
  /* MXFP8 and NVFP4: run their GEMMs emulated where the device has no native one (what
   * QMESH_BLOCK_EMULATION=1 does for the whole process); 0 by default */
  int emulate;
} qmesh_context_config;

QMESH_C_EXPORT void qmesh_context_config_init(qmesh_context_config* config);
/* The mesh must outlive the context. */
QMESH_C_EXPORT qmesh_status qmesh_context_create(const qmesh_mesh* mesh,
                                                 const qmesh_context_config* config,
                                                 qmesh_context** context);
QMESH_C_EXPORT qmesh_status qmesh_context_destroy(qmesh_context* context);
/* Once per training step, after backward, on every rank: under delayed scaling the step's
 * one amax all-reduce over the mesh and the fused scale update; under NVFP4 it advances the
 * step that seeds stochastic rounding and the RHT; otherwise nothing. */
QMESH_C_EXPORT qmesh_status qmesh_context_end_step(qmesh_context* context);

/* ---- parameters --------------------------------------------------------------------- */

/* A trainable parameter of a layer (fp32 master weights of this rank's shard and their
 * gradient), borrowed: valid while its layer lives. */
typedef struct qmesh_parameter qmesh_parameter;

/* The name ("block0.fc1.weight"): valid while the layer lives. */
QMESH_C_EXPORT qmesh_status qmesh_parameter_name(const qmesh_parameter* param, const char** name);
QMESH_C_EXPORT qmesh_status qmesh_parameter_value(const qmesh_parameter* param,
                                                  qmesh_tensor* value);
QMESH_C_EXPORT qmesh_status qmesh_parameter_grad(const qmesh_parameter* param, qmesh_tensor* grad);

/* ---- LayerNormMLP: y = x + fc2(gelu(fc1(LayerNorm(x)))), fc1 column- and fc2
 *      row-parallel over the tp axis ----------------------------------------------------- */

typedef struct qmesh_layernorm_mlp qmesh_layernorm_mlp;

typedef struct qmesh_layernorm_mlp_config {
  size_t struct_size;
  int64_t hidden;
  int64_t ffn; /* divisible by tp */
  int sequence_parallel;
  float layer_norm_eps; /* 1e-5 */
  int regather_input;   /* fc1's gathered input gathered again in backward (needs sp) */
  uint64_t seed;        /* parameters are a pure function of the seed */
} qmesh_layernorm_mlp_config;

QMESH_C_EXPORT void qmesh_layernorm_mlp_config_init(qmesh_layernorm_mlp_config* config);
/* The context must outlive the block. */
QMESH_C_EXPORT qmesh_status qmesh_layernorm_mlp_create(qmesh_context* context, const char* name,
                                                       const qmesh_layernorm_mlp_config* config,
                                                       qmesh_layernorm_mlp** block);
QMESH_C_EXPORT qmesh_status qmesh_layernorm_mlp_destroy(qmesh_layernorm_mlp* block);
/* x: fp32 [T, hidden] ([T/tp, hidden] with sequence parallelism) on the context's device; it
 * must stay alive until backward. *y: a view owned by the block, valid until its next
 * forward. */
QMESH_C_EXPORT qmesh_status qmesh_layernorm_mlp_forward(qmesh_layernorm_mlp* block,
                                                        const qmesh_tensor* x, qmesh_tensor* y);
/* dy shaped like y; writes every parameter's grad; *dx owned by the block like y. */
QMESH_C_EXPORT qmesh_status qmesh_layernorm_mlp_backward(qmesh_layernorm_mlp* block,
                                                         const qmesh_tensor* dy, qmesh_tensor* dx);
QMESH_C_EXPORT qmesh_status qmesh_layernorm_mlp_parameter_count(const qmesh_layernorm_mlp* block,
                                                                int* count);
QMESH_C_EXPORT qmesh_status qmesh_layernorm_mlp_parameter(qmesh_layernorm_mlp* block, int index,
                                                          qmesh_parameter** param);

/* ---- Dense: y = x·Wᵀ + b (then GELU), unsharded, column- or row-parallel over tp ------ */

typedef struct qmesh_dense qmesh_dense;

typedef enum qmesh_dense_parallelism {
  QMESH_DENSE_UNSHARDED = 0, /* x [T, in] -> y [T, out] */
  QMESH_DENSE_COLUMN = 1,    /* W [out/tp, in]: x [T, in] (sp: [T/tp, in]) -> y [T, out/tp] */
  QMESH_DENSE_ROW = 2        /* W [out, in/tp]: x [T, in/tp] -> y [T, out] (sp: [T/tp, out]) */
} qmesh_dense_parallelism;

typedef enum qmesh_activation {
  QMESH_ACTIVATION_NONE = 0,
  QMESH_ACTIVATION_GELU = 1
} qmesh_activation;

/* qmesh_dense_config_init: unsharded, with bias, no activation. */
typedef struct qmesh_dense_config {
  size_t struct_size;
  int64_t in_features; /* global sizes; the sharded one must be divisible by tp */
  int64_t out_features;
  qmesh_dense_parallelism parallelism;
  int sequence_parallel; /* column or row only */
  int bias;
  qmesh_activation activation; /* not with row parallelism */
  int regather_input;          /* column + sp: gather x again in backward */
  uint64_t seed;               /* W ~ N(0, 1/in) keyed by (seed, global index); b = 0 */
} qmesh_dense_config;

QMESH_C_EXPORT void qmesh_dense_config_init(qmesh_dense_config* config);
/* The context must outlive the layer. */
QMESH_C_EXPORT qmesh_status qmesh_dense_create(qmesh_context* context, const char* name,
                                               const qmesh_dense_config* config,
                                               qmesh_dense** layer);
QMESH_C_EXPORT qmesh_status qmesh_dense_destroy(qmesh_dense* layer);
/* As qmesh_layernorm_mlp_forward / _backward, with the shapes of qmesh_dense_parallelism. */
QMESH_C_EXPORT qmesh_status qmesh_dense_forward(qmesh_dense* layer, const qmesh_tensor* x,
                                                qmesh_tensor* y);
QMESH_C_EXPORT qmesh_status qmesh_dense_backward(qmesh_dense* layer, const qmesh_tensor* dy,
                                                 qmesh_tensor* dx);
QMESH_C_EXPORT qmesh_status qmesh_dense_parameter_count(const qmesh_dense* layer, int* count);
/* Index 0 is the weight, 1 the bias (when it has one). */
QMESH_C_EXPORT qmesh_status qmesh_dense_parameter(qmesh_dense* layer, int index,
                                                  qmesh_parameter** param);

/* ---- training: loss, gradient sync, optimizers -------------------------------------- */

/* For the local part of a global batch of global_count elements: dy = 2 (y - target) /
 * global_count and sum_sq (fp64, one element, y's device) = the local sum of squared
 * errors; sum it over the ranks holding distinct elements (qmesh_mse_loss_global does).
 * stream: cudaStream_t or NULL. */
QMESH_C_EXPORT qmesh_status qmesh_mse_loss(const qmesh_tensor* y, const qmesh_tensor* target,
                                           double global_count, const qmesh_tensor* dy,
                                           const qmesh_tensor* sum_sq, void* stream);
/* The global mean-squared error of a batch split over the mesh: its elements are distinct
 * over the dp (and fsdp) axes and, when split_over_tp is non-zero (sequence-parallel outputs),
 * over the tp axis too; otherwise tp ranks hold replicated outputs, counted once. Every rank
 * holds as many elements as y. Writes dy (with the global element count) and *loss (the
 * same on every rank). Collective over those ranks; blocking (waits for stream). */
QMESH_C_EXPORT qmesh_status qmesh_mse_loss_global(const qmesh_mesh* mesh, int split_over_tp,
                                                  const qmesh_tensor* y, const qmesh_tensor* target,
                                                  const qmesh_tensor* dy, void* stream,
                                                  double* loss);

typedef struct qmesh_grad_sync qmesh_grad_sync;

/* Sums gradients over the mesh axis `axis` (data parallel) in buckets of up to bucket_bytes,
 * launched as their parameters become ready. params: in the order their gradients become
 * ready (the array is copied; the parameters must outlive the sync). */
QMESH_C_EXPORT qmesh_status qmesh_grad_sync_create(const qmesh_mesh* mesh, const char* axis,
                                                   qmesh_parameter* const* params, int nparams,
                                                   size_t bucket_bytes, void* stream,
                                                   qmesh_grad_sync** sync);
QMESH_C_EXPORT qmesh_status qmesh_grad_sync_destroy(qmesh_grad_sync* sync);
/* These parameters' gradients are final for this step. */
QMESH_C_EXPORT qmesh_status qmesh_grad_sync_ready(qmesh_grad_sync* sync,
                                                  qmesh_parameter* const* params, int nparams);
/* Waits for every bucket and writes the sums back (comm timeout: a dead peer fails here). */
QMESH_C_EXPORT qmesh_status qmesh_grad_sync_finish(qmesh_grad_sync* sync);

typedef struct qmesh_optimizer qmesh_optimizer;

typedef struct qmesh_adamw_config {
  size_t struct_size;
  float lr, beta1, beta2, eps, weight_decay; /* init: 1e-3, 0.9, 0.999, 1e-8, 0.01 */
} qmesh_adamw_config;

typedef struct qmesh_sgd_config {
  size_t struct_size;
  float lr, momentum, weight_decay; /* init: 0.01, 0, 0 */
} qmesh_sgd_config;

QMESH_C_EXPORT void qmesh_adamw_config_init(qmesh_adamw_config* config);
QMESH_C_EXPORT void qmesh_sgd_config_init(qmesh_sgd_config* config);
/* Over a fixed list of parameters (their order defines the state layout). */
QMESH_C_EXPORT qmesh_status qmesh_optimizer_create_adamw(qmesh_parameter* const* params,
                                                         int nparams,
                                                         const qmesh_adamw_config* config,
                                                         void* stream, qmesh_optimizer** opt);
QMESH_C_EXPORT qmesh_status qmesh_optimizer_create_sgd(qmesh_parameter* const* params, int nparams,
                                                       const qmesh_sgd_config* config, void* stream,
                                                       qmesh_optimizer** opt);
QMESH_C_EXPORT qmesh_status qmesh_optimizer_destroy(qmesh_optimizer* opt);
QMESH_C_EXPORT qmesh_status qmesh_optimizer_step(qmesh_optimizer* opt);
/* The learning rate of the following steps (a schedule sets it before each step); FAILED
 * unless lr > 0. */
QMESH_C_EXPORT qmesh_status qmesh_optimizer_set_lr(qmesh_optimizer* opt, float lr);
/* The optimizer's state tensors (moment buffers, a step counter) named "<param>.<slot>", for
 * checkpoints: *name and the tensor are owned by the optimizer. */
QMESH_C_EXPORT qmesh_status qmesh_optimizer_state_count(const qmesh_optimizer* opt, int* count);
QMESH_C_EXPORT qmesh_status qmesh_optimizer_state(qmesh_optimizer* opt, int index,
                                                  const char** name, qmesh_tensor* tensor);

/* ---- checkpoints ---------------------------------------------------------------------- */

/* A tensor of a checkpoint, under a name unique within it. */
typedef struct qmesh_named_tensor {
  const char* name;
  qmesh_tensor tensor;
} qmesh_named_tensor;

/* Collective over the world: every rank writes its tensors (and, when context is not NULL, the
 * context's recipe as "context.recipe" and, under FP8 delayed scaling, its scaling states as
 * tensors named "scaling.*": names the given ones must not use) to its file in
 * <directory>/step-<step>/, then <directory>/latest names that step. Files are written
 * atomically: a crash never leaves `latest` naming a partial checkpoint; a rank that cannot
 * write fails every rank's call with the same message. The same format as
 * train_mlp --checkpoint-dir. qmesh_checkpoint_save_training saves all of a run's state in
 * one call. */
QMESH_C_EXPORT qmesh_status qmesh_checkpoint_save(qmesh_world* world, const char* directory,
                                                  int step, const qmesh_named_tensor* tensors,
                                                  int ntensors, qmesh_context* context);
/* Collective over the world: loads checkpoint `step` of <directory> (-1: the one
 * <directory>/latest names) into the tensors (exactly these names, dtypes and shapes) and the
 * context (NULL: the checkpoint must hold no context); *loaded_step: its step. Every rank
 * reads and checks its part, then the ranks agree: either every rank loads, or none changes
 * anything and every rank returns the first failing rank's status (INVALID_ARGUMENT for a
 * checkpoint that is missing or does not match) with the same message, naming that rank and
 * what is wrong there (no checkpoint, a missing or corrupted file, tensors that do not match,
 * a checkpoint of another recipe or of more ranks, a missing FP8 scaling state). */
QMESH_C_EXPORT qmesh_status qmesh_checkpoint_load(qmesh_world* world, const char* directory,
                                                  int step, const qmesh_named_tensor* tensors,
                                                  int ntensors, qmesh_context* context,
                                                  int* loaded_step);
/* qmesh_checkpoint_load of the latest checkpoint (step -1). */
QMESH_C_EXPORT qmesh_status qmesh_checkpoint_load_latest(qmesh_world* world, const char* directory,
                                                         const qmesh_named_tensor* tensors,
                                                         int ntensors, qmesh_context* context,
                                                         int* step);
/* A training run's complete checkpoint, in one call: the context (recipe and FP8 scaling
 * state), every parameter's value, the optimizer's state (created over these parameters) and
 * the caller's own tensors `extra` (its configuration; may be NULL when nextra is 0). Also
 * records the mesh layout when the mesh's axes are among "dp", "fsdp", "tp" in that order.
 * Collective over the world, as qmesh_checkpoint_save and qmesh_checkpoint_load; step -1 loads
 * the latest. */
QMESH_C_EXPORT qmesh_status
qmesh_checkpoint_save_training(qmesh_world* world, const char* directory, int step,
                               qmesh_context* context, qmesh_parameter* const* params, int nparams,
                               qmesh_optimizer* opt, const qmesh_named_tensor* extra, int nextra);
QMESH_C_EXPORT qmesh_status qmesh_checkpoint_load_training(
    qmesh_world* world, const char* directory, int step, qmesh_context* context,
    qmesh_parameter* const* params, int nparams, qmesh_optimizer* opt,
    const qmesh_named_tensor* extra, int nextra, int* loaded_step);

#ifdef __cplusplus
}
#endif

#endif /* QMESH_C_API_H_ */
