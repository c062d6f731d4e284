"""KV tiers below the device pool: host memory and disk, written back on eviction, promoted on hit."""

from inference.tiers.base import KVTier
from inference.tiers.tier_manager import TIER_NAMES, TIER_TYPES, TierHit, TierManager

__all__ = ["TIER_NAMES", "TIER_TYPES", "KVTier", "TierHit", "TierManager"]
