"""An in-memory snapshot of the price catalog, so pricing a request needs no database round trip
(and still works while the database is away and usage goes to the spool)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from billing.prices import FALLBACK_MODEL, PriceError, PriceVersion
from kvgate.errors import ApiError


class NoPriceError(ApiError, PriceError):
    """No catalog version covers this model at this time (and there is no '*' fallback)."""


class PriceBook:
    def __init__(self, versions: Iterable[PriceVersion]) -> None:
        by_model: dict[str, list[PriceVersion]] = defaultdict(list)
        for version in versions:
            by_model[version.model].append(version)
        self._by_model = {m: sorted(vs, key=lambda v: v.effective_from) for m, vs in by_model.items()}
        self._starts = {m: [v.effective_from for v in vs] for m, vs in self._by_model.items()}
        self._by_id = {v.id: v for vs in self._by_model.values() for v in vs}

    def __len__(self) -> int:
        return len(self._by_id)

    def by_id(self, version_id: int) -> PriceVersion:
        try:
            return self._by_id[version_id]
        except KeyError:
            raise NoPriceError(f"no price version {version_id}") from None

    def price_for(self, model: str, at: datetime) -> PriceVersion:
        """The version in force for `model` when a request started at `at`."""
        for name in (model, FALLBACK_MODEL):
            starts = self._starts.get(name)
            if not starts:
                continue
            index = bisect.bisect_right(starts, at) - 1
            if index >= 0:
                return self._by_model[name][index]
        raise NoPriceError(f"no price for model {model!r} at {at.isoformat()}")

    def versions(self) -> list[PriceVersion]:
        return sorted(self._by_id.values(), key=lambda v: (v.model, v.effective_from))
