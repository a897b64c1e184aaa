"""The static MTP draft ladder: draft count by batch width, the floor the adaptive rung never goes below."""

# Widths up to this verify every draft the model's MTP heads propose; wider batches verify one,
# because at width > 8 the extra verify positions cost more than the extra accepted tokens repay.
LADDER_FULL_WIDTH = 8


def mtp_ladder_drafts(width: int, num_drafts: int) -> int:
    """Static MTP drafts per sequence: num_drafts for widths 1..=8, 1 for wider, never above num_drafts."""
    if width < 1:
        raise ValueError(f"width must be >= 1 (sequences in the step), got {width}")
    if num_drafts < 0:
        raise ValueError(f"num_drafts must be >= 0, got {num_drafts}")
    return num_drafts if width <= LADDER_FULL_WIDTH else min(1, num_drafts)
