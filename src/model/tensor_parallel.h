// One tensor-parallel rank's part of a Qwen3 model (issue 14; DESIGN.md §1 scale-out), as vLLM and SGLang
// shard it (dist/shard_plan.h):
//   q/k/v_proj column-parallel (the rank's query heads; its KV heads, replicated when tp > num_kv_heads),
//   o_proj row-parallel, then an all-reduce;  gate/up column-parallel, down row-parallel, then an all-reduce;
//   the embedding replicated; the LM head vocab-parallel, its logits all-gathered.
// Why the embedding is replicated and the LM head split: the embedding is a gather of T rows (no traffic
// either way) and a vocab-parallel one would cost one more all-reduce per step (vLLM's
// VocabParallelEmbedding), against V x H x 2 bytes of memory per rank (0.78 GB for Qwen3-4B, 1.6 % of an
// H200); for tied checkpoints the rank's LM head rows are a view into that table, so nothing is stored
// twice. The LM head GEMM reads all V x H weights every decode step (0.78 GB, ~180 us on an H200 for
// Qwen3-4B): split, each rank reads 1/tp of it, and the all-gather moves R x V x 4 / tp bytes.
//
// A rank's model is the ordinary Qwen3Model with shard_config's shapes (its heads and intermediate slice),
// so workspace sizing, the KV cache (each rank's pool holds its KV heads), attention preparation, paged
// attention and the GEMV paths run unchanged on the rank's head subset. Two things change, in the ops below.
//
// Rounding of the all-reduce (TpShard::reduce):
//   f32  (the CPU default): each rank's partial product is kept in fp32, the ranks' partials are summed in
//        fp32 in rank order and rounded once to bf16 -- linear's one rounding point, so a row-parallel
//        projection differs from TP = 1 only in the order of its fp32 summation (docs/NUMERICS.md).
//   bf16 (CUDA; vLLM and SGLang): each rank's projection is rounded to bf16 (the tuned GEMV/GEMM as they
//        are), then summed (NCCL: fp32 adds of bf16 values, rounded per hop; two ranks: one rounding). Half
//        the bytes of f32 and no extra kernels. With one rank the sum is the identity: bitwise TP = 1.
#pragma once

#include "dist/communicator.h"
#include "dist/shard_plan.h"
#include "kiln/config.h"
#include "kiln/safetensors.h"
#include "kiln/tensor.h"
#include "model/weights.h"
#include "ops/fp8_linear.h"
#include "ops/moe.h"

namespace kiln {

struct TpShard {
  dist::ShardPlan plan;
  dist::Communicator* comm = nullptr;  // this rank's; outlives the model, used from the rank's thread
  dist::ReduceType reduce = dist::ReduceType::f32;
};

// The config a rank's model runs with: num_heads, num_kv_heads and intermediate_size of its slice; every
// other field (vocab_size included: logits stay [R, vocab]) the model's.
ModelConfig shard_config(const ModelConfig& c, const dist::ShardPlan& p);

// The rank's weights, read straight from the mapped checkpoint (only its slices' bytes are touched; the
// row-parallel column slices go through a staging buffer of at most 16 MiB on their way to a GPU), or the
// same slices of fill_random_weight's values when ckpt is null, so a TP model equals the TP = 1 model.
// lm_head holds the rank's plan.vocab rows (a view into embed when tied). Block-FP8 projections (a -FP8
// checkpoint or --quantization fp8) are sliced on their 128 x 128 block grid, so each rank's slice of heads
// and of intermediate_size must be a multiple of 128 (else an error naming the tensor); block-FP8 MoE experts
// stay e4m3 as at TP = 1, whole experts under expert parallelism, else each expert's moe_intermediate_size
// slice a multiple of 128 (else an error naming moe_intermediate_size, the block and --tp).
Qwen3Weights load_qwen3_weights_shard(const ModelConfig& full, const dist::ShardPlan& p,
                                      const Checkpoint* ckpt, uint64_t seed, Device device);

// The row-parallel O / down projection and what follows it: the sum over ranks of linear(x, weight) (weight
// the rank's column slice), rounded as TpShard::reduce says, into tmp, then add_rms_norm(tmp, residual,
// norm_weight, eps, normed) -- ops::linear_add_rms_norm's contract with the all-reduce inside.
//   partial: f32 [M, N] contiguous (the fp32 partials; f32 reduce only, else unused); tmp: bf16 [M, N]
//   contiguous. Enqueued on ops::current_stream() (capturable: NCCL's all-reduce is).
void tp_linear_add_rms_norm(const TpShard& tp, const Tensor& x, const ops::LinearWeight& weight,
                            const Tensor& residual, const Tensor& norm_weight, float eps, const Tensor& tmp,
                            const Tensor& partial, const Tensor& normed);

// The sparse MLP under tensor or expert parallelism: the rank's ops::moe_mlp share (ops/moe.h) summed over
// the ranks as tp_linear_add_rms_norm sums (f32: the rank's fp32 partial, one rounding after the all-reduce;
// bf16: the rank's bf16 output), into tmp, then add_rms_norm(tmp, residual, norm_weight, eps, normed). x may
// be normed itself (it is read in full first). partial: f32 with at least M x H elements (f32 reduce only).
// scratch: moe_mlp's device scratch (ops/moe.h moe_scratch_bytes; unused on the CPU).
void tp_moe_add_rms_norm(const TpShard& tp, const Tensor& x, const ops::MoeWeights& moe,
                         const Tensor& residual, const Tensor& norm_weight, float eps, const Tensor& tmp,
                         const Tensor& partial, const Tensor& normed, const Tensor& scratch);

// The vocab-parallel LM head: ops::lm_head over the rank's vocab rows into its block of `gathered`, the
// all-gather, then every rank's block copied to its columns of logits.
//   gathered: f32 [tp, R, ceil(V / tp)] contiguous;  logits: f32 [R, V], row stride V.
void tp_lm_head(const TpShard& tp, const Tensor& x, const Tensor& rows, const Tensor& weight,
                const Tensor& gathered, const Tensor& logits);

// Elements of `gathered` tp_lm_head needs for R logit rows.
int64_t tp_gathered_elems(const TpShard& tp, int64_t R);

}  // namespace kiln
