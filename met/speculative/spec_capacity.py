"""Draft-count limits for speculative dispatch: each active sequence's verify-slot capacity and the serial verify arm.

A sequence's capacity is the least of its KV room (a step at depth k appends up to k drafts
plus the bonus token, so k <= max_len - current_len - 1) and the verify pool of its step's
width tier (the preallocated verify buffers hold so many drafts per sequence). The default
pools are sized for the MTP drafter; a block drafter's are sized by its rung
(dflash_rung.verify_pools), so that they hold every gamma the rung chooses, and the measured
planner's copies have the same (COPY_POOLS). The serial verify path runs only some depths (its
arms); it takes the largest arm not above the clamp.
"""

from collections.abc import Sequence
from dataclasses import dataclass

SERIAL_VERIFY_ARMS = frozenset({1, 2, 3, 4})  # depths the serial verify path has kernels for
WIDE_TIER = range(9, 17)  # widths 9..=16: one draft by default, two when the flag lifts it
MAX_POOL_WIDTH = 256  # the widest step a pool serves (met serve --max-batch is at most 256)


@dataclass(frozen=True, slots=True)
class VerifyPools:
    """Most drafts per sequence the verify pools hold, by width tier (by default, the MTP drafter's)."""

    # (largest width of the tier, drafts per sequence), widths ascending; wider than the last: no pool
    tiers: tuple[tuple[int, int], ...] = ((8, 4), (16, 1), (MAX_POOL_WIDTH, 1))
    lift_wide_tier: bool = False  # let widths 9..=16 verify lifted_drafts (the adaptive rung's second draft)
    lifted_drafts: int = 2

    def __post_init__(self) -> None:
        widths = [w for w, _ in self.tiers]
        if not widths or widths != sorted(set(widths)) or widths[0] < 1:
            raise ValueError(f"tier widths must be non-empty, strictly ascending, >= 1, got {widths}")
        if any(d < 0 for _, d in self.tiers) or self.lifted_drafts < 0:
            raise ValueError(f"draft limits must be >= 0, got {self.tiers} and lifted {self.lifted_drafts}")

    def max_drafts(self, width: int) -> int:
        """Drafts per sequence the pool of `width`'s tier holds; 0 beyond the widest tier."""
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        limit = next((d for w, d in self.tiers if width <= w), 0)
        if self.lift_wide_tier and width in WIDE_TIER:
            limit = max(limit, self.lifted_drafts)
        return limit


DEFAULT_POOLS = VerifyPools()

COPY_POOLS = VerifyPools(((1, 16), (2, 8), (4, 6), (8, 4), (16, 2), (MAX_POOL_WIDTH, 1)))
"""The measured planner's pools for copies (prompt lookup's, verified without a drafter pass): a copy is
verified as a block drafter's gamma is, so they are the DFlash rung's default pools for a 16-token block
(dflash_rung.verify_pools): 16 at width 1, 8 at 2, 6 at 3..=4, 4 at 5..=8, 2 at 9..=16, 1 beyond.
`met bench spec-cost` measures the verify of copies as deep as these hold."""


def kv_room(current_len: int, max_len: int) -> int:
    """Drafts a sequence of current_len tokens can verify and still fit the bonus within max_len."""
    return max(0, max_len - current_len - 1)


def slot_capacity(width: int, current_len: int, max_len: int, pools: VerifyPools = DEFAULT_POOLS) -> int:
    """Most drafts one sequence of a width-`width` step can verify: min(KV room, tier pool)."""
    return min(kv_room(current_len, max_len), pools.max_drafts(width))


def planned_kmax(width: int, table_kmax: int, num_drafts: int, pools: VerifyPools = DEFAULT_POOLS) -> int:
    """The deepest the measured planner drafts at `width`: the table's kmax, the drafter's depth and the width's
    verify pool, the least (the serve plans under it, and `met tables show` marks its plan under it too)."""
    return min(table_kmax, num_drafts, pools.max_drafts(width))


def serial_arm(drafts: int, arms: frozenset[int] = SERIAL_VERIFY_ARMS) -> int:
    """The largest supported serial verify arm <= drafts, or 0 (plain decode) if none fits."""
    return max((a for a in arms if 0 < a <= drafts), default=0)


def clamp_drafts_to_slot_capacity(
    requested: int,
    current_lens: Sequence[int],
    max_lens: Sequence[int],
    pools: VerifyPools = DEFAULT_POOLS,
    serial_arms: frozenset[int] | None = None,
) -> list[int]:
    """Per active sequence, `requested` drafts clamped to its slot capacity (and to a serial arm if given)."""
    if requested < 0:
        raise ValueError(f"requested drafts must be >= 0, got {requested}")
    if len(current_lens) != len(max_lens):
        raise ValueError(f"{len(current_lens)} current lengths but {len(max_lens)} max lengths")
    return clamp_drafts_to_rooms(requested, [kv_room(cur, mx) for cur, mx in zip(current_lens, max_lens)], pools,
                                 serial_arms)


def clamp_drafts_to_rooms(requested: int, rooms: Sequence[int], pools: VerifyPools = DEFAULT_POOLS,
                          serial_arms: frozenset[int] | None = None) -> list[int]:
    """clamp_drafts_to_slot_capacity with each sequence's kv_room known: `requested` drafts within the width
    tier's pool and each room (and a serial arm if given)."""
    if requested < 0:
        raise ValueError(f"requested drafts must be >= 0, got {requested}")
    if not rooms:
        return []
    limit = min(requested, pools.max_drafts(len(rooms)))  # one tier for the whole step
    clamped = [room if room < limit else limit for room in rooms]
    return clamped if serial_arms is None else [serial_arm(d, serial_arms) for d in clamped]
