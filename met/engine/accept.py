"""The acceptance rules of a verify step: greedy prefix match, lossless speculative sampling, seeded picks."""

import hashlib

import torch


def greedy_accept(drafts: list[int], target: list[int]) -> tuple[int, int]:
    """(accepted drafts, bonus token) when target[j] is the target's argmax after drafts[:j].

    Accept the longest prefix of drafts equal to the target's own greedy tokens; the bonus is the
    target's token after that prefix, so the output is exactly what plain greedy decoding emits.
    """
    a = 0
    while a < len(drafts) and drafts[a] == target[a]:
        a += 1
    return a, target[a]


def speculative_accept(drafts: list[int], q: torch.Tensor | None, p: torch.Tensor,
                       generator: torch.Generator | None) -> tuple[int, int]:
    """(accepted drafts, next token) by speculative sampling; the output is distributed as p.

    drafts: k proposed tokens; q: [k, V] the drafter's distributions (None: deterministic drafts,
    i.e. one-hot q); p: [k + 1, V] the target's distributions after each prefix.
    Rule per draft x: q(x) <= p(x): always accept; q(x) > p(x): accept with prob p(x)/q(x).
    On the first rejection sample from norm(max(0, p - q)); if all pass, sample the bonus from p[k].
    """
    for j, x in enumerate(drafts):
        px = p[j, x]
        qx = q[j, x] if q is not None else torch.ones((), dtype=p.dtype)
        u = torch.rand((), generator=generator, dtype=p.dtype, device=p.device)  # where the generator lives
        if u * qx <= px:  # accept with probability min(1, p/q)
            continue
        if q is not None:
            residual = (p[j] - q[j]).clamp(min=0)
        else:
            residual = p[j].clone()
            residual[x] = 0
        total = residual.sum()
        # p == q up to rounding leaves no residual mass; then p itself is the right distribution.
        dist = residual / total if total > 0 else p[j]
        return j, int(torch.multinomial(dist, 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def target_distribution(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0,
                        min_p: float = 0.0) -> torch.Tensor:
    """Probabilities [..., V] from logits under temperature, then top-k, min-p and nucleus (top-p) truncation.

    top_k: keep the k likeliest tokens (0: all); min_p: keep tokens of at least min_p x the likeliest's
    probability (0: all). Each keeps the likeliest token, so greedy picks are never changed by them.
    """
    x = logits.double()
    # From the row's maximum down, so a tiny temperature (5e-324) sends the rest to -inf, not the top to inf
    # (inf - inf is NaN in the softmax, and multinomial refuses the row).
    probs = torch.softmax((x - x.amax(-1, keepdim=True)) / temperature, dim=-1)
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, -1).values[..., -1:]  # ties at the k-th probability are all kept
        probs = torch.where(probs >= kth, probs, 0.0)
    if min_p > 0.0:
        probs = torch.where(probs >= min_p * probs.amax(-1, keepdim=True), probs, 0.0)
    if top_k or min_p > 0.0:
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p  # tokens before the mass reaches top_p, and the one crossing it
    sorted_p = sorted_p * keep
    out = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)


def position_noise(seed: int, position: int, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gumbel noise [vocab] for the token at `position` of a request seeded `seed`: the same wherever it is drawn.

    A seeded request picks every token as argmax(log p + noise) (`seeded_pick`), which is a sample
    of p; the noise depends on the seed and the token's position alone, so the drafter's pick,
    the verifier's and plain decoding's coincide, and the request's text is the same under every
    policy, depth and batch width. The noise is drawn on the logits' device by its own generator
    (no vocabulary-sized copy from the host per token), so a CPU and a GPU draw different noise.
    """
    key = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    gen = torch.Generator(device=device).manual_seed(int.from_bytes(key, "little") >> 1)  # drawn where it is used
    u = torch.rand(vocab, generator=gen, dtype=torch.float64, device=device)
    return -torch.log(-torch.log(u))  # u = 0 gives -inf: never picked


def seeded_pick(probs: torch.Tensor, noise: torch.Tensor) -> list[int]:
    """argmax(log p + noise) per row of probs [..., V] (Gumbel-max: distributed as p; p = 0 is never picked)."""
    return (probs.double().log() + noise).argmax(-1).reshape(-1).tolist()
