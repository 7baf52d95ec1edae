"""Bytes each operation must move per parameter (../shared/DESIGN.md, "Bytes moved per
parameter per step"). Every implementation of an operation is credited with the same bytes,
so gbytes_per_s and ceiling_frac compare how close each gets to the same useful work."""

BYTES_PER_PARAM = {
    # unscale + inf check, in place: read and write each grad
    ("unscale", "bfloat16"): 4, ("unscale", "float16"): 4, ("unscale", "float32"): 8,
    # Adam/AdamW with half params and fp32 master + moments, unscale fused:
    #   read g 2, master 4, m 4, v 4; write master 4, m 4, v 4, p 2
    ("adam", "bfloat16"): 28, ("adam", "float16"): 28,
    # ... and with fp32 params (no master): read g 4, p 4, m 4, v 4; write p 4, m 4, v 4
    ("adam", "float32"): 28,
    # SGD with momentum, half params, fp32 master + buffer:
    #   read g 2, master 4, buf 4; write master 4, buf 4, p 2
    ("sgd", "bfloat16"): 20, ("sgd", "float16"): 20,
    # ... with fp32 params: read g 4, p 4, buf 4; write p 4, buf 4
    ("sgd", "float32"): 20,
    # Lion, half p/g: read g 2, master 4, m 4; write master 4, m 4, p 2 (fp32 params: g 4, p 4,
    # m 4 read; p 4, m 4 written)
    ("lion", "bfloat16"): 20, ("lion", "float16"): 20, ("lion", "float32"): 20,
    # Adagrad (sum) and RMSprop (square_avg; the suite's setting has no momentum, not centered): as
    # Lion, one fp32 state
    ("adagrad", "bfloat16"): 20, ("rmsprop", "bfloat16"): 20,
    # Adamax (exp_avg, exp_inf), RAdam and NAdam (exp_avg, exp_avg_sq): as Adam, two fp32 states
    # (NAdam's mu_product: 4 bytes per tensor, nothing per param)
    ("adamax", "bfloat16"): 28, ("radam", "bfloat16"): 28, ("nadam", "bfloat16"): 28,
    # Adadelta (square_avg, acc_delta) and Rprop (prev, step_size): two fp32 states, as Adam
    ("adadelta", "bfloat16"): 28, ("rprop", "bfloat16"): 28,
    # AdEMAMix: three fp32 states: read g 2, master 4, m1 4, m2 4, nu 4; write master 4, 12, p 2
    ("ademamix", "bfloat16"): 36,
    # Adam with gradient clipping: the global norm must be known before any update, so the grads
    # are read once more (half 2, fp32 4) before the fused update above
    ("adam_clip", "bfloat16"): 30, ("adam_clip", "float16"): 30, ("adam_clip", "float32"): 32,
    # the memory modes on bf16 params (master_weights="remainder", state_dtype=torch.bfloat16):
    #   remainder: read g 2, p 2, remainder 2, m 4, v 4; write p 2, remainder 2, m 4, v 4
    ("adam_remainder", "bfloat16"): 26,
    #   bf16 state: read g 2, master 4, m 2, v 2; write master 4, m 2, v 2, p 2
    ("adam_bf16_state", "bfloat16"): 20,
    #   both: read g 2, p 2, remainder 2, m 2, v 2; write p 2, remainder 2, m 2, v 2
    ("adam_remainder_bf16_state", "bfloat16"): 18,
    # 8-bit state (blockwise codes; the fp32 absmax of 2 states per 256 elements adds 1/16 B):
    #   read g 2, master 4, m 1, v 1; write master 4, m 1, v 1, p 2
    ("adam_8bit_state", "bfloat16"): 16,
    #   with the remainder: read g 2, p 2, remainder 2, m 1, v 1; write p 2, remainder 2, m 1, v 1
    ("adam_remainder_8bit_state", "bfloat16"): 14,
    #   24-bit masters (master_weights="remainder8"): read g 2, p 2, byte 1, m 1, v 1; write p 2,
    #   byte 1, m 1, v 1
    ("adam_24bit_8bit_state", "bfloat16"): 12,
    # 4-bit state (two codes per byte; the fp32 absmax of 2 states per 128 elements adds 1/16 B):
    #   with the remainder: read g 2, p 2, remainder 2, m 0.5, v 0.5; write p 2, remainder 2, m 0.5,
    #   v 0.5
    ("adam_remainder_4bit_state", "bfloat16"): 12,
    #   24-bit masters: read g 2, p 2, byte 1, m 0.5, v 0.5; write p 2, byte 1, m 0.5, v 0.5
    ("adam_24bit_4bit_state", "bfloat16"): 10,
    #   24-bit masters, fp32 state: read g 2, p 2, byte 1, m 4, v 4; write p 2, byte 1, m 4, v 4
    ("adam_24bit", "bfloat16"): 24,
    #   no masters (master_weights=False): read g 2, p 2, m 4, v 4; write p 2, m 4, v 4
    ("adam_no_masters", "bfloat16"): 22,
    #   torch's Adam on half params (moments in the params' dtype): read g 2, p 2, m 2, v 2; write
    #   p 2, m 2, v 2
    ("adam_half", "bfloat16"): 14,
    #   fp32 params without masters (bitsandbytes', torchao's 8-bit Adam): read g 4, p 4, m 1, v 1;
    #   write p 4, m 1, v 1
    ("adam_8bit_state", "float32"): 16,
    #   the same with 4-bit state (torchao's AdamW4bit): read g 4, p 4, m 0.5, v 0.5; write p 4,
    #   m 0.5, v 0.5
    ("adam_4bit_state", "float32"): 14,
}


def bytes_per_param(op: str, dtype: str) -> int:
    """Roofline bytes per parameter of ``op`` ("unscale", "adam", "adamw", "sgd", "adam_clip",
    and the memory modes "adam_remainder", "adam_bf16_state", "adam_remainder_bf16_state",
    "adam_8bit_state", "adam_remainder_8bit_state", "adam_24bit", "adam_24bit_8bit_state",
    "adam_remainder_4bit_state", "adam_24bit_4bit_state", "adam_4bit_state",
    "adam_no_masters", and torch's Adam on half params "adam_half")."""
    return BYTES_PER_PARAM[("adam" if op == "adamw" else op, dtype)]

