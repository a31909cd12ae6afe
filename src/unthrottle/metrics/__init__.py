"""Prometheus as a source of evidence: PromQL built safely, and a configurable client."""
