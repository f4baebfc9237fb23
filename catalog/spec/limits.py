"""The supported sizes and ranges of a spec, and the rules for its privacy parameters.

Each is refused before any work, with the field and the range named."""

from __future__ import annotations

import math

# Privacy parameters.  Outside these, the noise scale (Δ/ε for Laplace, Δ/√(2ρ) for Gaussian) or its
# square overflows or underflows float64 once multiplied by a sensitivity and a contribution bound,
# or the guarantee is void.  The ρ range is the ε range mapped by ρ = ε²/2 (ε-DP ⇒ ε²/2-zCDP).
EPSILON_RANGE = (1e-6, 100.0)
RHO_RANGE = (EPSILON_RANGE[0] ** 2 / 2, EPSILON_RANGE[1] ** 2 / 2)  # (5e-13, 5000)
# δ: at most 1e-3 (≈ 1/n for a thousand people is already a weak guarantee) unless the spec says
# ``allow_large_delta: true``; below 1e-30 ln(1/δ) adds nothing a smaller ε would not.
DELTA_RANGE = (1e-30, 1e-3)
# Lifetime caps of a dataset (``dataset.budget``): the same lower ends, 100 releases at the maximum.
BUDGET_EPSILON_RANGE = (EPSILON_RANGE[0], 100 * EPSILON_RANGE[1])
BUDGET_RHO_RANGE = (RHO_RANGE[0], 100 * RHO_RANGE[1])
# Workload item weights (``weight``): the objective's Gram is Σ_items w · WᵀW, so weights a
# million apart already leave the lighter items at float64 round-off of the heavier ones' terms.
MAX_ITEM_WEIGHT = 1e6
MAX_ROWS_PER_PERSON = 1_000_000  # contribution bound: keeps sensitivity × bound / ε finite
MAX_DOMAIN_INTEGER = 2**53  # |min|, |max|, width of an integer range: exact in float64 encoding
MAX_CELLS_PER_ATTRIBUTE = 10_000_000
# Domain size.  ``plan`` works on implicit operators and never allocates the cell vector, but cell
# indices and sizes are int64 and products of sizes are formed in float64: 1e18 < 2⁶³ ≈ 9.2e18.
MAX_PLAN_CELLS = 10**18
# A workload of marginals only is planned from per-attribute sizes and measured subsets, never a
# cell index: any product is fine while float64 sums of products of sizes stay finite (< 1.8e308).
MAX_MARGINAL_PLAN_CELLS = 10**300
# Output tables one ``marginals`` item may expand to (all 1–3-way of 100 attributes: 166,750);
# their rows are bounded separately by MAX_RELEASE_QUERIES.
MAX_EXPANDED_MARGINALS = 1_000_000
# A run holds the cell vector (float64) and the released tables (one row per query) in memory.
MAX_RELEASE_CELLS = 200_000_000  # 1.6 GB of float64
MAX_RELEASE_QUERIES = 200_000_000  # rows of all output tables together
MAX_EXPANDED_MARGINAL_ROWS = MAX_RELEASE_QUERIES  # released cells of one ``marginals`` item
# YAML: a spec is a small hand-written file.  No anchors/aliases (an alias bomb expands
# exponentially), bounded size and nesting (PyYAML composes recursively).
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_DEPTH = 32


def check_privacy_dict(values: dict[str, float], *, field: str) -> dict[str, float]:
    keys = set(values)
    if keys not in ({"epsilon"}, {"rho"}, {"epsilon", "delta"}):
        raise ValueError(
            f"{field} keys {sorted(keys)} must be exactly one of {{epsilon}}, {{rho}}, {{epsilon, delta}}"
        )
    ranges = (
        {"epsilon": EPSILON_RANGE, "rho": RHO_RANGE}
        if field == "privacy"
        else {"epsilon": BUDGET_EPSILON_RANGE, "rho": BUDGET_RHO_RANGE}
    )
    for key, (low, high) in ranges.items():
        if key not in values:
            continue
        if not (math.isfinite(values[key]) and values[key] > 0):
            raise ValueError(f"{field}.{key} ({values[key]}) must be a finite number > 0")
        if not low <= values[key] <= high:
            raise ValueError(
                f"{field}.{key} ({values[key]:g}) is outside the supported range [{low:g}, {high:g}]: "
                "a smaller value makes the noise scale overflow, a larger one protects nothing"
            )
    if "delta" in values:
        if not 0 < values["delta"] < 1:
            raise ValueError(
                f"{field}.delta ({values['delta']}) must be in the open interval (0, 1)"
            )
        if values["delta"] < DELTA_RANGE[0]:
            raise ValueError(
                f"{field}.delta ({values['delta']:g}) is below the supported minimum "
                f"{DELTA_RANGE[0]:g} (use pure epsilon, or rho, for no delta at all)"
            )
    return values


def check_large_delta(values: dict[str, float], *, field: str, allowed: bool) -> None:
    """δ above ``DELTA_RANGE[1]`` only with ``allow_large_delta: true`` (recorded in the spec)."""
    delta = values.get("delta")
    if delta is not None and delta > DELTA_RANGE[1] and not allowed:
        raise ValueError(
            f"{field}.delta ({delta:g}) must be at most {DELTA_RANGE[1]:g}: a larger delta allows "
            "a total disclosure with that probability; set allow_large_delta: true in the spec "
            "to accept it (the manifest and report show it)"
        )
