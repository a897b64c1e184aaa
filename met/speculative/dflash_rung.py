"""The DFlash gamma resolver: the verify width K of a block drafter, from concurrency and, alone, acceptance.

A block drafter proposes gamma tokens in one forward whatever gamma is, so its cost is the
verify: gamma + 1 positions per sequence. Wide batches fill the device already and get a
small gamma by concurrency tier; a single stream is memory-bound, so its gamma follows the
first-draft accept rate (an EWMA seeded with its first sample) between a few levels, with a
hysteresis gap so a rate near a threshold does not flap. Gamma never grows with width.

The verify pools of a block drafter come from the same tiers (`verify_pools`): each width tier
holds the most gamma the rung can choose there, at most the drafter's block. The MTP drafter's
default pools (4 drafts at widths 1..=8, 1 at 9..=16) would cut the rung's 8, 12 and 16 to 4.
"""

from dataclasses import dataclass, field

from met.speculative.spec_capacity import MAX_POOL_WIDTH, VerifyPools

MAX_GAMMA = 16  # the largest block DFlash drafters are trained with


@dataclass(frozen=True, slots=True)
class DflashParams:
    """Gamma by concurrency tier, the single-stream levels and their thresholds."""

    # (largest width of the tier, gamma), widths ascending from 2; wider than the last: wide_gamma
    tiers: tuple[tuple[int, int], ...] = ((2, 8), (4, 6), (8, 4), (16, 2))
    wide_gamma: int = 1
    single_levels: tuple[int, ...] = (8, 12, 16)  # single-stream gammas, ascending
    up: tuple[float, ...] = (0.55, 0.75)  # p1 at which level i moves up to i + 1
    gap: float = 0.08  # level i + 1 moves down to i only below up[i] - gap
    alpha: float = 0.2  # EWMA weight of the newest observation

    def __post_init__(self) -> None:
        levels = self.single_levels
        if not levels or list(levels) != sorted(set(levels)) or levels[-1] > MAX_GAMMA:
            raise ValueError(f"single_levels must be non-empty, strictly ascending, <= {MAX_GAMMA}, got {levels}")
        widths = [w for w, _ in self.tiers]
        if widths != sorted(set(widths)) or (widths and widths[0] < 2):
            raise ValueError(f"tier widths must be strictly ascending from >= 2, got {widths}")
        # the smallest single-stream level heads the chain so gamma never grows with width
        gammas = [levels[0], *(g for _, g in self.tiers), self.wide_gamma]
        if any(b > a for a, b in zip(gammas, gammas[1:])) or not all(1 <= g <= MAX_GAMMA for g in gammas):
            raise ValueError(f"gammas must be in 1..={MAX_GAMMA} and not grow with width, got {gammas}")
        if len(self.up) != len(levels) - 1 or list(self.up) != sorted(set(self.up)):
            raise ValueError(f"up needs {len(levels) - 1} strictly ascending thresholds, got {self.up}")
        if self.up and not (0.0 < self.gap < self.up[0] and self.up[-1] <= 1.0):
            raise ValueError(f"need 0 < gap < up[0] and up[-1] <= 1, got gap={self.gap}, up={self.up}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")


def next_level(level: int, p1: float, params: DflashParams) -> int:
    """The single-stream level after seeing accept rate p1: up past up[i], down below up[i] - gap."""
    top = len(params.single_levels) - 1
    while level < top and p1 >= params.up[level]:
        level += 1
    while level > 0 and p1 < params.up[level - 1] - params.gap:
        level -= 1
    return level


def verify_pools(params: DflashParams, block: int) -> VerifyPools:
    """Pools holding the rung's gamma in each width tier (a single stream: its top level), capped at the block.

    With the default params and a 16-token block: 16 drafts at width 1, 8 at 2, 6 at 3..=4,
    4 at 5..=8, 2 at 9..=16 and 1 up to MAX_POOL_WIDTH; a 4-token block caps every tier at 4.
    """
    if not 1 <= block <= MAX_GAMMA:
        raise ValueError(f"a drafter's block must be in 1..={MAX_GAMMA}, got {block}")
    tiers = [(1, params.single_levels[-1]), *params.tiers]
    if tiers[-1][0] < MAX_POOL_WIDTH:
        tiers.append((MAX_POOL_WIDTH, params.wide_gamma))
    return VerifyPools(tuple((width, min(gamma, block)) for width, gamma in tiers))


def gamma_for_width(width: int, params: DflashParams) -> int:
    """Gamma of the concurrency tier holding `width` (>= 2)."""
    for max_width, gamma in params.tiers:
        if width <= max_width:
            return gamma
    return params.wide_gamma


@dataclass(slots=True)
class DflashRung:
    """Per scheduler context: the single-stream level and the first-draft accept EWMA it follows."""

    params: DflashParams = field(default_factory=DflashParams)
    level: int = -1  # index into single_levels; -1: start at the top until a stream is measured
    p1: float | None = None  # EWMA of the first-draft accept rate of single-stream steps

    def __post_init__(self) -> None:
        n = len(self.params.single_levels)
        if not -n <= self.level < n:
            raise ValueError(f"level must index single_levels ({n} levels), got {self.level}")
        self.level %= n

    def gamma_for(self, width: int, max_gamma: int = MAX_GAMMA) -> int:
        """Verify width K for a step of `width` sequences, at most max_gamma (the drafter's block)."""
        if width < 1 or max_gamma < 1:
            raise ValueError(f"width and max_gamma must be >= 1, got {width} and {max_gamma}")
        gamma = self.params.single_levels[self.level] if width == 1 else gamma_for_width(width, self.params)
        return min(gamma, max_gamma)

    def observe(self, width: int, sequences: int, first_accepted: int) -> None:
        """Fold in a step's first-draft acceptance; only single-stream steps (width 1) move the level."""
        if not 0 <= first_accepted <= sequences:
            raise ValueError(f"first_accepted={first_accepted} must be in 0..={sequences}")
        if width != 1 or sequences == 0:
            return
        sample = first_accepted / sequences
        self.p1 = sample if self.p1 is None else self.p1 + self.params.alpha * (sample - self.p1)
        self.level = next_level(self.level, self.p1, self.params)
