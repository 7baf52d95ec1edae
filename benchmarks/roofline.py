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
}


def bytes_per_param(op: str, dtype: str) -> int:
    """Roofline bytes per parameter of ``op`` ("unscale", "adam", "adamw", "sgd")."""
    return BYTES_PER_PARAM[("adam" if op == "adamw" else op, dtype)]
