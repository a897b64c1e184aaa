"""An experiment, not met's code: `met` with attention computed in float32 in a bfloat16 model.

Runs met's command line (e.g. `bench policies --dtype bfloat16 ...`) with the model's scaled dot-product
attention given float32 queries, keys and values (the output cast back): whether greedy text under
speculation in bf16 changes because attention over a verify's k + 1 queries rounds otherwise than over one.
Its results beside this file: tokens_64/ (all 192 requests equal) and tokens_128/ (62 of 384 still differ,
from token 78 on: the projections' rounding also depends on how many rows a verify holds).

    python3 benchmarks/results/cpu-intel-xeon-1t/bf16_identity/attention_float32/run_with_float32_attention.py \
        bench policies --dtype bfloat16 --energy none --table T --prompts 16 --max-tokens 128 --repeats 1
"""

import sys

import torch.nn.functional as F

from met.model import transformer

sdpa = F.scaled_dot_product_attention


def sdpa_float32(q, k, v, attn_mask=None, **kw):
    return sdpa(q.float(), k.float(), v.float(), attn_mask=attn_mask, **kw).to(q.dtype)


transformer.F.scaled_dot_product_attention = sdpa_float32  # the module's F is torch's: patched for this run only

if __name__ == "__main__":
    from met.cli import main

    sys.argv[0] = "met"
    main()
