"""Metric records and sinks, batch dumps and the mismatch report."""
