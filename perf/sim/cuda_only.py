"""The CUDA-only operators that ``sim`` has no kernel for, each with the reason it needs none.

Why a table: :mod:`perf.sim.cuda_ops` accounts for every operator of
``native_functions.yaml`` with a CUDA kernel and neither a CPU nor a composite one; those it
does not run are listed here, so the simulated device's error can say why and the inventory
test notices a torch release that adds one.
"""

from __future__ import annotations

_CUDNN = "reached only through cuDNN checks that require input.is_cuda()"
_MIOPEN = "reached only on ROCm (MIOpen) for CUDA inputs"
_EXPLICIT = "called only explicitly, for a CUDA-only feature"

#: every CUDA-only operator of this torch without a kernel here, and why sim does not need one
NOT_ON_SIM: dict[str, str] = {
    **dict.fromkeys(
        [
            "_use_cudnn_ctc_loss",
            "_use_cudnn_ctc_loss.Tensor",
            "_cudnn_ctc_loss",
            "_cudnn_ctc_loss.Tensor",
            "cudnn_affine_grid_generator",
            "cudnn_affine_grid_generator_backward",
            "cudnn_batch_norm.out",
            "cudnn_convolution",
            "cudnn_convolution.out",
            "cudnn_convolution_transpose",
            "cudnn_convolution_relu",
            "cudnn_convolution_add_relu",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_cudnn_attention_backward",
            "_cudnn_attention_forward",
            "_cudnn_attention_backward",
        ],
        _CUDNN,
    ),
    **dict.fromkeys(
        [
            "miopen_batch_norm",
            "miopen_batch_norm_backward",
            "miopen_convolution",
            "miopen_convolution_transpose",
            "miopen_depthwise_convolution",
            "miopen_convolution_relu",
            "miopen_convolution_add_relu",
            "miopen_rnn",
            "miopen_rnn_backward",
            "_use_miopen_ctc_loss",
            "_use_miopen_ctc_loss.Tensor",
            "miopen_ctc_loss",
            "miopen_ctc_loss.Tensor",
        ],
        _MIOPEN,
    ),
    **dict.fromkeys(
        [
            "_cslt_compress",
            "_cslt_sparse_mm",
            "_cslt_sparse_mm_search",
            "_sparse_semi_structured_tile",
            "_sparse_semi_structured_apply",
            "_sparse_semi_structured_apply_dense",
            "_sparse_semi_structured_linear",
            "_sparse_semi_structured_mm",
            "_sparse_semi_structured_addmm",
            "_to_sparse_semi_structured",
            "_mixed_dtypes_linear",
            "_convert_weight_to_int4pack",
            "_weight_int4pack_mm",
            "_scaled_grouped_mm",
            "_scaled_grouped_mm_v2",
            "_philox_key_split",
            "_philox_key_fold_in",
            "_philox_normal_",
            "_philox_uniform_",
            "_scaled_dot_product_flash_attention.quantized",
            "_flash_attention_forward.quantized",
            "_efficient_attention_forward",
            "_efficient_attention_backward",
            "_triton_scaled_dot_attention",
            "_triton_multi_head_attention",
            "_fill_mem_eff_dropout_mask_",
        ],
        _EXPLICIT,
    ),
    **dict.fromkeys(
        [
            "batch_norm_stats",
            "batch_norm_elemt",
            "batch_norm_elemt.out",
            "batch_norm_gather_stats",
            "batch_norm_gather_stats_with_counts",
            "batch_norm_backward_reduce",
            "batch_norm_backward_elemt",
        ],
        "SyncBatchNorm across processes (more than one simulated device is not modelled)",
    ),
    "_conv_depthwise2d": "convolution picks it only for CUDA inputs (sim: the generic one)",
    "_conv_depthwise2d.out": "convolution picks it only for CUDA inputs",
    "conv_depthwise3d": "convolution picks it only for CUDA inputs",
}
