"""KV tiers below the device pool: host memory and disk, written back on eviction, promoted on hit."""

from inference.tiers.tier_manager import TierHit, TierManager

__all__ = ["TierHit", "TierManager"]
