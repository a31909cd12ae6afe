"""Tools for developing unthrottle, shared by the demo, the benchmarks and the tests.

Nothing in the product imports them; they need no test framework.
"""
