"""Diagnostic: torch SDPA with enable_gqa=True vs expanded K/V vs a float64 reference, causal prefill (CUDA)."""

import torch
import torch.nn.functional as F

from kernels.reference import attention

for hq, hkv, t in ((14, 2, 80), (14, 2, 40), (14, 2, 200), (16, 8, 80), (32, 8, 512), (12, 2, 100)):
    g = torch.Generator(device="cuda").manual_seed(t)
    q, k, v = (torch.randn(1, h, t, 64, device="cuda", generator=g, dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    ref = attention(q.double(), k.double(), v.double(), 0.125)
    gqa = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125, enable_gqa=True).double()
    ke, ve = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))
    exp = F.scaled_dot_product_attention(q, ke, ve, is_causal=True, scale=0.125).double()
    e_gqa, e_exp = (((a - ref).norm() / ref.norm()).item() for a in (gqa, exp))
    print(f"hq {hq} hkv {hkv} T {t}: enable_gqa rel err {e_gqa:.2e}, expanded {e_exp:.2e}")
