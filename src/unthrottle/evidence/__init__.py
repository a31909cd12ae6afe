"""Evidence: what the product folds from the series Prometheus returns, per container and
workload (aggregates, sliding windows, incremental reads). Fetching is :mod:`unthrottle.metrics`.
"""
