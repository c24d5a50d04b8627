"""The PyTorch attention references against a naive per-head loop (repeat K/V per query head)."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import attention, decode_attention


def naive(q, k, v, scale):
    # q [B, Hq, T, D]; k, v [B, Hkv, S, D]; causal with queries at the last T positions
    b, hq, t, d = q.shape
    g = hq // k.shape[1]
    k = k.repeat_interleave(g, dim=1).double()
    v = v.repeat_interleave(g, dim=1).double()
    s = k.shape[2]
    out = torch.empty(b, hq, t, d, dtype=torch.float64)
    for i in range(t):
        n = s - t + i + 1
        w = torch.softmax(q[:, :, i : i + 1].double() @ k[:, :, :n].transpose(-1, -2) * scale, -1)
        out[:, :, i] = (w @ v[:, :, :n])[:, :, 0]
    return out


@pytest.mark.parametrize("hq,hkv,t,s", [(4, 4, 1, 9), (8, 2, 5, 5), (6, 1, 3, 17), (14, 2, 7, 40)])
def test_attention_matches_naive(hq, hkv, t, s):
    g = torch.Generator().manual_seed(hq * 100 + s)
    q = torch.randn(2, hq, t, 16, generator=g)
    k = torch.randn(2, hkv, s, 16, generator=g)
    v = torch.randn(2, hkv, s, 16, generator=g)
    torch.testing.assert_close(attention(q, k, v, 0.25).double(), naive(q, k, v, 0.25), rtol=1e-5, atol=1e-5)


def test_decode_attention_respects_per_sequence_lengths():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 8, 32, generator=g)
    k = torch.randn(3, 2, 20, 32, generator=g)
    v = torch.randn(3, 2, 20, 32, generator=g)
    lengths = torch.tensor([1, 7, 20])
    out = decode_attention(q, k, v, lengths, 32**-0.5)
    for b, n in enumerate(lengths.tolist()):
        want = naive(q[b : b + 1, :, None], k[b : b + 1, :, :n], v[b : b + 1, :, :n], 32**-0.5)[:, :, 0]
        torch.testing.assert_close(out[b : b + 1].double(), want, rtol=1e-5, atol=1e-5)
    # garbage past a sequence's length must not leak in
    k2 = k.clone()
    k2[0, :, 1:] = 1e4
    torch.testing.assert_close(decode_attention(q, k2, v, lengths, 32**-0.5)[0], out[0])
