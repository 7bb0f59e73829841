"""Running episodes across machines (Ray)."""
